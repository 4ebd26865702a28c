"""Root-cause groups: the failure records of a run, gathered by who fell short and how.

One bug in vLLM fails many scenarios at many steps, and several checks see each of
those steps: the party below the floor (``floor``), the predictor it now disagrees
with (``agree``), the write that lands outside its blocks (``slots``). A
:class:`RootCause` gathers them as one: the records of one step, request and KV-cache
group that follow from one party's shortfall are folded into that shortfall's group
(the checks listed), and the shortfalls are gathered by the part of vLLM that falls
short (a party, and for the live side the manager class vLLM dispatched the group to)
and the exact *shape* of the miss, computed from the records' numbers
(:func:`describe_shortfalls`: "one position short", "short the whole lookahead", "one
block short"). Each check's record says how one of its records is blamed
(:class:`Blame`); :mod:`kvconform.harness.root_causes` builds the groups; the reports
show them, upstream causes first (:func:`rank_by_data_flow`), then the largest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvconform.model.parties import PARTIES, PartyCode, upstream_of


class Shortfall(NamedTuple):
    """What one record of a party below the floor says about the shape of its miss."""

    held: int
    floor: int
    lookahead: int
    # Written positions that have no block (groups whose floor counts token columns);
    # None where the floor counts something else (Mamba states, one ring block).
    uncovered: int | None = None
    # The target's own positions are among those without a block (not only the drafter's).
    target_short: bool = False
    # The party holds what the same step needs without the lookahead.
    without_lookahead: bool = False
    capped: bool = False
    # The party holds the floor divided by the decode-context-parallel factor.
    dcp_factor: bool = False


class Blame(NamedTuple):
    """How a check's record is blamed (``Check.blame``).

    ``party``: a :class:`~kvconform.model.parties.Party`; ``miss``: the shape of this one record.
    ``short``: set when the record is a party below the floor, the cause its step's other
    records follow from. ``follows``: for a record that is a consequence (a write outside
    the blocks, a disagreement), the party whose shortfall at the same step, request and
    group explains it; the record is folded into that shortfall's group when there is one.
    """

    party: str
    miss: str
    short: Shortfall | None = None
    follows: str | None = None


def describe_shortfalls(shorts: Sequence[Shortfall]) -> tuple[str, str]:
    """(a short key, the sentence) for the shape every one of ``shorts`` shares.

    Exact where the records allow it: "one position short" when every record leaves
    exactly one written position (the drafter's last) without a block, "short the whole
    lookahead" when every record holds what its step needs without the lookahead (and
    the records leave differing numbers of positions uncovered), else the blocks.
    """
    if not shorts:
        return "none", "falls short"
    gaps = {s.floor - s.held for s in shorts}
    one_block = gaps == {1}
    blocks = "one block" if one_block else "several blocks" if min(gaps) > 1 else "1 or more blocks"
    drafter_only = all(
        s.uncovered is not None and s.lookahead > 0 and not s.target_short for s in shorts
    )
    uncovered = sorted({s.uncovered for s in shorts if s.uncovered is not None})
    if drafter_only and uncovered == [1]:
        if {s.lookahead for s in shorts} == {1}:
            return "one-position", (
                "is one position short: the drafter's one position (the whole lookahead) "
                "has no block"
            )
        if all(s.without_lookahead for s in shorts):
            # Every record fits both: one slot too few, and the lookahead forgotten (a
            # lookahead that never crossed a block boundary by more than one position).
            return "one-position-or-lookahead", (
                "is one position short in every record, and holds what each step needs "
                "without the lookahead in every record: these records cannot tell one slot "
                "too few from the whole lookahead forgotten"
            )
        return "one-position", (
            "is one position short in every record: the last position the drafter "
            "writes has no block"
        )
    if all(s.lookahead > 0 and s.without_lookahead for s in shorts):
        return "whole-lookahead", (
            "is short the whole lookahead: it holds what each step needs without the "
            "drafter's positions"
        )
    if drafter_only:
        low, high = uncovered[0], uncovered[-1]
        if low == high:
            return f"{low}-positions", (
                f"is {low} positions short: the drafter's last {low} positions have no block"
            )
        return "drafter-positions", (
            f"is {low} to {high} of the drafter's positions short ({blocks} below the floor)"
        )
    if all(s.capped for s in shorts) and one_block:
        return "cap", "is one block short at the max_model_len cap"
    if all(s.dcp_factor for s in shorts):
        return "dcp", "is short by the DCP factor (the floor divided by dcp_world_size)"
    if all(s.uncovered is not None and s.target_short for s in shorts):
        return f"target-{blocks}", (
            f"is {blocks} short, the target's own positions among those without a block"
        )
    return blocks, f"is {blocks} below the floor"


def rank_by_data_flow(causes: Sequence[RootCause]) -> list[RootCause]:
    """``causes`` (in the order of their size, largest first) with every cause placed above
    the causes whose party reads it: a config property, or the pool the startup planning
    sized, before the allocator and the predictor that consume it; the allocator before the
    slot mapping that reads its block tables.

    A topological order over :func:`upstream_of`, stable: at each place the first remaining
    cause (by the order given) that no remaining cause is upstream of. Causes whose
    parties do not read one another keep the order given.
    """
    remaining = list(causes)
    ranked: list[RootCause] = []
    while remaining:
        parties = {c.party for c in remaining}
        free = [c for c in remaining if not upstream_of(c.party) & (parties - {c.party})]
        # None free only if PartyCode.reads had a cycle (it has none): keep the given order.
        first = free[0] if free else remaining[0]
        ranked.append(remaining.pop(next(i for i, c in enumerate(remaining) if c is first)))
    return ranked


@dataclass(frozen=True)
class RootCauseScenario:
    """One scenario of a group: where it is and how many of the group's records it has."""

    id: str
    file: str
    line: int | None
    records: int
    # Indices into the scenario's failures of the records in this group.
    failures: tuple[int, ...] = ()


