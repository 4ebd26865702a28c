"""``step_overhead_ratio``: the harness against the bare loop, on the same trajectories.

The harness pass is what ``kvconform run`` does per scenario once vLLM is
imported: :func:`kvconform.harness.runner.run_scenario` (driver, recording,
checks, expectations). The bare pass is :mod:`kvconform.bench.bare` on the
same scenarios. Both run in this process, interleaved (:mod:`.timing`); the
figure is the median over rounds of harness time / bare time.

Two more passes split the harness's time: the driver alone (recording
included, checks excluded) and the checks alone on recorded trajectories. An
untimed pass through :class:`~kvconform.bench.timing.CallCounter` shows that
both sides made the same ``allocate_slots`` and predictor calls.

Only ``kind: trajectory`` scenarios have a bare loop (their calls are resolved
in the scenario); scenarios of other kinds, and scenarios that end in an error
before their last step, are listed as excluded with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.bench.bare import BarePlan, count_steps, plan, run_bare_all
from kvconform.bench.figures import Figure, measured, not_available
from kvconform.bench.timing import CallCounter, Timings, interleave
from kvconform.harness.checks import DEFAULT_CHECKS, run_checks
from kvconform.harness.expectations import Expectation
from kvconform.harness.runner import DRIVERS, run_scenario
from kvconform.model.kinds import KINDS
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm

TARGET_RATIO = 1.3


@dataclass
class Workload:
    """The scenarios both loops walk, their bare plans, and what was left out."""

    scenarios: list[Scenario]
    plans: list[BarePlan]
    trajectories: list[Trajectory]
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return count_steps(self.plans)


def workload(scenarios: Sequence[Scenario], vllm: Vllm) -> Workload:
    """The ``kind: trajectory`` scenarios that run to the end, with their plans."""
    chosen: list[Scenario] = []
    trajectories: list[Trajectory] = []
    excluded: dict[str, str] = {}
    for scenario in scenarios:
        if not KINDS[scenario.kind].states_steps:
            excluded[scenario.id] = f"kind {scenario.kind}: no bare loop"
            continue
        if _admission_options(scenario):
            # The bare loop makes the plain scheduler call (counts, hit, lookahead); the
            # connector and admission-gate arguments of scenarios/admission are
            # correctness cases, not the per-step cost the ratio measures.
            excluded[scenario.id] = (
                "admission options (connector tokens, gates, skipped lookups): no bare loop"
            )
            continue
        if _between_steps(scenario):
            # Resets, evictions and deferred frees are what the engine does around the
            # scheduler's calls, which the bare loop (the plain scheduler call) does not.
            excluded[scenario.id] = (
                "engine work between steps (reset, evict, in-flight finish): no bare loop"
            )
            continue
        if scenario.model.hisparse_host_blocks is not None:
            # HiSparse's layout runs its coordinator around every step, which the bare
            # loop (the plain scheduler call) does not.
            excluded[scenario.id] = (
                "HiSparse layout (its coordinator's per-step work): no bare loop"
            )
            continue
        result = run_scenario(scenario, vllm, checks=())
        # A crash keeps its partial trajectory (Trajectory.partial): not a whole walk either.
        if result.trajectory is None or result.trajectory.partial:
            excluded[scenario.id] = f"ends in an error: {result.error}"
            continue
        chosen.append(scenario)
        trajectories.append(result.trajectory)
    return Workload(chosen, [plan(s, vllm) for s in chosen], trajectories, excluded)


def _between_steps(scenario: Scenario) -> bool:
    return any(
        step.reset_prefix_cache is not None
        or step.evict_cached
        or any(call.deferred_free for call in step.calls)
        for step in scenario.steps
    )


def _admission_options(scenario: Scenario) -> bool:
    model = scenario.model
    if model.watermark or model.max_in_flight_tokens is not None:
        return True
    # A request that skips reading the prefix cache: the bare loop looks every prefix up.
    if any(request.skip_reading_prefix_cache for request in scenario.requests.values()):
        return True
    return any(
        call.options.external
        or call.options.load_async
        or call.options.full_sequence_must_fit is not None
        or call.options.reserved_blocks
        or call.options.in_flight
        for step in scenario.steps
        for call in step.calls
    )


def harness_pass(
    scenarios: Sequence[Scenario], vllm: Vllm, expectations: Sequence[Expectation] = ()
) -> None:
    for scenario in scenarios:
        run_scenario(scenario, vllm, DEFAULT_CHECKS, expectations)


def count_calls(
    work: Workload, vllm: Vllm, expectations: Sequence[Expectation] = ()
) -> dict[str, Any]:
    """The vLLM calls each side makes, counted through wrappers in an untimed pass."""
    counter = CallCounter()
    with counter.counting(vllm) as counts:
        harness_pass(work.scenarios, vllm, expectations)
    harness = dict(counts)
    with counter.counting(vllm) as counts:
        run_bare_all(work.plans, vllm)
    bare = dict(counts)
    return {"harness": harness, "bare": bare}


def time_workload(
    work: Workload, vllm: Vllm, rounds: int, expectations: Sequence[Expectation] = ()
) -> Timings:
    pairs = [(DRIVERS[s.kind], s) for s in work.scenarios]

    # Every pass drops what it made as it goes, like the harness pass: a pass that kept
    # its trajectories would pay for a growing heap the others do not.
    def driver_pass() -> None:
        for drive, scenario in pairs:
            drive(scenario, vllm)

    def checks_pass() -> None:
        for trajectory in work.trajectories:
            run_checks(trajectory, DEFAULT_CHECKS)

    return interleave(
        {
            "harness": lambda: harness_pass(work.scenarios, vllm, expectations),
            "bare": lambda: run_bare_all(work.plans, vllm),
            "driver": driver_pass,
            "checks": checks_pass,
        },
        rounds,
    )


def step_overhead_ratio(
    scenarios: Sequence[Scenario],
    vllm: Vllm,
    rounds: int,
    expectations: Sequence[Expectation] = (),
) -> Figure:
    work = workload(scenarios, vllm)
    if not work.scenarios:
        return not_available(
            "no kind: trajectory scenario runs to its end: "
            + "; ".join(f"{k}: {v}" for k, v in work.excluded.items())
        )
    calls = count_calls(work, vllm, expectations)
    timings = time_workload(work, vllm, rounds, expectations)
    ratio = timings.ratio("harness", "bare")
    steps = work.steps
    per_step = 1e6 / steps
    return measured(
        ratio,
        "x",
        target=f"<= {TARGET_RATIO}",
        meets_target=ratio <= TARGET_RATIO,
        cpu_ratio=timings.ratio("harness", "bare", clock="cpu"),
        driver_ratio=timings.ratio("driver", "bare"),
        checks_ratio=timings.ratio("checks", "bare"),
        rounds=rounds,
        scenarios=len(work.scenarios),
        steps=steps,
        harness_seconds=timings.median_wall("harness"),
        bare_seconds=timings.median_wall("bare"),
        harness_us_per_step=timings.median_wall("harness") * per_step,
        bare_us_per_step=timings.median_wall("bare") * per_step,
        driver_us_per_step=timings.median_wall("driver") * per_step,
        checks_us_per_step=timings.median_wall("checks") * per_step,
        harness_cpu_us_per_step=timings.median_cpu("harness") * per_step,
        bare_cpu_us_per_step=timings.median_cpu("bare") * per_step,
        calls=calls,
        excluded=work.excluded,
    )
