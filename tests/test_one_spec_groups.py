"""KV-cache groups all of one spec: a model vLLM's planner never builds (it puts the layers
of one spec in one group, ``get_kv_cache_groups``), which 0.28.0's hybrid coordinator
asserts against ("requires at least two attention groups") and 0.29.0 on look up as one
group. On 0.28.0 the scenario does not apply (unsupported), not a crash to triage (the
explorer's seed-0 run on 0.28.0, docs/explore.md, eighth stop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ONE_SPEC = """\
name: one-spec-groups
kind: scheduler
model:
  block_size: 16
  max_model_len: 48
  num_blocks: 9
  groups: [full_attention, full_attention]
requests:
  a: {prompt_len: 1, max_tokens: 1}
"""


def _run(tmp_path: Path, *vllm_args: str) -> tuple[dict, str]:
    scenario = tmp_path / "one-spec-groups.yaml"
    scenario.write_text(ONE_SPEC, encoding="utf-8")
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(scenario), *vllm_args]
        + ["--report-dir", str(report)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    return json.loads((report / "report.json").read_text(encoding="utf-8")), output


@pytest.mark.network
@pytest.mark.slow
def test_groups_of_one_spec_are_unsupported_on_0_28_0(tmp_path: Path) -> None:
    report, output = _run(tmp_path, "--vllm-release", "0.28.0")
    assert [s["verdict"] for s in report["scenarios"]] == ["unsupported"], output


@pytest.mark.slow
def test_groups_of_one_spec_run_where_the_coordinator_takes_them(tmp_path: Path) -> None:
    report, output = _run(tmp_path)
    assert [s["verdict"] for s in report["scenarios"]] == ["passed"], output
