"""The explorer's figures: workloads and scheduler steps per core, and its cost over a bare loop.

* ``explore_workloads_per_second`` -- drawn workloads (every feature drawn as the
  explorer draws it) each loaded, run through vLLM's scheduler and judged by every
  check, as the explorer's search runs an example (``run_scenario``): workloads and
  scheduler steps per CPU second, after a first pass that builds vLLM's
  configurations (built once per process, as in a search). Drawing is not timed:
  ``kvconform explore`` prints its own rate, drawing and shrinking apart.
  Target: at least 10 workloads per CPU second (issue 35).
* ``explore_step_ratio`` -- the same drawn workloads run twice each, interleaved:
  through the harness (``run_scenario``: the scheduler driver recording every
  step, then every check judging it) and through a *bare loop* over vLLM's
  scheduler making the same calls and nothing else: ``add_request`` at each
  arrival, ``schedule``, a model output sampling one token per request plus its
  accepted drafts (all accepted) and none for a prefill chunk inside the prompt,
  ``update_from_output``, and under synchronous scheduling the drafter's next drafts
  (``update_draft_token_ids``), as the scheduler oracle makes them. Both sides build
  the scheduler with the scheduler oracle's constructor (the bare side reads its
  scheduler, requests and arrivals off it and steps it itself), so the ratio is the
  cost of recording and judging per step. The ratio is CPU time over CPU time, and
  the scheduler steps of both sides are reported, so that one can see they did the
  same work. Target: at most 2x (issue 35).

  The bare loop models what a plain workload needs; the workloads of this figure are
  drawn with the features it does not model turned off (KV connectors, multimodal
  inputs, stops, aborts, pauses, stats, acceptance patterns, asynchronous
  scheduling): the other features (hybrid groups, speculation, prefix caching,
  chunking, priorities, pools at the edge, budgets, arrivals) are drawn as the
  explorer draws them.
"""

from __future__ import annotations

import time
from random import Random
from typing import Any

from kvconform.bench.figures import Figure, measured, not_available
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm

WORKLOADS_TARGET = 10.0  # workloads per CPU second
RATIO_TARGET = 2.0
# Features the bare loop does not model: off in the workloads of the ratio.
UNMODELLED = (
    "remote_kv",
    "sync_connector",
    "multimodal",
    "stops",
    "aborts",
    "pauses",
    "stats",
    "acceptance",
    "async_scheduling",
)


def explore_workloads_per_second(vllm: Vllm, count: int, rounds: int, seed: int = 0) -> Figure:
    """Drawn workloads (every feature as the explorer draws them) loaded, run and judged."""
    from kvconform.harness.runner import run_scenario

    scenarios = drawn_workloads(vllm, count, seed, plain=False)
    for scenario in scenarios:  # vLLM's configurations, built once per process, built here
        run_scenario(scenario, vllm)
    cpu = 0.0
    steps = 0
    for _ in range(rounds):
        for scenario in scenarios:
            began = time.process_time()
            result = run_scenario(scenario, vllm)
            cpu += time.process_time() - began
            steps += _steps(result)
    runs = rounds * len(scenarios)
    rate = runs / cpu if cpu else 0.0
    return measured(
        rate,
        "workloads/CPU s",
        target=f">= {WORKLOADS_TARGET:.0f}",
        meets_target=rate >= WORKLOADS_TARGET,
        workloads=len(scenarios),
        rounds=rounds,
        seed=seed,
        scheduler_steps=steps,
        steps_per_cpu_second=steps / cpu if cpu else 0.0,
    )


def _steps(result: Any) -> int:
    """The steps a result recorded (the distinct steps of its observations: a schedule() call
    that scheduled some request; a call that scheduled nothing has no row)."""
    trajectory = result.trajectory
    return len({o.step for o in trajectory.observations}) if trajectory is not None else 0


def drawn_workloads(vllm: Vllm, count: int, seed: int = 0, plain: bool = True) -> list[Scenario]:
    """``count`` explorer workloads; ``plain``: the features the bare loop does not model off.

    Hypothesis draws its first examples small on purpose; each workload here is the
    example drawn after a random number (10..40) of others, so the sample has the
    sizes a search spends its time on.
    """
    from hypothesis import Phase, find, settings
    from hypothesis import strategies as st

    from kvconform.explore.space import build_explore_space
    from kvconform.explore.strategies import feature_sets, workload
    from kvconform.fuzz.document import render
    from kvconform.harness.loader import load_text

    space = build_explore_space(vllm)
    off = dict.fromkeys(UNMODELLED, False) if plain else {}

    @st.composite
    def drawn(draw: Any) -> dict[str, Any]:
        return workload(draw, space, {**draw(feature_sets()), **off}, "bench")

    rng = Random(seed)
    scenarios = []
    for index in range(count):
        skip = rng.randrange(10, 40)
        seen = iter(range(10**6))

        def late(doc: dict[str, Any], seen: Any = seen, skip: int = skip) -> bool:
            return next(seen) >= skip

        doc = find(
            drawn(),
            late,
            settings=settings(database=None, phases=[Phase.generate], max_examples=100),
            random=Random(rng.random()),
        )
        doc["name"] = f"bench-{index}"
        (scenario,) = load_text(render(doc), f"<bench {index}>")
        scenarios.append(scenario)
    return scenarios