@dataclass
class RootCause:
    """The records of one cause: who falls short where in vLLM, how, and what it spans."""

    check: str  # the leading check: the cause's own (floor for a shortfall)
    party: str
    miss: str
    records: int = 0
    group_types: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    scenarios: list[RootCauseScenario] = field(default_factory=list)
    # The floor rule's reason (or the check's), said once for the whole group.
    why: str = ""
    # Every check whose records the group holds, the leading one first, with their counts.
    checks: dict[str, int] = field(default_factory=dict)
    # What in vLLM is named, where it is narrower than the party's own function: the
    # manager class vLLM dispatched the group's KV-cache groups to (SlidingWindowManager).
    function: str | None = None
    file: str | None = None
    # (manager class, file) vLLM dispatched the group's records' KV-cache groups to.
    managers: list[tuple[str, str]] = field(default_factory=list)
    # Only consequences (writes outside the blocks, disagreements) with no shortfall of
    # their own at the same step: ranked below the causes.
    consequence: bool = False

    @property
    def key(self) -> str:
        """A stable name for the group: what the HTML filter and anchors use."""
        return f"{self.party}/{self.vllm_function}/{self.check}/{self.miss}"

    @property
    def vllm(self) -> PartyCode:
        return PARTIES[self.party]

    @property
    def vllm_function(self) -> str:
        return self.function or self.vllm.function

    @property
    def vllm_file(self) -> str:
        return self.file or self.vllm.file

    @property
    def check_names(self) -> list[str]:
        return list(self.checks) or [self.check]

    def where(self) -> str:
        """Who falls short, in vLLM's words: "the live allocator's SlidingWindowManager
        (vllm/v1/core/single_type_kv_cache_manager.py)", or the party's function with the
        managers it dispatched to."""
        party = self.vllm
        if self.function is not None:
            return f"{party.description}'s {self.function} ({self.vllm_file})"
        via = ""
        if self.managers:
            via = ", dispatching to " + ", ".join(name for name, _ in self.managers)
        return f"{party.description} {party.function} ({party.file}{via})"

    @property
    def representative(self) -> RootCauseScenario:
        """The scenario with the most records of this group (the first one on a tie)."""
        return max(self.scenarios, key=lambda s: s.records)

    def sentence(self) -> str:
        """One line: the counts, who, what, and where in vLLM, and the checks that saw it."""
        scenarios = len(self.scenarios)
        return (
            f"{self.records:,} record{'s' if self.records != 1 else ''}, {scenarios} "
            f"scenario{'s' if scenarios != 1 else ''}: {self.where()} {self.miss} "
            f"[{', '.join(self.check_names)}]"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "checks": dict(self.checks) or {self.check: self.records},
            "party": self.party,
            "miss": self.miss,
            "records": self.records,
            "consequence": self.consequence,
            "group_types": list(self.group_types),
            "methods": list(self.methods),
            "scenarios": [s.id for s in self.scenarios],
            "representative": self.representative.id,
            "vllm_function": self.vllm_function,
            "vllm_file": self.vllm_file,
            "vllm_managers": [{"class": name, "file": file} for name, file in self.managers],
        }
