"""A crash keeps what was recorded before it (issue 35, the crash family).

vLLM raising on a valid scenario is a ``crash``; the steps the driver recorded up to the
exception stay in the result and in the recording (``run --record-dir``), marked
``partial``, for the reports to show what led to it; no check judges them, and ``judge``
gives the run's verdict again.

The exception is vLLM's own: from its Nth call on, one of vLLM's methods is called through
a wrapper that hands it a corrupted argument, so that vLLM's code raises in its own frame
(as an assertion of vLLM's would), with everything before that call real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_judge import judge_without_vllm
from vllm_copy import run_kvconform, tree_with_replacement

from kvconform.fronts.explain import explain
from kvconform.harness.judging import judge_recordings
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.harness.session import RunRequest
from kvconform.model import facts as f
from kvconform.model.observations import GroupInfo, Observation, Trajectory
from kvconform.model.recording import Recording, dumps, loads
from kvconform.model.results import ErrorKind, RunReport, ScenarioResult, Verdict
from kvconform.reports.html import render_html
from kvconform.reports.json_report import report_json

Corrupt = Callable[[tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]


def corrupt_nth_call(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, nth: int, corrupt: Corrupt
) -> None:
    """vLLM's ``cls.name``, its ``nth`` call made with the arguments ``corrupt`` returns."""
    original = getattr(cls, name)
    calls = 0

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth:
            args, kwargs = corrupt(args, kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)


TRAJECTORY = """
requests: {a: {prompt_len: 40}, b: {prompt_len: 20}}
steps:
  - {a: {prefill: 40}, b: {prefill: 20}}
  - {a: decode, b: decode}
  - {a: decode, b: decode}
  - {a: decode, b: decode}
"""

SCHEDULER = """
kind: scheduler
model: {max_model_len: 256, num_blocks: 64}
scheduler: {mode: sync, max_num_batched_tokens: 64}
requests:
  a: {prompt_len: 40, max_tokens: 8}
  b: {prompt_len: 100, max_tokens: 8, arrival: 1}
"""


def _run(scenario: Any, vllm: Any) -> tuple[ScenarioResult, Recording]:
    recorded: list[Recording] = []
    result = run_scenario(scenario, vllm, record=recorded.append)
    (recording,) = recorded
    return result, loads(dumps(recording))  # as judge reads it back from disk


def _steps(result: ScenarioResult | Recording) -> list[int]:
    assert result.trajectory is not None
    return sorted({o.step for o in result.trajectory.observations})


def _judged(recording: Recording) -> tuple[ScenarioResult, int]:
    report = judge_recordings([recording], RunRequest(no_expectations=True))
    (result,) = report.results
    return result, report.exit_status


def test_a_crash_in_the_allocator_keeps_the_steps_before_it(vllm, scenario_from, monkeypatch):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    # Calls 1, 2: step 0's prefills; 3, 4: step 1's decodes; the 5th (step 2's first) raises.
    corrupt_nth_call(
        monkeypatch,
        KVCacheManager,
        "allocate_slots",
        5,
        lambda args, kwargs: (args, {**kwargs, "num_new_tokens": None}),
    )
    result, recording = _run(scenario_from(TRAJECTORY), vllm)
    assert (result.verdict, result.error_kind) == (Verdict.ERROR, ErrorKind.CRASH)
    assert result.error.startswith(f"vLLM {vllm.version} raised TypeError")
    assert "at vllm/v1/core/" in result.error
    # What vLLM held for each request and group up to the crash: steps 0 and 1 whole.
    assert result.trajectory is not None and result.trajectory.partial
    assert _steps(result) == [0, 1]
    assert [(o.step, o.request, o.live) for o in result.trajectory.observations] == [
        (0, "a", 3), (0, "b", 2), (1, "a", 3), (1, "b", 2),
    ]  # fmt: skip
    assert result.failures == [] and result.skipped_checks == {}
    assert "partial: recorded until the exception" in result.trajectory.notes[-1]
    # The recording keeps them beside the crash, and judge concludes the crash again.
    assert recording.outcome is not None and recording.outcome.error == result.error
    assert recording.outcome.trajectory is None and _steps(recording) == [0, 1]
    judged, status = _judged(recording)
    assert (judged.verdict, judged.error_kind, judged.error) == (
        result.verdict,
        result.error_kind,
        result.error,
    )
    assert status == exit_status([result]) == 1
    assert judged.failures == [] and _steps(judged) == [0, 1]


