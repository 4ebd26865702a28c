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
  :mod:`kvconform.oracles.group_types`, and the speculative methods it declares.

Step kinds are the actions of DESIGN §4 (prefill, decode, spec, preempt,
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

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvconform.harness.observations import Trajectory
from kvconform.harness.results import ErrorKind, ScenarioResult, Verdict
from kvconform.harness.scenario import Action, Scenario
from kvconform.oracles.group_types import GROUP_TYPES, NOT_BUILDABLE, group_type_for_class

NO_METHOD = "none"
PRESSURE = 0.9
EDGE = "max_model_len edge"
ROLLBACK = "rollback"
POOL_PRESSURE = "pool pressure"
STEP_KINDS: tuple[str, ...] = (
    "prefill",
    "decode",
    "spec",
    ROLLBACK,
    "preempt",
    "finish",
    EDGE,
    POOL_PRESSURE,
)
# One letter per step kind, for the compact matrix of the text and HTML views.
KIND_LETTERS: dict[str, str] = {
    "prefill": "p",
    "decode": "d",
    "spec": "s",
    ROLLBACK: "r",
    "preempt": "x",
    "finish": "f",
    EDGE: "e",
    POOL_PRESSURE: "m",
    "warmup": "w",
}


@dataclass(frozen=True)
class Offered:
    """What the installed vLLM offers: its spec classes and speculative methods."""

    spec_classes: tuple[str, ...]
    methods: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)
    version: str | None = None

    def canonical(self, method: str) -> str:
        return self.aliases.get(method, method)


def offered_by(vllm: Any) -> Offered:
    """Read what a loaded :class:`~kvconform.oracles.vllm_compat.Vllm` offers."""
    return Offered(
        tuple(vllm.offered_spec_classes()),
        tuple(vllm.declared_methods()),
        dict(vllm.method_aliases()),
        vllm.version,
    )


@dataclass(frozen=True)
class OfferedItem:
    """One thing vLLM offers and whether the run covered it."""

    name: str
    status: str  # covered | uncovered | attempted | not built | new
    group_type: str | None = None
    note: str = ""
    alias_of: str | None = None  # a method vLLM rewrites to another (MTP variants)