def explore_step_ratio(vllm: Vllm, count: int, rounds: int, seed: int = 0) -> Figure:
    from kvconform.harness.runner import run_scenario
    from kvconform.model.results import Verdict

    scenarios = drawn_workloads(vllm, count, seed, plain=True)
    # Only the workloads the harness runs to the end (a rejected one stops early there).
    kept = [s for s in scenarios if run_scenario(s, vllm).verdict is Verdict.PASSED]
    if not kept:
        return not_available("no drawn workload passed on this vLLM")
    harness = bare = 0.0
    harness_steps = bare_steps = 0
    for _ in range(rounds):
        for scenario in kept:
            began = time.process_time()
            result = run_scenario(scenario, vllm)
            harness += time.process_time() - began
            harness_steps += _steps(result)
            began = time.process_time()
            bare_steps += bare_loop(vllm, scenario)
            bare += time.process_time() - began
    ratio = harness / bare if bare else 0.0
    return measured(
        ratio,
        "x",
        target=f"<= {RATIO_TARGET:.0f}",
        meets_target=ratio <= RATIO_TARGET,
        workloads=len(kept),
        drawn=len(scenarios),
        rounds=rounds,
        harness_cpu_seconds=harness,
        bare_cpu_seconds=bare,
        harness_steps=harness_steps,
        bare_steps=bare_steps,
        harness_steps_per_cpu_second=harness_steps / harness if harness else 0.0,
        bare_steps_per_cpu_second=bare_steps / bare if bare else 0.0,
    )


def bare_loop(vllm: Vllm, scenario: Scenario) -> int:
    """Step vLLM's scheduler through ``scenario``'s workload with nothing recorded; the
    ``schedule()`` calls it made."""
    from kvconform.oracles.resolve import resolve_settings
    from kvconform.oracles.scheduler import SchedulerOracle

    # vLLM's defaults for what the scenario leaves out, as the harness resolves them.
    scenario, _ = resolve_settings(scenario, vllm)
    spec = scenario.speculative
    k = spec.num_speculative_tokens if spec is not None else 0
    oracle = SchedulerOracle(vllm, scenario, k)
    scheduler, api = oracle.scheduler, oracle.api
    # The oracle's own requests, arrivals and first output tokens (built by its constructor).
    pending = list(oracle._pending)
    requests = oracle._requests
    next_output = dict(oracle._next_output)
    sync = scenario.scheduler is not None and scenario.scheduler.mode == "sync"
    step = idle = calls = 0
    limit = scenario.scheduler.max_steps if scenario.scheduler is not None else 2000
    while step < limit:
        while pending and pending[0].arrival <= step:
            scheduler.add_request(requests[pending.pop(0).name])
        if not scheduler.has_requests():
            if not pending:
                break
            step = pending[0].arrival  # idle until the next arrival, as the engine is
            continue
        output = scheduler.schedule()
        step += 1
        calls += 1
        idle = 0 if output.total_num_scheduled_tokens else idle + 1
        if idle >= 3 and not pending:
            break  # the harness's stall: nothing more will be scheduled
        drafts = api.scheduled_drafts(output)
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for rid in output.num_scheduled_tokens:
            req_ids.append(rid)
            if scheduler.requests[rid].is_prefill_chunk:
                sampled.append([])
                continue
            accepted = len(drafts.get(rid, ()))
            first = next_output[rid]
            next_output[rid] = first + 1 + accepted
            sampled.append(list(range(first, first + 1 + accepted)))
        model_output = api.model_runner_output(req_ids, sampled, set(), set(), set())
        scheduler.update_from_output(output, model_output)
        if sync and k and not api.skips_drafts(output):
            count = api.drafts_per_step(output, k)
            ids = list(output.num_scheduled_tokens)
            scheduler.update_draft_token_ids(
                api.draft_token_ids(ids, [[900_000 + i for i in range(count)] for _ in ids])
            )
    scheduler.shutdown()
    return calls
