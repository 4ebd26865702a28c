"""Figures for what kvconform registers: fuzzing, scenario kinds, checks.

A scenario kind has a driver in :data:`kvconform.harness.runner.DRIVERS`, a
check an entry in :data:`kvconform.harness.checks.CHECKS` (and, where it has a
party of its own, its record's ``record``). The benchmark measures whatever
is registered, so a new kind or check gets its figure without a change here.

* ``fuzz_examples_per_second``: ``run_fuzz(vllm, examples, seed)``; its own
  statistics give the search throughput (import, set-up and shrinking excluded).
* ``kinds``: per scenario kind in the corpus, the harness's time per step.
* ``checks``: per check, microseconds per step to judge a recorded trajectory,
  plus its own party where it has one (``slots``: vLLM's slot-mapping kernel).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.bench.figures import Figure, measured, not_available
from kvconform.bench.timing import interleave
from kvconform.harness.checks import CHECKS, judge
from kvconform.harness.runner import DRIVERS, run_scenario
from kvconform.model.results import Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm

FUZZ_TARGET = 50.0


def fuzz_examples_per_second(vllm: Vllm, examples: int, seed: int = 0) -> Figure:
    from kvconform.fuzz import run_fuzz  # imports Hypothesis: only when measured

    stats = run_fuzz(vllm, examples, seed)
    rate = float(stats.examples_per_second)
    return measured(
        rate,
        "examples/s",
        target=f">= {FUZZ_TARGET:.0f}",
        meets_target=rate >= FUZZ_TARGET,
        examples=stats.examples,
        seed=seed,
        search_seconds=stats.search_seconds,
        examples_per_cpu_second=stats.examples_per_cpu_second,
        findings=len(stats.findings),
    )


def _steps(results: Sequence[Any]) -> int:
    """Distinct (step, request) pairs recorded: a kind-neutral count of steps."""
    return sum(
        len({(o.step, o.request) for o in r.trajectory.observations})
        for r in results
        if r.trajectory is not None
    )


def kinds(scenarios: Sequence[Scenario], vllm: Vllm, rounds: int) -> dict[str, Figure]:
    """Per kind: the harness's time per recorded step (per scenario for a kind without
    steps), for every kind in the corpus."""
    figures: dict[str, Figure] = {}
    by_kind: dict[str, list[Scenario]] = {}
    for scenario in scenarios:
        by_kind.setdefault(scenario.kind, []).append(scenario)
    for kind in DRIVERS:
        if kind not in by_kind:
            figures[kind] = not_available(f"the corpus has no kind: {kind} scenario")
    passes = {
        kind: (lambda chosen=chosen: [run_scenario(s, vllm) for s in chosen])
        for kind, chosen in by_kind.items()
        if kind in DRIVERS
    }
    if not passes:
        return figures
    results = {kind: [run_scenario(s, vllm) for s in by_kind[kind]] for kind in passes}
    # A kind this machine cannot run (engine scenarios without CUDA) is reported with why.
    for kind in list(passes):
        if all(r.verdict is Verdict.SKIPPED for r in results[kind]):
            figures[kind] = not_available(f"skipped here: {results[kind][0].skip_reason}")
            del passes[kind]
    if not passes:
        return dict(sorted(figures.items()))
    timings = interleave(passes, rounds)
    for kind in passes:
        steps = _steps(results[kind])
        seconds = timings.median_wall(kind)
        errors = sum(1 for r in results[kind] if r.trajectory is None or r.trajectory.partial)
        # A kind without steps (startup: vLLM's planning, judged once) is timed per scenario.
        value, unit = (
            (1e6 * seconds / steps, "us/step")
            if steps
            else (1e3 * seconds / len(by_kind[kind]), "ms/scenario")
        )
        figures[kind] = measured(
            value,
            unit,
            scenarios=len(by_kind[kind]),
            steps=steps,
            seconds=seconds,
            ended_in_error=errors,
            rounds=rounds,
        )
    return dict(sorted(figures.items()))


def checks(
    scenarios: Sequence[Scenario], vllm: Vllm, rounds: int, party_sample: int = 10
) -> dict[str, Figure]:
    """Per check: microseconds per step to judge, plus its own party where it has one.

    A check is a pure function of a recorded trajectory, so its cost is timed
    on the corpus's trajectories (interleaved, median of ``rounds``). A check
    with a party of its own (``Check.record``: ``slots`` runs vLLM's
    slot-mapping kernel) is also charged for the party, timed once on the first
    ``party_sample`` scenarios: on CPU that kernel runs under Triton's
    interpreter, too slow to run over the whole corpus in a benchmark.
    """
    figures: dict[str, Figure] = {}
    results = [run_scenario(s, vllm, checks=()) for s in scenarios if s.kind in DRIVERS]
    trajectories = [r.trajectory for r in results if r.trajectory is not None]
    steps = _steps(results)
    if not trajectories or not steps:
        for name in CHECKS:
            figures[name] = not_available("no scenario of the corpus runs to its end")
        return figures
    party_details: dict[str, dict[str, Any]] = {}
    for name, party in ((n, c.record) for n, c in CHECKS.items() if c.record is not None):
        sample = trajectories[:party_sample]
        started = time.perf_counter()
        for trajectory in sample:
            party(trajectory, vllm)
        seconds = time.perf_counter() - started
        sample_steps = sum(len({(o.step, o.request) for o in t.observations}) for t in sample)
        party_details[name] = {
            "party_us_per_step": 1e6 * seconds / max(1, sample_steps),
            "party_sample_scenarios": len(sample),
            "party_sample_steps": sample_steps,
        }
        for trajectory in trajectories[party_sample:]:
            party(trajectory, vllm)  # so that the judge below sees every recording

    def judging(name: str) -> Callable[[], object]:
        return lambda: [judge(t, (name,)) for t in trajectories]

    timings = interleave({name: judging(name) for name in CHECKS}, rounds)
    for name in CHECKS:
        judge_us = 1e6 * timings.median_wall(name) / steps
        extra = party_details.get(name, {})
        skips = [judge(t, (name,)).skipped.get(name) for t in trajectories]
        if all(skips):
            figures[name] = not_available(f"skipped on every scenario: {skips[0]}")
            continue
        figures[name] = measured(
            judge_us + extra.get("party_us_per_step", 0.0),
            "us/step",
            judge_us_per_step=judge_us,
            **extra,
            skipped_on_scenarios=sum(1 for why in skips if why),
            steps=steps,
            rounds=rounds,
        )
    return dict(sorted(figures.items()))


def corpus_facts(scenarios: Sequence[Scenario], errors: Sequence[Any]) -> dict[str, Any]:
    by_kind: dict[str, int] = {}
    for scenario in scenarios:
        by_kind[scenario.kind] = by_kind.get(scenario.kind, 0) + 1
    return {
        "scenarios": len(scenarios),
        "by_kind": by_kind,
        "input_errors": len(errors),
        "calls": sum(len(step.calls) for s in scenarios for step in s.steps),
    }