@dataclass
class Coverage:
    # (group type, method, step kind) -> ids of the scenarios that exercised it
    cells: dict[tuple[str, str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    # (group type, method) -> ids of the scenarios that errored before exercising it
    attempted: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    scenarios: int = 0
    exercised: int = 0
    offered: Offered | None = None

    # -- views ------------------------------------------------------------------------

    def group_types(self) -> list[str]:
        seen = {t for t, _, _ in self.cells} | {t for t, _ in self.attempted}
        return [t for t in GROUP_TYPES if t in seen] + sorted(seen - set(GROUP_TYPES))

    def methods(self) -> list[str]:
        seen = {m for _, m, _ in self.cells} | {m for _, m in self.attempted}
        order = list(self.offered.methods) if self.offered else []
        first = [NO_METHOD] if NO_METHOD in seen else []
        known = [m for m in dict.fromkeys(order) if m in seen and m != NO_METHOD]
        return first + known + sorted(seen - set(first) - set(known))

    def step_kinds(self) -> list[str]:
        seen = {k for _, _, k in self.cells}
        return list(STEP_KINDS) + sorted(seen - set(STEP_KINDS))

    def kinds_for(self, group_type: str, method: str) -> list[str]:
        return [k for k in self.step_kinds() if (group_type, method, k) in self.cells]

    def scenarios_for(self, group_type: str, kind: str) -> set[str]:
        ids: set[str] = set()
        for (t, _, k), found in self.cells.items():
            if t == group_type and k == kind:
                ids |= found
        return ids

    def exercised_types(self) -> set[str]:
        return {t for t, _, _ in self.cells}

    def exercised_methods(self) -> set[str]:
        return {m for _, m, _ in self.cells}

    def offered_spec_classes(self) -> list[OfferedItem]:
        if self.offered is None:
            return []
        exercised = self.exercised_types()
        attempted = {t for t, _ in self.attempted}
        items = []
        for name in self.offered.spec_classes:
            group_type = group_type_for_class(name)
            if group_type is None:
                if name in NOT_BUILDABLE:
                    items.append(OfferedItem(name, "not built", None, NOT_BUILDABLE[name]))
                else:
                    items.append(
                        OfferedItem(name, "new", None, "kvconform has no group type for it")
                    )
            elif group_type.name in exercised:
                items.append(OfferedItem(name, "covered", group_type.name))
            elif group_type.name in attempted:
                items.append(
                    OfferedItem(
                        name,
                        "attempted",
                        group_type.name,
                        "every scenario with this group type errored",
                    )
                )
            else:
                items.append(
                    OfferedItem(name, "uncovered", group_type.name, "no scenario uses this type")
                )
        return items

    def offered_methods(self) -> list[OfferedItem]:
        """Every method vLLM declares; a variant vLLM runs as another (``alias_of``) shares
        the status of that method."""
        if self.offered is None:
            return []
        exercised = self.exercised_methods()
        attempted = {m for _, m in self.attempted}
        items = []
        for method in dict.fromkeys(self.offered.methods):
            canonical = self.offered.canonical(method)
            alias_of = canonical if canonical != method else None
            runs_as = f"vLLM runs it as {canonical}" if alias_of else ""
            if method in exercised or canonical in exercised:
                items.append(OfferedItem(method, "covered", note=runs_as, alias_of=alias_of))
            elif method in attempted or canonical in attempted:
                note = runs_as or "every scenario with it errored"
                items.append(OfferedItem(method, "attempted", note=note, alias_of=alias_of))
            else:
                note = runs_as or "no scenario uses it"
                items.append(OfferedItem(method, "uncovered", note=note, alias_of=alias_of))
        return items

    def method_variants(self) -> dict[str, list[str]]:
        """Declared methods that vLLM runs as another declared method, by that method."""
        declared = set(self.offered.methods) if self.offered else set()
        variants: dict[str, list[str]] = defaultdict(list)
        for item in self.offered_methods():
            if item.alias_of is not None and item.alias_of in declared:
                variants[item.alias_of].append(item.name)
        return dict(variants)

    def primary_methods(self) -> list[OfferedItem]:
        """The offered methods without the variants of another declared method."""
        hidden = {name for names in self.method_variants().values() for name in names}
        return [item for item in self.offered_methods() if item.name not in hidden]

    def gaps(self) -> list[str]:
        """One sentence per thing a reader should know is not exercised."""
        lines = [
            f"vLLM spec class {item.name} ({item.group_type or 'no group type'}): {item.note}"
            for item in self.offered_spec_classes()
            if item.status in ("uncovered", "attempted", "new")
        ]
        variants = self.method_variants()
        for item in self.primary_methods():
            if item.status in ("uncovered", "attempted"):
                more = variants.get(item.name, [])
                also = f" (nor its {len(more)} variants vLLM runs as {item.name})" if more else ""
                lines.append(f"speculative method {item.name}: {item.note}{also}")
        for group_type in self.group_types():
            missing = [k for k in STEP_KINDS if not self.scenarios_for(group_type, k)]
            if group_type in self.exercised_types() and missing:
                lines.append(f"group type {group_type} never sees: {', '.join(missing)}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "scenarios": self.scenarios,
            "exercised": self.exercised,
            "step_kinds": self.step_kinds(),
            "group_types": {
                t: {
                    "methods": {
                        m: self.kinds_for(t, m) for m in self.methods() if self.kinds_for(t, m)
                    },
                    "step_kinds": {
                        k: len(self.scenarios_for(t, k))
                        for k in self.step_kinds()
                        if self.scenarios_for(t, k)
                    },
                }
                for t in self.group_types()
                if t in self.exercised_types()
            },
            "attempted": [
                {"group_type": t, "method": m, "scenarios": sorted(ids)}
                for (t, m), ids in sorted(self.attempted.items())
            ],
            "offered": None
            if self.offered is None
            else {
                "vllm": self.offered.version,
                "spec_classes": [_item_json(i) for i in self.offered_spec_classes()],
                "methods": [_item_json(i) for i in self.offered_methods()],
            },
            "gaps": self.gaps(),
        }


def _item_json(item: OfferedItem) -> dict[str, Any]:
    return {
        "name": item.name,
        "status": item.status,
        "group_type": item.group_type,
        "note": item.note,
        "alias_of": item.alias_of,
    }


# -- computing it -----------------------------------------------------------------------


def scenario_step_kinds(scenario: Scenario, run: Trajectory | None) -> set[str]:
    """The step kinds one scenario went through (the derived ones need its trajectory)."""
    kinds: set[str] = set()
    if scenario.kind != "trajectory":
        kinds.add(scenario.kind)
    for step in scenario.steps:
        for call in step.calls:
            kinds.add(call.action.value)
            if call.action is Action.SPEC and call.rejected:
                kinds.add(ROLLBACK)
    if run is None:
        return kinds
    limit = run.max_model_len or scenario.model.max_model_len
    if any(o.computed + o.scheduled + o.lookahead > limit for o in run.observations):
        kinds.add(EDGE)
    if pool_peak(run) >= PRESSURE * max(1, run.num_blocks - 1):
        kinds.add(POOL_PRESSURE)
    return kinds


def pool_peak(run: Trajectory) -> int:
    """The most distinct non-null blocks the live requests held at once, step by step."""
    tables: dict[tuple[str, int], tuple[int, ...]] = {}
    events = iter(run.events)
    pending = next(events, None)
    peak = 0
    step = None

    def in_use() -> int:
        return len({b for ids in tables.values() for b in ids if b != run.null_block})

    for seq, obs in enumerate(run.observations):
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
        run = result.trajectory
        if run is not None and run.method is not None:
            method = run.method
        elif scenario.speculative is not None:
            method = scenario.speculative.method
            method = offered.canonical(method) if offered else method
        else:
            method = NO_METHOD
        types = dict.fromkeys(g.type for g in scenario.model.groups)
        if run is None or result.verdict is Verdict.ERROR:
            for group_type in types:
                coverage.attempted[(group_type, method)].add(scenario.id)
            continue
        coverage.exercised += 1
        for kind in scenario_step_kinds(scenario, run):
            for group_type in types:
                coverage.cells[(group_type, method, kind)].add(scenario.id)
    return coverage


def pair_results(
    scenarios: Iterable[Scenario], results: Iterable[ScenarioResult]
) -> list[tuple[Scenario, ScenarioResult]]:
    """Match each result with the scenario it came from, by id."""
    by_id = {s.id: s for s in scenarios}
    return [(by_id[r.id], r) for r in results if r.id in by_id]


# -- the text view ----------------------------------------------------------------------

# What a reader should see first in the lists of what vLLM offers.
STATUS_ORDER = ("new", "uncovered", "attempted", "covered", "not built")


def status_rank(item: OfferedItem) -> int:
    return STATUS_ORDER.index(item.status)


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
    gaps = coverage.gaps()
    out.append(f"\n{len(gaps)} gaps" + (":" if gaps else ""))
    out += [f"  - {gap}" for gap in gaps]
    return "\n".join(out)
