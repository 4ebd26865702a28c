"""vLLM 0.28.0's partial-tail pins are holders in the scheduler oracle's pool census.

0.28.0's ``KVCacheManager.take_partial_tail_offloads`` (called by every
``Scheduler.schedule``) touches the Mamba "align" boundary block it hands a KV connector
and keeps it in ``_partial_tail_pins`` until the request is freed. The census counts these
references (``ManagersPart.pinned_blocks``); before, the explorer's seed-0 run on 0.28.0
took a pinned block for a leak (docs/explore.md, eighth stop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvconform.oracles.vllm.managers import ManagersPart

REPO = Path(__file__).resolve().parents[1]


def _managers() -> ManagersPart:
    # pinned_blocks reads only the manager it is given: no vLLM tree needed.
    return object.__new__(ManagersPart)


def test_pinned_blocks_lists_every_pin_once_per_pin() -> None:
    block = SimpleNamespace
    manager = SimpleNamespace(
        _partial_tail_pins={"a": [block(block_id=4)], "b": [block(block_id=7), block(block_id=4)]}
    )
    assert sorted(_managers().pinned_blocks(manager)) == [4, 4, 7]


def test_a_release_without_pins_pins_nothing() -> None:
    assert _managers().pinned_blocks(SimpleNamespace()) == ()
    assert _managers().pinned_blocks(SimpleNamespace(_partial_tail_pins={})) == ()


# DecodeBenchConnector loads 15 of a's 16 tokens; Mamba align in blocks of 32 beside full
# attention in blocks of 16 makes a partial hit the scheduler copies on write, whose
# boundary block 0.28.0 pins for the connector (the explorer's reproducer, shrunk).
PINNED = """\
name: partial-tail-pin
kind: scheduler
model:
  block_size: 16
  max_model_len: 48
  enable_caching: true
  num_blocks: 16
  groups:
    - full_attention
    - {type: mamba, block_size: 32}
scheduler:
  kv_connector: decode_bench
requests:
  a: {prompt_len: 16, max_tokens: 2}
"""


@pytest.mark.network
@pytest.mark.slow
def test_a_pinned_partial_tail_block_is_no_leak_on_0_28_0(tmp_path) -> None:
    scenario = tmp_path / "partial-tail-pin.yaml"
    scenario.write_text(PINNED, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(scenario), "--vllm-release", "0.28.0"]
        + ["--report-dir", str(tmp_path / "report")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    assert report["vllm"]["version"] == "0.28.0", output
    assert [s["verdict"] for s in report["scenarios"]] == ["passed"], output
    assert proc.returncode == 0, output
