"""The reproducers in docs/reproducers/ reproduce, and `kvconform export --vllm-test` writes them.

Each file there is what ``kvconform export SCENARIO --vllm-test`` wrote for one finding of
docs/findings.md: a pytest module that imports vLLM only and fails while the finding holds.
This test runs each one with the installed vLLM in a fresh process (as vLLM's own suite
would run it, kvconform nowhere on the path) and asserts it fails with the finding's
numbers; and it exports each scenario again and asserts the checked-in file is what the
exporter writes today, so the two cannot drift apart.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.errors import UsageError
from kvconform.fronts.cli import main

REPO = Path(__file__).resolve().parent.parent
REPRODUCERS = REPO / "docs" / "reproducers"
# file -> (the scenario it was exported from, what its failure must say)
FINDINGS = {
    "test_sink_full_attention_manager.py": (
        "sink-full-attention-manager-builds",
        ["TypeError", "needs_kv_cache_zeroing"],
    ),
    "test_dcp_reserved_block_count.py": (
        "decode-context-parallel-block-span",
        [
            "step 0, request b, group 0 (FullAttentionSpec), 0 + 300 tokens, lookahead 3: "
            "KVCacheManager holds 10, _reserved_block_count reserves 19"
        ],
    ),
}


def test_every_reproducer_is_listed_and_linked_from_findings():
    assert sorted(p.name for p in REPRODUCERS.glob("test_*.py")) == sorted(FINDINGS)
    findings = (REPO / "docs" / "findings.md").read_text()
    for name in FINDINGS:
        assert f"reproducers/{name}" in findings


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_the_reproducer_imports_vllm_only_and_fails_while_the_finding_holds(vllm, name, tmp_path):
    source = (REPRODUCERS / name).read_text()
    code = source.split('"""', 2)[2]  # after the docstring, which names the command
    assert "kvconform" not in code
    # Alone in a folder of its own, no kvconform on the path, no project conftest.
    (tmp_path / name).write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # 1: the test failed (not a collection error, 2 or 4)
    assert "1 failed" in out, out
    for words in FINDINGS[name][1]:
        assert words in out, out


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_the_checked_in_reproducer_is_what_export_writes(vllm, name, tmp_path, capsys):
    scenario_id, _ = FINDINGS[name]
    out = tmp_path / name
    assert main(["export", scenario_id, "--vllm-test", "--out", str(out)]) == 0
    assert out.read_text() == (REPRODUCERS / name).read_text(), (
        f"regenerate it: kvconform export {scenario_id} --vllm-test --out docs/reproducers/{name}"
    )


def test_export_refuses_what_it_cannot_reproduce(vllm, write_scenario, capsys):
    conforming = write_scenario(
        """
        name: fine
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}, {a: finish}]
        """
    )
    with pytest.raises(UsageError, match="nothing to export"):
        main_raising(["export", f"{conforming}::fine", "--vllm-test"])
    with pytest.raises(UsageError, match="takes trajectory scenarios"):
        main_raising(["export", "warmup-encoder-decoder-mixed", "--vllm-test"])


def main_raising(argv: list[str]) -> None:
    """The command's handler without main()'s translation of errors into statuses."""
    from kvconform.fronts.cli import build_parser

    args = build_parser().parse_args(argv)
    args.handler(args)
