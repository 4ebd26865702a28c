"""The campaign: one vLLM import, one clean run, then a forked child per mutant.

1. vLLM is imported once (through the oracles) and every scenario of the corpus
   runs once, clean, under a :class:`~kvconform.oracles.vllm.mutation.ReachRecorder`:
   that gives each scenario's *baseline outcome* (verdict after expectations,
   and which checks failed where) and the set of target functions it calls.
2. Each target's mutants come from cosmic-ray's operators (:mod:`.mutants`).
3. Each mutant runs in a child made with ``os.fork()``: the child compiles the
   mutated module, swaps the code of the one function
   (:func:`~kvconform.oracles.vllm.mutation.swap_code`), forgets the answers the
   ``Vllm`` object remembered from the clean run, and runs through the session
   only the scenarios that reached the function: first those that killed other
   mutants of the same function, then the fastest. It stops at the first
   scenario whose outcome differs from its baseline. A child that runs past its
   time is killed (verdict ``timeout``); the parent never runs a mutant itself,
   so the next mutant starts from the clean state.
   A mutant of a parameter default gets the mutated defaults assigned as well.
4. A mutant neither swap can express (a decorator, a change of the closure's
   free variables) runs in a fresh process against a hard-linked copy of the
   vLLM tree with the mutated file (:mod:`.fresh`).

Verdicts (see :mod:`.outcome`): ``killed`` (the scenarios and checks that
differ), ``survived`` (``covered`` says whether any scenario reached it),
``timeout``, ``incompetent`` (does not compile, or crashes every scenario it
reaches; reported apart), ``equivalent`` (survived and listed, with its
argument, in the equivalents file).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.errors import SwapImpossible, TargetMissing
from kvconform.model.results import ScenarioResult
from kvconform.model.scenario import Scenario
from kvconform.mutate.mutants import (
    FunctionSource,
    Mutant,
    default_sources,
    enumerate_mutants,
    find_function,
    mutated_function_text,
    mutated_module_text,
    replacement_text,
    unified_diff,
)
from kvconform.mutate.outcome import Outcome, judge_mutant, outcome_of
from kvconform.mutate.targets import Equivalent, Target
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.mutation import (
    ReachRecorder,
    add_globals,
    compiled_function_code,
    resolve_function,
    swap_code,
    swap_defaults,
)

# A child gets this much time beyond what its scenarios took in the clean run
# (forking, compiling the mutant, a slower machine), and this factor on top.
TIMEOUT_BASE_S = 10.0
TIMEOUT_FACTOR = 5.0


@dataclass
class ResolvedTarget:
    target: Target
    source: FunctionSource | None = None
    function: Any = None  # the live function object (parent only)
    missing: str | None = None
    mutants: list[Mutant] = field(default_factory=list)


@dataclass
class MutantResult:
    mutant: Mutant
    verdict: str
    killed_by: list[dict[str, Any]] = field(default_factory=list)
    covered: bool = True
    scenarios_run: int = 0
    seconds: float = 0.0
    how: str = "fork"  # fork | fresh | none
    note: str = ""
    diff: str = ""
    replacement: str = ""
    equivalent_reason: str = ""
    fuzz: dict[str, Any] | None = None


@dataclass
class Baseline:
    """The clean run: each scenario's outcome and time, and which targets it reached."""

    outcomes: dict[str, Outcome]
    seconds: dict[str, float]
    reached: dict[str, list[str]]  # target key -> scenario ids, corpus order


def resolve_targets(
    targets: Sequence[Target], operators: Sequence[str] | None = None
) -> list[ResolvedTarget]:
    """Find each target's live function and source; a missing one is reported, not raised."""
    resolved = []
    for target in targets:
        entry = ResolvedTarget(target)
        try:
            entry.function = resolve_function(target.module, target.function)
        except TargetMissing as exc:
            entry.missing = str(exc)
            resolved.append(entry)
            continue
        path = entry.function.__code__.co_filename
        text = Path(path).read_text(encoding="utf-8")
        entry.source = find_function(target.module, target.function, path, text)
        if entry.source is None:
            entry.missing = f"{target.function} not found in the source of {path}"
        else:
            entry.mutants = enumerate_mutants(entry.source, operators, target.focus)
        resolved.append(entry)
    return resolved


