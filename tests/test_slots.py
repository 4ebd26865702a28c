"""The slots party and check: vLLM's own slot-mapping kernel on the blocks each party held.

In-process tests run the installed vLLM's kernel (compiled on CUDA, Triton's
interpreter elsewhere; ``tests/conftest.py`` prepares the process). The test
that claims the check catches a shortfall injects it into a copy of vLLM's
Python tree and runs the command line on it in a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_copy import tree_with_replacement

from kvconform.errors import VllmUnavailable
from kvconform.fronts.cli import main
from kvconform.harness import runner
from kvconform.harness.checks import judge, parse_checks
from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.model.floors import cdiv
from kvconform.model.observations import Observation, SlotEscape
from kvconform.model.results import ErrorKind, Verdict
from kvconform.oracles import slots as slots_oracle
from kvconform.oracles.slots import positions_written, record_slots
from kvconform.oracles.vllm.slot_kernel import SlotKernel, slot_kernel_of

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

# Two requests under EAGLE (lookahead 4): chunked prefill, rejected and accepted drafts.
EAGLE = """
name: eagle-slots
model: {max_model_len: 1024}
speculative: {method: eagle, num_speculative_tokens: 4}
requests: {a: {prompt_len: 100}, b: {prompt_len: 40}}
steps:
  - {a: {prefill: 64}, b: {prefill: 40}}
  - {a: {prefill: 36}, b: {spec: 4, accepted: 1}}
  - {repeat: 3, step: {a: {spec: 4, accepted: 3}, b: {spec: 4}}}
  - {a: finish, b: finish}
