"""Coverage: which group types, methods and step kinds a run exercised, and what it missed.

A green run only means something for what it exercised. This module reads the
scenarios and the results of a run that already happened (it runs nothing) and
answers two questions:

* *What was exercised?* A set of (group type, speculative method, step kind)
  triples, each with the scenarios that exercised it. A scenario exercises its
  triples when the driver got through it (passed, failed, xfailed, xpassed); one
  that raised (``error``) only *attempted* its group types and method.
* *What does the installed vLLM offer that no scenario exercises?* Its
  ``KVCacheSpec`` classes, mapped to scenario group types through
  :mod:`kvconform.model.group_types`, and the speculative methods it declares.

Step kinds are the actions of the scenario format (prefill, decode, spec, preempt,
finish) plus situations derived from the recorded trajectory:

* ``rollback`` -- a spec step that rejected drafts (blocks stay held while the
  computed count goes back, which is where ``agree`` compares running maxima);
* ``max_model_len edge`` -- computed + scheduled + lookahead passes
  ``max_model_len``, so the cap in the floor and in the allocator binds;
* ``pool pressure`` -- at some step the live requests held at least
  :data:`PRESSURE` of the usable pool (the null block excluded);
* any other scenario kind (``warmup``) counts as a step kind of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kvconform.model.coverage import (
    EDGE,
    KIND_LETTERS,
    NO_METHOD,
    POOL_PRESSURE,
    PRESSURE,
    ROLLBACK,
    STEP_KINDS,
    Coverage,
    Offered,
    status_rank,
)
from kvconform.model.kinds import KINDS
from kvconform.model.observations import Trajectory
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Action, Scenario
from kvconform.model.settings import SettingsRecord
from kvconform.oracles.vllm import Vllm


def offered_by(vllm: Vllm) -> Offered:
    """Read what a loaded :class:`~kvconform.oracles.vllm.Vllm` offers."""
    return Offered(
        tuple(vllm.offered_spec_classes()),
        tuple(vllm.declared_methods()),
        dict(vllm.method_aliases()),
        vllm.version,
    )


# -- computing it -----------------------------------------------------------------------


def scenario_step_kinds(scenario: Scenario, trajectory: Trajectory | None) -> set[str]:
    """The step kinds one scenario went through (the derived ones need its trajectory)."""
    kinds: set[str] = set()
    if not KINDS[scenario.kind].states_steps:
        kinds.add(scenario.kind)  # its steps are vLLM's: the kind is the step kind
    for step in scenario.steps:
        for call in step.calls:
            kinds.add(call.action.value)
            if call.action is Action.SPEC and call.rejected:
                kinds.add(ROLLBACK)
    if trajectory is None:
        return kinds
    limit = trajectory.max_model_len or scenario.model.max_model_len
    if any(o.computed + o.scheduled + o.lookahead > limit for o in trajectory.observations):
        kinds.add(EDGE)
    if pool_peak(trajectory) >= PRESSURE * max(1, trajectory.num_blocks - 1):
        kinds.add(POOL_PRESSURE)
    return kinds


def pool_peak(trajectory: Trajectory) -> int:
    """The most distinct non-null blocks the live requests held at once, step by step."""
    tables: dict[tuple[str, int], tuple[int, ...]] = {}
    events = iter(trajectory.events)
    pending = next(events, None)
    peak = 0
    step = None

    def in_use() -> int:
        return len({b for ids in tables.values() for b in ids if b != trajectory.null_block})

    for seq, obs in enumerate(trajectory.observations):
        while pending is not None and pending.seq <= seq:
            tables = {k: v for k, v in tables.items() if k[0] != pending.request}
            pending = next(events, None)
        if step is not None and obs.step != step:
            peak = max(peak, in_use())
        step = obs.step
        tables[(obs.request, obs.group)] = tuple(obs.block_ids or ())
    return max(peak, in_use())


def compute_coverage(
    pairs: Iterable[tuple[Scenario, ScenarioResult]], offered: Offered | None = None
) -> Coverage:
    """Coverage of a run from its scenarios and their results (nothing is re-run)."""
    coverage = Coverage(offered=offered)
    for scenario, result in pairs:
        if result.error_kind is ErrorKind.INPUT:
            continue
        coverage.scenarios += 1
        if result.settings is not None:
            count_settings(coverage, result.settings)
        trajectory = result.trajectory
        if trajectory is not None and trajectory.method is not None:
            method = trajectory.method
        elif scenario.speculative is not None:
            method = scenario.speculative.method
            method = offered.canonical(method) if offered else method
        else:
            method = NO_METHOD
        types = dict.fromkeys(g.type for g in scenario.model.groups)
        if trajectory is None or result.verdict is Verdict.ERROR:
            for group_type in types:
                coverage.attempted[(group_type, method)].add(scenario.id)
            continue
        coverage.exercised += 1
        for kind in scenario_step_kinds(scenario, trajectory):
            for group_type in types:
                coverage.cells[(group_type, method, kind)].add(scenario.id)
    return coverage


def count_settings(coverage: Coverage, record: SettingsRecord) -> None:
    """Count one scenario under each setting's value; a value other than vLLM's
    default is shown with the default beside it."""
    for name, value in record.values.items():
        shown = json.dumps(value)
        if name in record.non_default:
            shown += f" (vLLM: {json.dumps(record.defaults.get(name))})"
        counts = coverage.settings[name]
        counts[shown] = counts.get(shown, 0) + 1


def pair_results(
    scenarios: Iterable[Scenario], results: Iterable[ScenarioResult]
) -> list[tuple[Scenario, ScenarioResult]]:
    """Match each result with the scenario it came from, by id."""
    by_id = {s.id: s for s in scenarios}
    return [(by_id[r.id], r) for r in results if r.id in by_id]


# -- the text view ----------------------------------------------------------------------


def render_text(coverage: Coverage) -> str:
    """The coverage matrix for a terminal: types x methods with step-kind letters."""
    out = [
        f"coverage: {coverage.exercised} of {coverage.scenarios} scenarios exercised "
        "(the rest errored before their first check)"
    ]
    types, methods = coverage.group_types(), coverage.methods()
    if types:
        legend = ", ".join(f"{KIND_LETTERS.get(k, '?')} {k}" for k in coverage.step_kinds())
        out.append(f"\ngroup type x method (step kinds: {legend}; ! attempted, errored)")
        width = max(len(t) for t in types)
        cols = [max(len(m), len(STEP_KINDS)) for m in methods]
        out.append(
            f"{'':{width}}  " + "  ".join(f"{m:{c}}" for m, c in zip(methods, cols, strict=True))
        )
        for t in types:
            cells = []
            for m, c in zip(methods, cols, strict=True):
                letters = "".join(KIND_LETTERS.get(k, "?") for k in coverage.kinds_for(t, m))
                if not letters and (t, m) in coverage.attempted:
                    letters = "!"
                cells.append(f"{letters or '.':{c}}")
            out.append(f"{t:{width}}  " + "  ".join(cells))
        out.append("\ngroup type x step kind (scenarios)")
        kinds = coverage.step_kinds()
        out.append(f"{'':{width}}  " + " ".join(f"{KIND_LETTERS.get(k, '?'):>4}" for k in kinds))
        for t in types:
            counts = [len(coverage.scenarios_for(t, k)) for k in kinds]
            out.append(f"{t:{width}}  " + " ".join(f"{n or '.':>4}" for n in counts))
    if coverage.offered is not None:
        out.append(f"\noffered by vLLM {coverage.offered.version}:")
        for item in sorted(coverage.offered_spec_classes(), key=status_rank):
            target = f" -> {item.group_type}" if item.group_type else ""
            note = f"  ({item.note})" if item.note else ""
            out.append(f"  {item.status.upper():10} {item.name}{target}{note}")
        variants = coverage.method_variants()
        for item in sorted(coverage.primary_methods(), key=status_rank):
            note = f"  ({item.note})" if item.note else ""
            more = variants.get(item.name)
            if more:
                note += f"  (+{len(more)} variants vLLM runs as {item.name}: {', '.join(more)})"
            out.append(f"  {item.status.upper():10} method {item.name}{note}")
    if coverage.settings:
        out.append(
            "\nsettings (scenarios per value; vLLM's default where a scenario states another)"
        )
        for name, values in sorted(coverage.settings.items()):
            shown = ", ".join(f"{value}: {count}" for value, count in sorted(values.items()))
            out.append(f"  {name:32} {shown}")
    gaps = coverage.gaps()
    out.append(f"\n{len(gaps)} gaps" + (":" if gaps else ""))
    out += [f"  - {gap}" for gap in gaps]
    return "\n".join(out)