def clean_run(
    scenarios: Sequence[Scenario],
    run: Callable[[Scenario], ScenarioResult],
    targets: Sequence[ResolvedTarget],
    tick: Callable[[str], None] = lambda _: None,
) -> Baseline:
    """Every scenario once, clean (``run`` is the session's), recording what it reaches."""
    codes = {t.function.__code__: t.target.key for t in targets if t.function is not None}
    recorder = ReachRecorder(codes)
    baseline = Baseline({}, {}, defaultdict(list))
    for scenario in scenarios:
        with recorder.recording() as reached:
            result = run(scenario)
        baseline.outcomes[scenario.id] = outcome_of(result)
        baseline.seconds[scenario.id] = result.duration
        for key in sorted(reached):
            baseline.reached[key].append(scenario.id)
        tick(scenario.id)
    baseline.reached = dict(baseline.reached)
    return baseline


# -- the forked child --------------------------------------------------------------------


def _in_child(
    write_fd: int,
    mutant: Mutant,
    function_text: str,
    vllm: Vllm,
    function: Any,
    source: FunctionSource,
    mutated: str,
    scenarios: Sequence[Scenario],
    baseline: Baseline,
    run_one: Callable[[Scenario], ScenarioResult],
) -> None:
    """Swap, run, report on ``write_fd``, and leave without running the parent's exit code."""
    payload: dict[str, Any]
    try:
        try:
            code = compiled_function_code(mutated, source.path, source.function)
        except SyntaxError as exc:
            payload = {"verdict": "incompetent", "note": f"does not compile: {exc.msg}"}
        else:
            try:
                swap_code(function, code)
                if mutant.region == "signature":
                    swap_defaults(function, *default_sources(function_text))
            except SwapImpossible as exc:
                payload = {"verdict": "fresh", "note": str(exc)}
            else:
                from cosmic_ray.exceptions import CosmicRayTestingException

                add_globals(function, {"CosmicRayTestingException": CosmicRayTestingException})
                vllm.forget_answers()

                def run(scenario: Scenario) -> Outcome:
                    return outcome_of(run_one(scenario))

                payload = judge_mutant(scenarios, run, baseline.outcomes)
    except BaseException:  # noqa: BLE001 - whatever happens here is the mutant's verdict
        payload = {"verdict": "incompetent", "note": traceback.format_exc(limit=3)[-600:]}
    data = json.dumps(payload).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view) :]
    finally:
        os._exit(0)


@dataclass
class _Running:
    pid: int
    fd: int
    mutant: Mutant
    deadline: float
    started: float
    chunks: list[bytes] = field(default_factory=list)


def _order(
    scenario_ids: Sequence[str], kills: Counter[str], seconds: dict[str, float]
) -> list[str]:
    """Scenarios that killed this function's mutants first, then the fastest."""
    return sorted(scenario_ids, key=lambda s: (-kills[s], seconds.get(s, 0.0), s))


