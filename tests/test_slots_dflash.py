"""DFlash and DSpark drafters: where vLLM's own ``prepare_dflash_inputs`` writes their queries.

Those drafters do not map their positions with ``compute_slot_mappings``: their
input kernel reads the model runner's *gathered* block table (one row per batch
position, ``gather_block_tables``), skips a zero column from 0.28.0 on
(``PAD_SLOT_ID``: nothing written) and writes into any other id. These tests run
the installed vLLM's kernel (compiled on CUDA, Triton's interpreter elsewhere) and,
in a subprocess, the kernel of 0.28.0 and 0.27.1 on finding #5's scenario
(``docs/findings.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.harness.checks import judge
from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.root_causes import blame
from kvconform.model.floors import cdiv
from kvconform.model.observations import Observation
from kvconform.oracles.slots import record_slots
from kvconform.oracles.vllm.dflash_kernel import dflash_kernel_of
from kvconform.oracles.vllm.slot_kernel import slot_kernel_of

ROOT = Path(__file__).resolve().parents[1]

# DSpark's fill-in layout, k = 3: four queries past the scheduled range. The prefill of
# 29 tokens puts the fourth query at position 32, column 2.
FILL_IN = """
name: dspark-fill-in-slots
model: {max_model_len: 1024}
speculative: {method: dspark, num_speculative_tokens: 3, sample_from_anchor: false}
requests: {a: {prompt_len: 29}, b: {prompt_len: 40}}
steps:
  - {a: {prefill: 29}, b: {prefill: 40}}
  - {a: {spec: 3, accepted: 1}, b: {spec: 3}}
  - {a: finish, b: finish}
"""


def test_a_zero_column_is_skipped_and_any_other_id_is_written(vllm):
    # Request A: 25 computed + 4 scheduled, holds blocks 7 and 9 (what lookahead k = 3
    # reserves); its fourth query, position 32, falls in column 2.
    kernel = dflash_kernel_of(vllm)
    zero, stale = (7, 9, 0, 0, 0, 0, 0, 0), (7, 9, 42, 0, 0, 0, 0, 0)
    fresh, written = kernel.query_slots([zero, stale], [28, 28], 4, 16, 1024)
    assert fresh[:3] == written[:3] == [9 * 16 + 13, 9 * 16 + 14, 9 * 16 + 15]
    assert fresh[3] == kernel.pad_slot_id  # nothing written (0.28.0 on)
    assert written[3] == 42 * 16  # block 42, whoever holds it


def test_a_stale_gathered_column_sends_the_write_into_another_running_request(vllm):
    # Two model-runner steps through vLLM's own BlockTables: X (blocks 11..15) runs at
    # batch position 0; then A (blocks 7, 9) arrives at batch position 0 and X moves to
    # 1. The gather copies A's two held columns only: column 2 still holds X's 13.
    tables = slot_kernel_of(vllm).tables([16], 4, 64, [8])
    x, a = 0, 1  # persistent request-state rows
    tables.write_rows([((11, 12, 13, 14, 15),)], [x])
    tables.gather([x], 1)
    tables.write_rows([((7, 9),)], [a])
    (gathered,) = tables.gather([a, x], 2)
    assert gathered[0][:3] == [7, 9, 13] and gathered[1][:5] == [11, 12, 13, 14, 15]

    (slots,) = dflash_kernel_of(vllm).query_slots([gathered[0]], [28], 4, 16, 1024)
    assert slots[3] // 16 == 13  # position 32 of A written into X's live block 13


def _short_by_one(obs: Observation) -> Observation:
    """What the live allocator holds with lookahead k where the drafter needs k + 1."""
    ids = list(obs.block_ids or ())[: cdiv(obs.computed + obs.scheduled + obs.lookahead - 1, 16)]
    return obs._replace(block_ids=ids, live=len(ids))


def test_a_dspark_shortfall_is_judged_through_prepare_dflash_inputs(vllm, scenario_from):
    run = drive(scenario_from(FILL_IN), vllm)
    assert run.lookahead == 4  # the installed vLLM reserves k + 1 (fixed in 0.32.0)
    assert not record_slots(run, vllm).escapes
    run.slots = None
    run.observations = [_short_by_one(o) for o in run.observations]
    recording = record_slots(run, vllm)
    assert "prepare_dflash_inputs" in recording.mode
    assert {(e.party, e.role, e.kernel) for e in recording.escapes} == {
        ("live", "drafter", "prepare_dflash_inputs")
    }
    (failure,) = [f for f in judge(run, ("slots",)).failures if f.request == "a"]
    assert (failure.step, failure.detail["positions"], failure.detail["held"]) == (0, [32], 2)
    assert failure.detail["vllm_whose"] == "nothing (PAD_SLOT_ID)"
    assert "kernel writes nothing for it (PAD_SLOT_ID" in failure.message
    assert "possibly in another running request's block" in failure.message


def test_the_root_cause_names_the_dflash_kernel(vllm, scenario_from):
    from kvconform.harness.runner import run_scenario

    result = run_scenario(scenario_from(FILL_IN), vllm, ("slots",))
    assert result.trajectory is not None
    run = result.trajectory
    run.slots = None
    run.observations = [_short_by_one(o) for o in run.observations]
    record_slots(run, vllm)
    failure = next(f for f in judge(run, ("slots",)).failures)
    assert blame(result, failure).party == "dflash_slots"


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize(
    ("release", "scenario", "vllm_whose"),
    [
        ("0.28.0", "regressions/dspark-fill-in-lookahead.yaml", "nothing (PAD_SLOT_ID)"),
        # 0.27.1 has no VllmConfig.num_lookahead_tokens: a trajectory scenario reserves
        # with kvconform's own table there; vLLM's scheduler reserves k.
        ("0.27.1", "scheduler/sched-dspark-fill-in.yaml", "block 0, the null block"),
    ],
)
def test_finding_5_through_the_release_s_own_kernel(tmp_path, release, scenario, vllm_whose):
    # 0.25.0-0.31.0 reserve k for DSpark's fill-in layout; the kernel of 0.28.0 on skips
    # the zero column, the kernel before writes into the null block.
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", f"scenarios/{scenario}", "-k",
         "not async and not overlapped", "--vllm-release", release, "--checks", "slots",
         "--no-expectations", "--report-dir", str(report), "--progress", "off"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (entry,) = json.loads((report / "report.json").read_text())["scenarios"]
    details = [f["detail"] for f in entry["failures"] if f["check"] == "slots"]
    assert details and {d["kernel"] for d in details} == {"prepare_dflash_inputs"}
    assert {(d["role"], d["vllm_whose"]) for d in details} == {("drafter", vllm_whose)}
