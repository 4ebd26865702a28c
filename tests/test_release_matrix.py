"""A fast slice of the release matrix against real PyPI releases (docs/releases.md).

``make release-matrix`` runs the whole corpus against every release; these tests
run a few scenarios of each kind against the minimum supported release (0.28.0)
and 0.32.0, the release whose platform answers differed from the others', so a
release that stops running clean on CPU cannot go unseen. Each release's Python
tree is downloaded once into kvconform's cache (``network``); each run is a fresh
process (one vLLM tree per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_copy import tree_with_replacement

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
# A few of each kind: trajectory (one of them a known divergence of 0.28-0.31), warmup,
# scheduler (n-gram: some settings are not offered by 0.28.0 or 0.32.0).
SLICE = (
    "full-attention-lookahead or dspark-fill-in-lookahead or eagle-k5-bs16 "
    "or sched-no-speculation or sched-ngram"
)

pytestmark = [pytest.mark.network, pytest.mark.slow]


def kvconform(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvconform", *map(str, args)],
        cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip


def scenarios_of(report_dir: Path) -> dict[str, dict[str, Any]]:
    report = json.loads((report_dir / "report.json").read_text())
    return {entry["id"]: entry for entry in report["scenarios"]}


def test_the_slice_runs_clean_on_the_minimum_release_and_0_32_0(tmp_path):
    done = kvconform(
        "matrix", "--releases", "0.28.0,0.32.0", "--report-dir", tmp_path, "-k", SLICE, SCENARIOS,
        cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    matrix = json.loads((tmp_path / "matrix.json").read_text())
    rows = {row["release"]: row for row in matrix["releases"]}
    assert set(rows) == {"0.28.0", "0.32.0"}
    for release, row in rows.items():
        assert row["exit_status"] == 0, (release, row["notes"])
        assert row["counts"]["error"] == 0 and row["counts"]["failed"] == 0, row["notes"]
        assert {"trajectory", "warmup", "scheduler"} <= {
            entry["kind"] for entry in scenarios_of(tmp_path / release).values()
        }

    # The known divergence of 0.28-0.31 is excused there and gone in 0.32.0.
    assert rows["0.28.0"]["verdicts"]["dspark-fill-in-lookahead"] == "xfailed"
    assert rows["0.32.0"]["verdicts"]["dspark-fill-in-lookahead"] == "passed"
    ((older, newer, changed),) = [(c["from"], c["to"], c["scenarios"]) for c in matrix["changes"]]
    assert (older, newer) == ("0.28.0", "0.32.0")
    assert {"id": "dspark-fill-in-lookahead", "from": "xfailed", "to": "passed"} in changed
    assert {"id": "sched-ngram[ngram-sync]", "from": "unsupported", "to": "passed"} in changed

    # What a release does not offer is unsupported, with vLLM's reason, and leaves the
    # status alone: V2 runs no n-gram in 0.28.0; 0.32.0 schedules n-gram only synchronously.
    old = scenarios_of(tmp_path / "0.28.0")
    assert old["sched-ngram[ngram-sync]"]["verdict"] == "unsupported"
    assert "Model Runner V2 does not yet support" in old["sched-ngram[ngram-sync]"]["error"]
    new = scenarios_of(tmp_path / "0.32.0")
    assert new["sched-ngram[ngram-sync]"]["verdict"] == "passed"
    assert new["sched-ngram[ngram-async]"]["verdict"] == "unsupported"
    assert rows["0.32.0"]["counts"]["unsupported"] == 2  # ngram-async, ngram-overlapped

    # 0.32.0's staged block-table writes ran on the host, under Triton's interpreter:
    # before kvconform stood in is_pin_memory_available they pinned memory and raised.
    entry = new["full-attention-lookahead-crosses-block-boundary[eagle-bs16]"]
    assert entry["slots"]["skipped"] is None and entry["slots"]["rows"] > 0
    assert "0.32.0's BlockTables.compute_slot_mappings" in entry["slots"]["mode"]
    assert "interpreter" in entry["slots"]["mode"]


def test_the_default_checks_see_triton_as_every_check_does(tmp_path):
    # vLLM 0.28-0.32 refuse Model Runner V2 when vllm.triton_utils finds no Triton, and
    # what it finds depends on kvconform's process set-up: it must not depend on --checks.
    done = kvconform(
        "run", SCENARIOS / "scheduler" / "sched-dflash-dspark.yaml", "-k", "dflash-sync",
        "--vllm-release", "0.32.0", "--report-dir", tmp_path, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = scenarios_of(tmp_path).values()
    assert entry["verdict"] == "passed"
    assert any("model runner V2" in note for note in entry["notes"]), entry["notes"]


FILL_IN_BRANCH = "        if speculative_config.use_dflash():\n"
FILL_IN_FIXED = (
    "        if speculative_config.use_dflash() or (speculative_config.use_dspark() and not "
    "getattr(speculative_config.draft_model_config.hf_config, 'sample_from_anchor', True)):\n"
)


def test_a_listed_divergence_that_stops_diverging_in_its_range_is_an_xpass(tmp_path):
    # 0.32.0's fill-in branch of VllmConfig.num_lookahead_tokens, put into 0.28.0's tree:
    # the entry for >=0.28.0,<0.32.0 still applies, and its scenario conforms.
    from kvconform.harness.releases import release_tree

    tree = tree_with_replacement(
        release_tree("0.28.0"), tmp_path / "tree", "config/vllm.py", FILL_IN_BRANCH, FILL_IN_FIXED
    )
    report_dir = tmp_path / "report"
    done = kvconform(
        "run", SCENARIOS, "-k", "dspark-fill-in-lookahead", "--checks", "all",
        "--vllm-src", tree, "--report-dir", report_dir, cwd=tmp_path,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    (entry,) = scenarios_of(report_dir).values()
    assert entry["verdict"] == "xpassed", entry
    assert (
        "XPASSED: 1 known divergence conforms now (dspark-fill-in-lookahead); its expectations "
        "entry is stale for this vLLM"
    ) in output


def test_every_method_the_minimum_release_declares_has_an_entry(tmp_path):
    # 0.28.0-0.32.0 declare medusa and mlp_speculator (gone from 0.33.0): without their
    # registry entries `methods` exits 1 on them, and a warmup drawing mlp_speculator fails
    # lookahead for "no entry" (the explorer's seed 0 on 0.28.0, docs/explore.md).
    done = kvconform("methods", "--vllm-release", "0.28.0", cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "NO ENTRY" not in output, output
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    for name in ("medusa", "mlp_speculator"):
        assert rows[name][3] == "ok", output  # vLLM's lookahead and kvconform's agree
    scenario = tmp_path / "warmup-mlp-speculator.yaml"
    scenario.write_text(
        "name: warmup-mlp-speculator\nkind: warmup\n"
        "model: {block_size: 16, max_model_len: 48, num_blocks: 2, groups: [full_attention]}\n"
        "speculative: {method: mlp_speculator, num_speculative_tokens: 1}\n"
        "warmup: {max_num_seqs: 1, max_num_batched_tokens: 3, mixed_num_tokens: 1}\n",
        encoding="utf-8",
    )
    done = kvconform(
        "run", scenario, "--vllm-release", "0.28.0", "--checks", "all",
        "--report-dir", tmp_path / "report", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = scenarios_of(tmp_path / "report").values()
    assert entry["verdict"] == "passed", entry