def run_mutants(
    vllm: Vllm,
    resolved: Sequence[ResolvedTarget],
    mutants: Sequence[Mutant],
    scenarios: Sequence[Scenario],
    baseline: Baseline,
    run_one: Callable[[Scenario], ScenarioResult],
    equivalents: dict[str, Equivalent] | None = None,
    jobs: int = 2,
    fresh_runner: Callable[[Mutant, str, list[str]], dict[str, Any]] | None = None,
    on_result: Callable[[MutantResult], None] = lambda _: None,
) -> list[MutantResult]:
    """Every mutant's verdict; ``fresh_runner`` handles what a code swap cannot express."""
    equivalents = equivalents or {}
    by_key = {r.target.key: r for r in resolved}
    by_id = {s.id: s for s in scenarios}
    kills: dict[str, Counter[str]] = defaultdict(Counter)
    results: dict[str, MutantResult] = {}
    texts: dict[str, str] = {}
    queue = list(mutants)
    fresh: list[Mutant] = []
    running: dict[int, _Running] = {}
    selector = selectors.DefaultSelector()

    def finish(mutant: Mutant, payload: dict[str, Any], seconds: float, how: str) -> None:
        target = by_key[f"{mutant.module}:{mutant.function}"]
        assert target.source is not None
        text = texts.pop(mutant.id, "") or mutated_module_text(target.source, mutant)
        result = MutantResult(
            mutant,
            payload["verdict"],
            killed_by=payload.get("killed_by", []),
            covered=payload.get("covered", True),
            scenarios_run=payload.get("scenarios_run", 0),
            seconds=seconds,
            how=how,
            note=payload.get("note", ""),
            diff=unified_diff(target.source, text),
            replacement=replacement_text(target.source, text, mutant),
        )
        equivalent = equivalents.get(mutant.id)
        if equivalent is not None:
            if result.verdict == "survived":
                result.verdict = "equivalent"
                result.equivalent_reason = equivalent.reason
            else:
                result.note = (
                    result.note + "; " if result.note else ""
                ) + f"listed as equivalent but {result.verdict}: the entry is stale"
        for kill in result.killed_by:
            kills[target.target.key][kill["scenario"]] += 1
        results[mutant.id] = result
        on_result(result)

    def start(mutant: Mutant) -> None:
        target = by_key[f"{mutant.module}:{mutant.function}"]
        assert target.source is not None
        reached = baseline.reached.get(target.target.key, [])
        if not reached:
            finish(
                mutant,
                {"verdict": "survived", "covered": False, "note": "no scenario reaches it"},
                0.0,
                "none",
            )
            return
        text = mutated_module_text(target.source, mutant)
        texts[mutant.id] = text
        if not mutant.swappable:
            fresh.append(mutant)
            return
        order = _order(reached, kills[target.target.key], baseline.seconds)
        budget = TIMEOUT_BASE_S + TIMEOUT_FACTOR * sum(baseline.seconds[s] for s in order)
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read_fd)
            _in_child(
                write_fd,
                mutant,
                mutated_function_text(target.source, mutant),
                vllm,
                target.function,
                target.source,
                text,
                [by_id[s] for s in order],
                baseline,
                run_one,
            )
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        now = time.monotonic()
        running[read_fd] = _Running(pid, read_fd, mutant, now + budget, now)
        selector.register(read_fd, selectors.EVENT_READ)

    def reap(job: _Running, timed_out: bool) -> None:
        selector.unregister(job.fd)
        os.close(job.fd)
        del running[job.fd]
        if timed_out:
            os.kill(job.pid, signal.SIGKILL)
        os.waitpid(job.pid, 0)
        seconds = time.monotonic() - job.started
        if timed_out:
            finish(
                job.mutant,
                {"verdict": "timeout", "note": f"killed after {seconds:.0f} s"},
                seconds,
                "fork",
            )
            return
        try:
            payload = json.loads(b"".join(job.chunks) or b"{}")
        except json.JSONDecodeError:
            payload = {}
        if "verdict" not in payload:
            payload = {"verdict": "incompetent", "note": "the child died without a verdict"}
        if payload["verdict"] == "fresh":
            fresh.append(job.mutant)
            texts.setdefault(job.mutant.id, "")
            return
        finish(job.mutant, payload, seconds, "fork")

    while queue or running:
        while queue and len(running) < jobs:
            start(queue.pop(0))
        if not running:
            continue
        soonest = min(job.deadline for job in running.values())
        for key, _ in selector.select(timeout=max(0.0, soonest - time.monotonic())):
            job = running[key.fd]
            try:
                chunk = os.read(job.fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                job.chunks.append(chunk)
            else:
                reap(job, timed_out=False)
        now = time.monotonic()
        for job in [j for j in running.values() if j.deadline <= now]:
            reap(job, timed_out=True)
    selector.close()

    # Fresh processes are few (decorators) and wait on vLLM's import: `jobs` at a time.
    def one_fresh(mutant: Mutant) -> tuple[dict[str, Any], float]:
        target = by_key[f"{mutant.module}:{mutant.function}"]
        assert target.source is not None
        reached = baseline.reached[target.target.key]
        text = texts.get(mutant.id) or mutated_module_text(target.source, mutant)
        began = time.monotonic()
        if fresh_runner is None:
            return {"verdict": "skipped", "note": "needs a fresh process; none was allowed"}, 0.0
        payload = fresh_runner(mutant, text, _order(reached, Counter(), baseline.seconds))
        return payload, time.monotonic() - began

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for mutant, (payload, seconds) in zip(fresh, pool.map(one_fresh, fresh), strict=True):
            finish(mutant, payload, seconds, "fresh")
    return [results[m.id] for m in mutants if m.id in results]
