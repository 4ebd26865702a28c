"""The coverage of a run, as data: what it exercised, and what the vLLM in use offers.

:mod:`kvconform.harness.coverage` computes it from a run's scenarios and results;
the reports and the run report hold it. See there for what the step kinds mean.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvconform.model.group_types import GROUP_TYPES, NOT_BUILDABLE, group_type_for_class
from kvconform.model.kinds import Kind

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
    Kind.WARMUP: "w",
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
    # setting -> its value as shown (non-default values marked) -> scenarios that ran
    # with it (kvconform.model.settings)
    settings: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))

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
            "settings": {name: dict(values) for name, values in self.settings.items()},
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


# What a reader should see first in the lists of what vLLM offers.
STATUS_ORDER = ("new", "uncovered", "attempted", "covered", "not built")


def status_rank(item: OfferedItem) -> int:
    return STATUS_ORDER.index(item.status)
