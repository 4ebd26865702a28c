"""Root-cause groups: a run's failure records gathered by party, check and shape of the miss.

A record is blamed on the party whose count is off: for ``floor`` the party
below the floor; for ``agree`` the one of the two that is below the floor, or,
where both hold at least the floor, the one that holds (or predicts) more. Its
*miss* is computed from the numbers the record carries (the counts, the floor,
the floor the same step would have without the lookahead, whether
``max_model_len`` capped it, the decode-context-parallel factor): "is below the
floor by exactly the lookahead", "holds more than the warmup predictor by one
block at the max_model_len cap", "is below the floor by the DCP factor", ...
The live side is the allocator in plain scenarios and vLLM's scheduler (or
engine) where that decided the steps (:data:`LIVE_PARTY_BY_KIND`).

Only failed scenarios' records are grouped: xfailed ones are known divergences,
and an errored scenario has no records.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvconform.model.floors import FLOORS, cdiv
from kvconform.model.groups import LIVE_PARTY_BY_KIND, PARTIES, FailureGroup, GroupScenario
from kvconform.model.results import Failure, ScenarioResult, Verdict

__all__ = ["CHECK_WHY", "blame", "group_failures", "never_below_floor"]

# Why each check that is not about one group type's floor holds, said once per group.
CHECK_WHY = {
    "agree": (
        "the warmup sizes the KV cache with the predictor's count, so the live allocator "
        "(and the recorded warmup) must hold what it predicts; after rejected drafts the "
        "comparison is with the running maximum, because blocks are not given back"
    ),
    "lookahead": (
        "every party reserves VllmConfig.num_lookahead_tokens slots past the scheduled "
        "tokens; it must cover every position the method's drafter writes"
    ),
    "sanity": "allocator invariants that hold whatever the floor: no block in two live "
    "requests' tables without prefix caching, everything back in the pool after finish or "
    "preempt, the null block only where the group type keeps placeholders",
    "slots": "vLLM's slot-mapping kernel does not bound the column index: a position past "
    "the held blocks is written into whatever the row holds there",
}


def _below_floor(held: int, floor: int, failure: Failure) -> str:
    """How a count below the floor falls short, from the numbers the record carries."""
    if failure.lookahead and held == failure.floor_without_lookahead:
        return "by exactly the lookahead"
    if failure.capped and floor - held == 1:
        return "by one block at the max_model_len cap"
    if failure.dcp > 1 and held == cdiv(floor, failure.dcp):
        return "by the DCP factor"
    return "by one block" if floor - held == 1 else "by several blocks"


def _over(larger: int, smaller: int, failure: Failure) -> str:
    """How much more one party holds than the other, both at or above the floor."""
    if failure.capped and larger - smaller == 1:
        return "by one block at the max_model_len cap"
    if failure.dcp > 1 and smaller == cdiv(larger, failure.dcp):
        return "by the DCP factor"
    return "by one block" if larger - smaller == 1 else "by several blocks"


def _count(failure: Failure, party: str) -> int | None:
    value = getattr(failure, party, None)
    return value if isinstance(value, int) else None


def blame(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """The party a record is blamed on (a key of :data:`PARTIES`) and its miss."""
    live = LIVE_PARTY_BY_KIND.get(result.kind, "live")

    def named(party: str | None) -> str:
        return live if party in (None, "live") else party

    detail = failure.detail or {}
    if failure.check == "floor" and failure.floor is not None:
        held = _count(failure, failure.party or "live")
        if held is not None:
            shape = _below_floor(held, failure.floor, failure)
            return named(failure.party), f"is below the floor {shape}"
    if failure.check == "agree" and failure.floor is not None:
        return _blame_agree(failure, named(failure.party), live, detail)
    if failure.check == "lookahead":
        return "config", _lookahead_miss(result)
    if failure.check == "sanity":
        return live, str(detail.get("invariant", "breaks an allocator invariant"))
    if failure.check == "slots":
        holder = PARTIES[named(detail.get("party"))].description
        return "slots", (
            f"maps {detail.get('role', 'written')} positions past the blocks {holder} holds "
            f"into {_landing(str(detail.get('whose', '')))}"
        )
    return named(failure.party), f"fails the {failure.check} check"


def _blame_agree(failure: Failure, held_party: str, live: str, detail: dict) -> tuple[str, str]:
    floor = failure.floor
    assert floor is not None
    held = _count(failure, failure.party or "live")
    if failure.party == "warmup" and "predicted_max" not in detail:
        reference, reference_party = failure.live, live  # no predictor: warmup against live
    else:
        reference, reference_party = detail.get("predicted_max", failure.predicted), "predicted"
    if held is None or reference is None:
        return held_party, "disagrees"
    held_name = PARTIES[held_party].description
    reference_name = PARTIES[reference_party].description
    verb = "predicts" if reference_party == "predicted" else "holds"
    if reference < floor:
        return reference_party, (
            f"{verb} fewer than {held_name} holds, below the floor "
            + _below_floor(reference, floor, failure)
        )
    if held < floor:
        return held_party, (
            f"holds fewer than {reference_name} {verb}, below the floor {_below_floor(held, floor, failure)}"
        )
    # Both hold at least the floor: the one holding more is blamed (the contract asks
    # for no more than the floor, so the other one is the closer to it).
    if held > reference:
        return held_party, f"holds more than {reference_name} {_over(held, reference, failure)}"
    return reference_party, f"{verb} more than {held_name} holds {_over(reference, held, failure)}"


def _lookahead_miss(result: ScenarioResult) -> str:
    run = result.trajectory
    if run is None or run.expected_lookahead is None:
        return "names a method kvconform's lookahead table lacks"
    if run.vllm_lookahead is not None and run.vllm_lookahead < run.expected_lookahead:
        return "reserves fewer lookahead slots than the drafter writes"
    return "reserves more lookahead slots than the drafter writes"


def _landing(whose: str) -> str:
    if "poison" in whose or "guard" in whose:
        return "no block"
    if "null block" in whose:
        return "the null block"
    if "of request" in whose:
        return "another request's block"
    return "a block no request holds"


def never_below_floor(results: Iterable[ScenarioResult]) -> list[str]:
    """The parties that took part in the run's scenarios and never fell below the floor.

    What a group does not say is as telling: "the live allocator never falls short"
    points a predictor's shortfall at the predictor.
    """
    took_part: dict[str, None] = {}
    short: set[str] = set()
    for result in results:
        run = result.trajectory
        if run is None:
            continue
        live = LIVE_PARTY_BY_KIND.get(result.kind, "live")
        for party in run.parties:
            took_part.setdefault(live if party == "live" else party)
        for failure in result.failures:
            if failure.check == "floor":
                short.add(live if failure.party in (None, "live") else failure.party)
    return [party for party in took_part if party not in short]


def group_failures(results: Iterable[ScenarioResult]) -> list[FailureGroup]:
    """The failed scenarios' records by party, check and miss, largest first."""
    groups: dict[tuple[str, str, str], FailureGroup] = {}
    per_scenario: dict[tuple[str, str, str], dict[str, GroupScenario]] = {}
    for result in results:
        if result.verdict is not Verdict.FAILED:
            continue
        run = result.trajectory
        method = (run.method if run is not None else None) or "none"
        for failure in result.failures:
            party, miss = blame(result, failure)
            key = (party, failure.check, miss)
            group = groups.get(key)
            if group is None:
                group = groups[key] = FailureGroup(failure.check, party, miss)
                per_scenario[key] = {}
            group.records += 1
            group_type = (
                run.groups[failure.group].type
                if run is not None and failure.group is not None
                else None
            )
            if group_type is not None and group_type not in group.group_types:
                group.group_types.append(group_type)
            if method not in group.methods:
                group.methods.append(method)
            seen = per_scenario[key]
            entry = seen.get(result.id)
            seen[result.id] = GroupScenario(
                result.id, result.file, result.line, (entry.records if entry else 0) + 1
            )
    for key, group in groups.items():
        group.scenarios = list(per_scenario[key].values())
        group.group_types.sort()
        group.methods.sort()
        group.why = _why(group)
    return sorted(groups.values(), key=lambda g: (-g.records, -len(g.scenarios), g.key))


def _why(group: FailureGroup) -> str:
    if group.check != "floor":
        return CHECK_WHY.get(group.check, "")
    reasons: dict[str, list[str]] = {}
    for group_type in group.group_types:
        rule = FLOORS.get(group_type)
        if rule is not None:
            reasons.setdefault(rule.reason, []).append(group_type)
    if len(reasons) == 1:
        return next(iter(reasons))
    return "; ".join(f"{', '.join(types)}: {reason}" for reason, types in reasons.items())