"""


def _short_of_the_lookahead(obs: Observation) -> Observation:
    """What a party that reserves the token range only (no lookahead) holds."""
    ids = list(obs.block_ids or ())[: cdiv(obs.computed + obs.scheduled, 16)]
    return obs._replace(warmup_block_ids=ids, warmup=len(ids))


def test_the_kernel_reads_past_the_held_columns_unbounded(vllm):
    # docs/slots.md's measurement, through kvconform's compatibility layer: the
    # request owns blocks 100 and 101; positions 28..35 cross into column 2.
    kernel = slot_kernel_of(vllm)
    tables = kernel.tables([16], 2, 16, [4])
    tables.write_rows([((100, 101, 999, 998),), ((100, 101, 0, 0),)])
    slots = tables.map([0, 1], [0, 8, 16], list(range(28, 36)) * 2)
    assert (slots[0] // 16).tolist() == [101] * 4 + [999] * 4 + [101] * 4 + [0] * 4
    assert (slots[0] % 16).tolist() == [12, 13, 14, 15, 0, 1, 2, 3] * 2
    with pytest.raises(ValueError, match="exceed"):
        tables.map([0, 1], [0, 8, 17], list(range(17)))  # more than the table's 16 tokens


@pytest.mark.cuda
def test_on_cuda_the_compiled_kernel_maps_the_same_slots(vllm, scenario_from):
    # The nightly GPU job: Triton compiles vLLM's kernel for the device; the
    # measurement above and a shortfall must come out the same as interpreted.
    kernel = slot_kernel_of(vllm)
    assert not kernel.interpreter
    tables = kernel.tables([16], 2, 16, [4])
    tables.write_rows([((100, 101, 999, 998),), ((100, 101, 0, 0),)])
    slots = tables.map([0, 1], [0, 8, 16], list(range(28, 36)) * 2)
    assert (slots[0] // 16).tolist() == [101] * 4 + [999] * 4 + [101] * 4 + [0] * 4
    result = run_scenario(scenario_from(EAGLE), vllm, ("slots",))
    assert result.verdict is Verdict.PASSED and not result.skipped_checks, result.headline()
    assert any("compiled by Triton on" in note for note in result.trajectory.notes)


def test_a_conforming_trajectory_lands_every_position_in_its_own_blocks(vllm, scenario_from):
    scenario = scenario_from(
        EAGLE.replace(
            "model: {max_model_len: 1024}",
            "model:\n  max_model_len: 1024\n  groups: [full_attention, "
            "{type: sliding_window, sliding_window: 32}, mamba]",
        )
    )
    result = run_scenario(scenario, vllm, ("floor", "sanity", "slots"))
    assert result.verdict is Verdict.PASSED and not result.skipped_checks, result.headline()
    slots = result.trajectory.slots
    assert slots.escapes == [] and slots.kernel_calls == 1
    assert slots.groups_mapped == (0, 1) and list(slots.groups_skipped) == [2]
    assert "not indexed by token position" in slots.groups_skipped[2]
    # Per mapped group, every position some step writes, each once per holding.
    assert slots.positions > 2 * (100 + 40)
    assert any(note.startswith("slots: vLLM ") for note in result.trajectory.notes)


def test_a_prefix_cache_hit_is_not_written_so_its_null_window_columns_are_fine(vllm, scenario_from):
    # b's whole prompt is cached: the hit is computed, not written, and the
    # sliding window has already put the null block where it fell out.
    scenario = scenario_from(
        """
        model:
          enable_caching: true
          num_blocks: 64
          groups: [full_attention, {type: sliding_window, sliding_window: 32}]
        speculative: {method: eagle, num_speculative_tokens: 2}
        requests: {a: {prompt_len: 64}, b: {prompt_len: 64, prefix_from: a, prefix_len: 64}}
        steps:
          - {a: {prefill: 64}}
          - {a: {spec: 2, accepted: 1}}
          - {b: {prefill: 64}, a: {spec: 2}}
        """
    )
    result = run_scenario(scenario, vllm, ("slots",))
    assert result.verdict is Verdict.PASSED, result.headline()
    (b,) = [o for o in result.trajectory.observations if o.request == "b" and o.group == 1]
    assert b.cached == 48 and b.block_ids[0] == result.trajectory.null_block
    assert list(positions_written(b, 1024)[0]) == list(range(48, 64))


def test_holdings_short_of_the_lookahead_send_the_drafter_to_the_null_block(vllm, scenario_from):
    run = drive(scenario_from(EAGLE), vllm)
    run.observations = [_short_of_the_lookahead(o) for o in run.observations]
    recording = record_slots(run, vllm)
    failures = judge(run, ("slots",)).failures
    assert recording.kernel_calls == 2  # the poisoned rows, then the escapes as vLLM fills rows
    assert {e.party for e in recording.escapes} == {"warmup"}, "the live allocator conforms"
    assert {e.role for e in recording.escapes} == {"drafter"}
    assert {e.block for e in recording.escapes} == {recording.poison}
    assert {e.fresh_block for e in recording.escapes} == {run.null_block}
    first = failures[0]
    # Step 0: a prefills 64 tokens into 4 blocks; the drafter writes 64..67.
    assert (first.step, first.request, first.detail["positions"]) == (0, "a", [64, 65, 66, 67])
    assert (
        first.detail["columns"] == [4] and first.detail["vllm_whose"] == "block 0, the null block"
    )
    assert "drafter positions 64..67 (column 4) fall outside the 4 blocks the recorded warmup" in (
        first.message
    )
    assert first.message.endswith("they go to block 0, the null block")


def test_a_held_null_column_is_no_block_of_the_request(vllm, scenario_from):
    # A table whose first column is the null block (as sliding windows leave
    # dropped blocks) while the target still writes there: named, not passed.
    run = drive(scenario_from(EAGLE), vllm)
    run.observations = [
        o._replace(block_ids=[run.null_block, *o.block_ids[1:]])
        if (o.step, o.request) == (0, "a")
        else o
        for o in run.observations
    ]
    record_slots(run, vllm)
    (failure,) = judge(run, ("slots",)).failures
    assert (failure.step, failure.request, failure.detail["role"]) == (0, "a", "target")
    assert failure.detail["positions"] == list(range(16))
    assert failure.detail["whose"] == "block 0, the null block"


def test_a_block_of_another_request_is_named(vllm, scenario_from):
    # The guard column keeps the kernel inside each row, so only a recorded
    # table can hold another request's block; the check still names the owner.
    run = drive(scenario_from(EAGLE), vllm)
    record_slots(run, vllm)
    index, obs = next((i, o) for i, o in enumerate(run.observations) if o.request == "a")
    theirs = next(o for o in run.observations if o.step == obs.step and o.request == "b")
    stolen = theirs.block_ids[0]
    run.slots.escapes.append(
        SlotEscape(index, "live", "drafter", 64, 4, stolen * 16, stolen, None, None)
    )
    (failure,) = judge(run, ("slots",)).failures
    assert failure.detail["whose"] == f"block {stolen} of request b"
    assert "drafter position 64 (column 4) falls outside the 5 blocks" in failure.message


def test_drafter_positions_are_clamped_as_the_speculators_clamp_them():
    obs = Observation(0, None, "a", "spec 3", 0, 1018, 4, 4, 64, 64, None, None)
    target, drafter = positions_written(obs, 1024)
    assert list(target) == [1018, 1019, 1020, 1021]
    assert list(drafter) == [1022, 1023, 1023, 1023]


def test_a_check_that_cannot_run_is_skipped_never_passed(vllm, scenario_from, monkeypatch):
    scenario = scenario_from(EAGLE)

    def no_kernel(vllm):
        raise VllmUnavailable(vllm.version, "a Triton kernel to run", "Triton is not installed")

    monkeypatch.setattr(slots_oracle, "slot_kernel_of", no_kernel)
    with_others = run_scenario(scenario, vllm, ("floor", "slots"))
    assert with_others.verdict is Verdict.PASSED
    assert "Triton is not installed" in with_others.skipped_checks["slots"]
    alone = run_scenario(scenario, vllm, ("slots",))
    assert alone.verdict is Verdict.UNSUPPORTED and alone.error_kind is ErrorKind.UNSUPPORTED
    assert alone.error.startswith("no selected check could run: slots: vLLM ")
    assert exit_status([alone]) == 3  # nothing else ran: this vLLM was not exercised
    assert exit_status([alone, with_others]) == 0


def test_a_kernel_that_cannot_set_up_skips_its_check_and_the_others_decide(
    vllm, scenario_from, monkeypatch
):
    # As 0.32.0's staged writes did before kvconform stood in its pinned-memory query.
    scenario = scenario_from(EAGLE)

    def no_tables(self, *args, **kwargs):
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(SlotKernel, "tables", no_tables)
    result = run_scenario(scenario, vllm, ("floor", "slots"))
    assert result.verdict is Verdict.PASSED, result.headline()
    assert (
        "BlockTables cannot be built in this process (RuntimeError: Found no NVIDIA"
        in (result.skipped_checks["slots"])
    )


def test_a_party_that_raises_is_an_error_that_keeps_the_other_checks_verdicts(
    vllm, scenario_from, monkeypatch
):
    scenario = scenario_from(EAGLE)

    # The party's own code raising (no vLLM frame under it): kvconform's error, not vLLM's.
    def broken(run, vllm):
        raise IndexError("list index out of range")

    judged = []

    def judging(run, checks):
        judged.append(checks)
        return real_judge(run, checks)

    real_judge = runner.judge
    slots = dataclasses.replace(runner.CHECKS["slots"], record=broken)
    monkeypatch.setattr(runner, "CHECKS", {**runner.CHECKS, "slots": slots})
    monkeypatch.setattr(runner, "judge", judging)
    result = run_scenario(scenario, vllm, ("floor", "slots"))
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INTERNAL
    assert "raised IndexError: list index out of range" in result.error
    assert result.skipped_checks["slots"].startswith("its party raised (kvconform's ")
    assert judged == [("floor",)]  # the floor still judged the trajectory


def test_only_token_indexed_groups_are_mapped(vllm, scenario_from):
    scenario = scenario_from(
        "model: {groups: [mamba]}\nspeculative: {method: eagle, num_speculative_tokens: 2}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    result = run_scenario(scenario, vllm, ("floor", "slots"))
    why = result.skipped_checks["slots"]
    assert why == "no token-indexed group to map: mamba not indexed by token position"
    # The whole reason, the floor rule's, is the group's in the recording (report.json).
    assert result.trajectory is not None and result.trajectory.slots is not None
    detail = result.trajectory.slots.groups_skipped[0]
    assert detail.startswith("mamba: its block table is not indexed by token position (")
    assert len(detail) > len(why)


def test_an_unmapped_reason_is_short_names_the_figures_and_is_never_empty():
    from kvconform.model.observations import GroupInfo, Trajectory
    from kvconform.oracles.slots import skipped_groups, unmapped_reason

    def info(index: int, type_: str, **args: object) -> GroupInfo:
        return GroupInfo(index, type_, 16, type_, False, floor_args=args)

    groups = (info(0, "full_attention", dcp_world_size=2), info(1, "mla", dcp_world_size=2),
              info(2, "mamba"))  # fmt: skip
    run = Trajectory(groups=groups, lookahead=0, lookahead_source="vllm")
    why = unmapped_reason(run, skipped_groups(run))
    assert why == (
        "no token-indexed group to map: full_attention, mla sharded by decode context "
        "parallelism (dcp_world_size 2); mamba not indexed by token position"
    )
    assert len(why) < 200 and sum(len(w) for w in skipped_groups(run).values()) > 400
    empty = Trajectory(groups=(), lookahead=0, lookahead_source="vllm")
    assert unmapped_reason(empty, {}).endswith(": the scenario's model has none")


def test_checks_option_values():
    # every check but slots by default (it runs vLLM's kernel, the one slow check)
    assert parse_checks(None) == (
        "lookahead", "floor", "ceiling", "capacity", "startup", "agree", "sanity"
    )  # fmt: skip
    assert parse_checks("slots,floor") == ("floor", "slots")  # reporting order
    assert parse_checks("all")[-1] == "slots"
    assert parse_checks("default,slots") == parse_checks("all")
    with pytest.raises(ValueError, match="unknown check 'slot'"):
        parse_checks("slot")


def test_cli_rejects_an_unknown_check(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--checks", "floor,slotz"]) == 2
    assert "--checks: unknown check 'slotz'" in capsys.readouterr().out


def test_pytest_plugin_adds_the_slots_check(vllm, pytester):
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    (pytester.mkdir("scenarios") / "eagle.yaml").write_text(EAGLE)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_inprocess(
        "scenarios", "-p", "no:cacheprovider", "--kvconform-slots", f"--junitxml={junit}"
    )
    result.assert_outcomes(passed=1)
    assert "SKIPPED" not in result.stdout.str()
    bad = pytester.runpytest_inprocess("scenarios", "--kvconform-checks", "flor")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR


def test_pytest_plugin_says_when_the_slots_check_was_skipped(vllm, pytester, monkeypatch):
    def no_kernel(vllm):
        raise VllmUnavailable(vllm.version, "a Triton kernel to run", "Triton is not installed")

    monkeypatch.setattr(slots_oracle, "slot_kernel_of", no_kernel)
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    (pytester.mkdir("scenarios") / "eagle.yaml").write_text(EAGLE)
    with_others = pytester.runpytest_inprocess(
        "scenarios", "-p", "no:cacheprovider", "--kvconform-slots"
    )
    with_others.assert_outcomes(passed=1)
    with_others.stdout.fnmatch_lines(
        ["kvconform: check slots SKIPPED in 1 item: *Triton is not installed"]
    )
    alone = pytester.runpytest_inprocess(
        "scenarios", "-p", "no:cacheprovider", "--kvconform-checks", "slots", "-rs"
    )
    alone.assert_outcomes(skipped=1)
    alone.stdout.fnmatch_lines(["*unsupported: no selected check could run: slots: *Triton*"])


@pytest.mark.slow
def test_an_allocator_that_ignores_lookahead_fails_slots_in_the_null_block(
    vllm, scenario_from, write_scenario, tmp_path, pristine_tree
):
    scenario_file = write_scenario(EAGLE, "eagle.yaml")
    # The unmodified vLLM conforms on the same scenario.
    unmodified = run_scenario(scenario_from(EAGLE), vllm, ("slots",))
    assert unmodified.verdict is Verdict.PASSED and unmodified.trajectory.slots.escapes == []

    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "tree",
        "v1/core/kv_cache_manager.py",
        "num_tokens_main_model + num_lookahead_tokens, self.max_model_len",
        "num_tokens_main_model, self.max_model_len",
    )
    report_dir = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(scenario_file), "--vllm-src", str(tree),
         "--checks", "slots", "--report-dir", str(report_dir)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (entry,) = json.loads((report_dir / "report.json").read_text())["scenarios"]
    assert entry["verdict"] == "failed" and entry["slots"]["escapes"] > 0
    details = [f["detail"] for f in entry["failures"]]
    assert {f["check"] for f in entry["failures"]} == {"slots"}
    assert {(d["party"], d["role"], d["vllm_whose"]) for d in details} == {
        ("live", "drafter", "block 0, the null block")
    }
    # Step 0: a's 64-token prefill holds 4 blocks; its drafter writes 64..67.
    assert details[0]["positions"] == [64, 65, 66, 67] and details[0]["held"] == 4
    assert "[slots] step 0 (line 6, prefill 64) request a" in done.stdout


@pytest.mark.slow
@pytest.mark.network
def test_warmup_of_0_27_1_sends_drafter_positions_to_the_null_block(vllm, tmp_path):
    # The upstream bug, by its consequence: 0.27.1's warmup reserves no lookahead.
    from kvconform.harness.loader import load_file

    scenario_file = ROOT / "scenarios" / "warmup" / "warmup-eagle-family.yaml"
    (fixed,) = [s for s in load_file(scenario_file) if s.id.endswith("[eagle-k5-bs16]")]
    installed = run_scenario(fixed, vllm, ("slots",))
    assert installed.verdict is Verdict.PASSED, installed.headline()
    assert installed.trajectory.slots.rows > 0 and "warmup" in installed.trajectory.parties

    report_dir = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(scenario_file), "-k", "eagle-k5-bs16",
         "--vllm-release", "0.27.1", "--checks", "slots", "--report-dir", str(report_dir)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (entry,) = json.loads((report_dir / "report.json").read_text())["scenarios"]
    details = [f["detail"] for f in entry["failures"]]
    assert {(d["party"], d["role"], d["vllm_whose"]) for d in details} == {
        ("warmup", "drafter", "block 0, the null block")
    }
    # warmup_kernels' first spec step: 7 computed + 6 scheduled + lookahead 5 reaches
    # position 17, but each warmup request holds one block of 16.
    first = entry["failures"][0]
    assert (first["step"], first["request"]) == (1, "_warmup_0_")
    assert (details[0]["positions"], details[0]["held"]) == ([16, 17], 1)
