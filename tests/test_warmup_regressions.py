"""The upstream warmup bug, reproduced against real vLLM trees, and an injected one caught.

vLLM 0.25.0-0.27.1 sized warmup requests from the token range alone: the fix
("Reserve spec-decode lookahead blocks in V2 warmup") shipped in 0.28.0. Each
test runs ``kvconform run scenarios/warmup`` in a fresh process against another
vLLM Python tree: a PyPI release (``--vllm-release``, downloaded once and cached
outside the repository) or a copy of the installed tree with a bug injected
(``--vllm-src``).
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
CORPUS = REPO / "scenarios" / "warmup"


def run_corpus(
    report_dir: Path, *vllm_args: str, corpus: Path = CORPUS
) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(corpus), "--report-dir", str(report_dir),
         *vllm_args],
        capture_output=True, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    output = done.stdout + done.stderr
    report = json.loads((report_dir / "report.json").read_text()) if done.returncode < 4 else {}
    return done.returncode, report, output


def warmup_shortfalls(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """Floor failures of the recorded warmup party."""
    return [
        f
        for f in scenario["failures"]
        if f["check"] == "floor" and f["warmup"] is not None and f["warmup"] < f["floor"]
    ]


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("release", ["0.25.0", "0.27.1"])
def test_releases_before_the_fix_fall_short_in_warmup(release, tmp_path):
    status, report, output = run_corpus(tmp_path, "--vllm-release", release)
    assert status == 1, output
    assert report["vllm"]["version"] == release
    for scenario in report["scenarios"]:
        if scenario["verdict"] == "xfailed":
            continue
        if scenario["lookahead"]:
            # Every scenario whose drafter writes past the scheduled range finds
            # the warmup holding too few blocks for it.
            assert scenario["verdict"] == "failed", scenario["id"]
            assert warmup_shortfalls(scenario), scenario["id"]
            assert scenario["parties"] == ["live", "warmup"]  # no predictor before 0.28
        elif scenario["id"].startswith(("warmup-ngram", "warmup-no-speculation")):
            # Without lookahead the old warmup held enough: the controls pass.
            assert scenario["verdict"] == "passed", scenario["id"]


@pytest.mark.network
@pytest.mark.slow
def test_the_fixed_release_conforms(tmp_path):
    status, report, output = run_corpus(tmp_path, "--vllm-release", "0.28.0")
    assert status == 0, output
    verdicts = {s["id"]: s["verdict"] for s in report["scenarios"]}
    assert set(verdicts.values()) == {"passed", "xfailed"}
    assert any(s["lookahead"] for s in report["scenarios"] if s["verdict"] == "passed")


INJECTED_FROM = "    num_lookahead_tokens = model_runner.vllm_config.num_lookahead_tokens\n"
INJECTED_TO = "    num_lookahead_tokens = 0  # injected by kvconform's test: no lookahead\n"


@pytest.mark.slow
def test_a_warmup_that_reserves_without_lookahead_turns_the_suite_red(tmp_path, pristine_tree_033):
    pristine_tree = pristine_tree_033  # INJECTED_FROM is 0.33.0's line
    # Exactly the line of _warmup_block_counter that binds the warmup's lookahead.
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/worker/gpu/warmup.py", INJECTED_FROM, INJECTED_TO
    )

    status, report, output = run_corpus(tmp_path / "report", "--vllm-src", str(tree))
    assert status == 1, output
    assert report["vllm"]["path"].startswith(str(tree))
    failed = [s for s in report["scenarios"] if s["verdict"] == "failed"]
    assert failed and all(s["lookahead"] for s in failed)
    for scenario in failed:
        shortfalls = warmup_shortfalls(scenario)
        assert shortfalls, scenario["id"]
        # Only the warmup changed: the live allocator and vLLM's predictor still hold enough.
        assert all(f["live"] >= f["floor"] and f["predicted"] >= f["floor"] for f in shortfalls)
    lookahead_ids = {s["id"] for s in report["scenarios"] if s["lookahead"]}
    assert lookahead_ids == {s["id"] for s in failed}


# The mixed warmup's block counter, made to restart at 1 for every request and group.
SHARED_FROM = "        next_block_id += num_blocks\n"
SHARED_TO = "        pass  # injected by kvconform's test: every allocation starts at block 1\n"


@pytest.mark.slow
def test_a_warmup_that_hands_one_block_to_two_requests_turns_the_suite_red(tmp_path, pristine_tree):
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/worker/gpu/warmup.py", SHARED_FROM, SHARED_TO
    )
    status, report, output = run_corpus(
        tmp_path / "report", "--vllm-src", str(tree), corpus=CORPUS / "warmup-no-speculation.yaml"
    )
    assert status == 1, output
    for scenario in report["scenarios"]:
        # Every count is right; only the ids repeat, which only the sanity check sees.
        assert {f["check"] for f in scenario["failures"]} == {"sanity"}, scenario["id"]
        assert any(
            "hands out block 1, which request _v2_mixed_warmup_decode_ holds" in f["message"]
            for f in scenario["failures"]
        ), scenario["id"]


# vLLM 0.34's warmup_kernels, made to hand out blocks its extensible KV cache never commits.
UNCOMMITTED_FROM = (
    "        ensure_kv_cache_blocks(model_runner, 1 + num_reqs * max_blocks_per_req)\n"
)
UNCOMMITTED_TO = (
    "        pass  # injected by kvconform's test: no commit before the blocks go out\n"
)


@pytest.mark.network
@pytest.mark.slow
def test_a_034_warmup_that_does_not_commit_its_blocks_turns_the_suite_red(tmp_path):
    from kvconform.harness.releases import release_tree

    scenario = CORPUS / "warmup-no-speculation.yaml"
    status, report, output = run_corpus(
        tmp_path / "release", "--vllm-release", "0.34.0", corpus=scenario
    )
    assert status == 0, output  # the release commits what it hands out
    tree = tree_with_replacement(
        release_tree("0.34.0"), tmp_path / "tree", "v1/worker/gpu/warmup.py",
        UNCOMMITTED_FROM, UNCOMMITTED_TO,
    )  # fmt: skip
    status, report, output = run_corpus(
        tmp_path / "report", "--vllm-src", str(tree), corpus=scenario
    )
    assert status == 1, output
    for result in report["scenarios"]:
        # The counts are the release's; only the commit is gone, which only sanity sees.
        assert {f["check"] for f in result["failures"]} == {"sanity"}, result["id"]
        assert any(
            "which its extensible KV cache has not committed" in f["message"]
            for f in result["failures"]
        ), result["id"]