WARMUP = """
kind: warmup
model: {block_size: 16, max_model_len: 2048, num_blocks: 512}
speculative: {method: eagle, num_speculative_tokens: 3}
warmup: {max_num_seqs: 4, max_num_batched_tokens: 512, mixed_num_tokens: 64}
"""


def test_a_crash_replaying_the_warmup_keeps_the_calls_before_it(vllm, scenario_from, monkeypatch):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    # The live replay of the recorded warmup makes one allocate_slots call per row (one
    # group): the 10th raises, the 9 before it are kept.
    corrupt_nth_call(
        monkeypatch,
        KVCacheManager,
        "allocate_slots",
        10,
        lambda args, kwargs: (args, {**kwargs, "num_new_tokens": None}),
    )
    result, recording = _run(scenario_from(WARMUP), vllm)
    assert (result.verdict, result.error_kind) == (Verdict.ERROR, ErrorKind.CRASH)
    assert result.trajectory is not None and result.trajectory.partial
    assert len(result.trajectory.observations) == 9 and result.failures == []
    assert recording.trajectory is not None and len(recording.trajectory.observations) == 9
    judged, status = _judged(recording)
    assert (judged.error_kind, judged.error, status) == (ErrorKind.CRASH, result.error, 1)


def test_a_crash_in_the_scheduler_keeps_the_scheduled_steps(vllm, scenario_from, monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    # The third step's output is applied with no model output: vLLM's own code raises.
    corrupt_nth_call(
        monkeypatch, Scheduler, "update_from_output", 3, lambda args, kwargs: ((args[0], None), {})
    )
    scenario = scenario_from(SCHEDULER)
    result, recording = _run(scenario, vllm)
    assert (result.verdict, result.error_kind) == (Verdict.ERROR, ErrorKind.CRASH)
    assert result.error.startswith(f"vLLM {vllm.version} raised AttributeError")
    assert "at vllm/v1/core/sched/scheduler.py" in result.error
    # Each schedule() is recorded before its output is applied: steps 0 to 2, the last
    # one's calls with the blocks held per group; b arrived at step 1.
    assert result.trajectory is not None and result.trajectory.partial
    assert _steps(result) == [0, 1, 2]
    last = [(o.request, o.group, o.live) for o in result.trajectory.observations if o.step == 2]
    assert [request for request, _, _ in last] == ["a", "b"]
    assert all(live > 0 for _, _, live in last)
    assert 2 in result.trajectory.step_notes
    assert result.failures == []
    judged, status = _judged(recording)
    assert (judged.verdict, judged.error_kind, judged.error) == (
        Verdict.ERROR,
        ErrorKind.CRASH,
        result.error,
    )
    assert status == 1 and _steps(judged) == [0, 1, 2]
    # The reports show the steps that led to it.
    text = explain(scenario, result, vllm.version)
    assert "note: partial: recorded until the exception stopped the run (3 steps" in text
    assert [line.split()[0] for line in text.splitlines() if line[:4].strip().isdigit()] == [
        "0", "1", "1", "2", "2",
    ]  # fmt: skip
    report = RunReport(
        results=[judged], input_errors=[], vllm_version=vllm.version, vllm_source="installed",
        vllm_path=vllm.location,
    )  # fmt: skip
    (entry,) = report_json(report)["scenarios"]
    assert (entry["error_kind"], entry["partial"], entry["steps"]) == ("crash", True, 3)
    html = render_html(report)
    assert "Step by step" in html and "partial: recorded until the exception" in html


def test_an_internal_error_keeps_its_kind_and_its_partial_steps(vllm, scenario_from, monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    def kvconforms_bug(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Raised in the oracle's call, with no vLLM frame under it: kvconform's own error.
        raise IndexError("list index out of range")

    corrupt_nth_call(monkeypatch, Scheduler, "update_from_output", 2, kvconforms_bug)
    result, recording = _run(scenario_from(SCHEDULER), vllm)
    assert (result.verdict, result.error_kind) == (Verdict.ERROR, ErrorKind.INTERNAL)
    assert result.error.startswith("kvconform's scheduler oracle raised IndexError")
    assert result.trajectory is not None and result.trajectory.partial
    assert _steps(result) == [0, 1]
    judged, status = _judged(recording)
    assert (judged.error_kind, judged.error) == (ErrorKind.INTERNAL, result.error)
    assert status == exit_status([result]) == 3


def test_a_whole_run_is_not_partial(vllm, scenario_from):
    result, recording = _run(scenario_from(TRAJECTORY), vllm)
    assert result.verdict is Verdict.PASSED
    assert result.trajectory is not None and not result.trajectory.partial
    assert recording.trajectory is not None and not recording.trajectory.partial
    judged, status = _judged(recording)
    assert judged.verdict is Verdict.PASSED and status == 0


def _crashed_recording(partial: bool) -> Recording:
    """A crash whose recorded steps hold a fact check ``sanity`` fails (a stated hit of 64
    where vLLM hit 48): judged, it would turn the crash into a failure."""
    groups = (GroupInfo(0, "full_attention", 16, "full", False),)
    trajectory = Trajectory(groups, 0, "no speculative decoding", max_model_len=256)
    trajectory.observations.append(
        Observation(0, 9, "b", "prefill 80", 0, 0, 80, 0, 5, 5, None, None, None, [1, 2, 3, 4, 5])
    )
    trajectory.num_blocks = 16
    trajectory.facts.append(f.Fact(0, 9, "b", "prefill 80", f.AdmissionHit(48, 64)))
    trajectory.partial = partial
    error = "vLLM 0.34.0 raised AssertionError at vllm/v1/core/block_pool.py:1 in free_blocks"
    outcome = ScenarioResult(
        "crashed", "crashed.yaml", Verdict.ERROR, error_kind=ErrorKind.CRASH, error=error
    )
    return Recording(
        "crashed", "crashed.yaml", "trajectory", trajectory, outcome=outcome,
        checks=("floor", "sanity"), vllm={"version": "0.34.0", "device": "cpu"},
    )  # fmt: skip


def test_judge_never_judges_a_crashs_partial_steps():
    judged, status = _judged(loads(dumps(_crashed_recording(partial=True))))
    assert (judged.verdict, judged.error_kind, judged.failures) == (
        Verdict.ERROR,
        ErrorKind.CRASH,
        [],
    )
    assert status == 1 and _steps(judged) == [0]
    # The same steps, judged as a whole run's, fail: the mark is what keeps the crash.
    whole, _ = _judged(_crashed_recording(partial=False))
    assert whole.verdict is Verdict.FAILED and {x.check for x in whole.failures} == {"sanity"}


# vLLM's scheduler asserting, while it applies a step's output, that fewer than two
# requests run: in SCHEDULER, b joins a at step 1, so step 1's output raises.
TWO_RUNNING_ASSERT = (
    "v1/core/sched/scheduler.py",
    "        sampled_token_ids = model_runner_output.sampled_token_ids\n",
    "        sampled_token_ids = model_runner_output.sampled_token_ids\n"
    "        assert len(self.running) < 2, 'injected: two requests running'\n",
)


@pytest.mark.slow
def test_run_and_judge_keep_the_steps_before_an_assertion_injected_into_vllm(
    pristine_tree, tmp_path: Path
) -> None:
    tree = tree_with_replacement(pristine_tree, tmp_path / "vllm-tree", *TWO_RUNNING_ASSERT)
    scenario = tmp_path / "scenarios" / "two-running.yaml"
    scenario.parent.mkdir()
    scenario.write_text("name: two-running" + SCHEDULER, encoding="utf-8")
    recorded = tmp_path / "recorded"
    run = run_kvconform(
        "run", scenario, "--vllm-src", tree, "--record-dir", recorded,
        "--report-dir", tmp_path / "run", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    judged = judge_without_vllm(recorded, "--report-dir", tmp_path / "judged", cwd=tmp_path)
    assert judged.returncode == 1, judged.stdout[-3000:] + judged.stderr[-3000:]
    entries = [
        json.loads((tmp_path / d / "report.json").read_text())["scenarios"][0]
        for d in ("run", "judged")
    ]
    shown = ("verdict", "error_kind", "error", "partial", "steps", "failures")
    assert [{k: e[k] for k in shown} for e in entries] == [
        {
            "verdict": "error",
            "error_kind": "crash",
            "error": entries[0]["error"],
            "partial": True,
            "steps": 2,
            "failures": [],
        }
    ] * 2
    assert (
        "AssertionError: injected: two requests running at vllm/v1/core/sched/"
        in (entries[0]["error"])
    )
    (recording,) = recorded.glob("*.json")
    steps = _steps(loads(recording.read_text(encoding="utf-8")))
    assert steps == [0, 1]
    html = (tmp_path / "judged" / "report.html").read_text(encoding="utf-8")
    assert "Step by step" in html
