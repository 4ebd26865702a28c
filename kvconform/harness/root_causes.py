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

from kvconform.harness.checks import CHECKS, floor
from kvconform.harness.checks.records import live_party
from kvconform.model.results import Failure, ScenarioResult, Verdict
from kvconform.model.root_causes import RootCause, RootCauseScenario

__all__ = ["blame", "find_root_causes", "never_below_floor"]


def blame(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """The party a record is blamed on (a key of ``PARTIES``) and its miss: its check's
    record says (``Check.blame``)."""
    return CHECKS[failure.check].blame(result, failure)


def never_below_floor(results: Iterable[ScenarioResult]) -> list[str]:
    """The parties that took part in the run's scenarios and never fell below the floor.

    What a group does not say is as telling: "the live allocator never falls short"
    points a predictor's shortfall at the predictor.
    """
    took_part: dict[str, None] = {}
    short: set[str] = set()
    for result in results:
        trajectory = result.trajectory
        if trajectory is None:
            continue
        live = live_party(result)
        for party in trajectory.parties:
            took_part.setdefault(live if party == "live" else party)
        for failure in result.failures:
            if failure.check == floor.CHECK.name:
                short.add(live if failure.party in (None, "live") else failure.party)
    return [party for party in took_part if party not in short]


def find_root_causes(results: Iterable[ScenarioResult]) -> list[RootCause]:
    """The failed scenarios' records by party, check and miss, largest first."""
    groups: dict[tuple[str, str, str], RootCause] = {}
    per_scenario: dict[tuple[str, str, str], dict[str, RootCauseScenario]] = {}
    for result in results:
        if result.verdict is not Verdict.FAILED:
            continue
        trajectory = result.trajectory
        method = (trajectory.method if trajectory is not None else None) or "none"
        for failure in result.failures:
            party, miss = blame(result, failure)
            key = (party, failure.check, miss)
            group = groups.get(key)
            if group is None:
                group = groups[key] = RootCause(failure.check, party, miss)
                per_scenario[key] = {}
            group.records += 1
            group_type = (
                trajectory.groups[failure.group].type
                if trajectory is not None and failure.group is not None
                else None
            )
            if group_type is not None and group_type not in group.group_types:
                group.group_types.append(group_type)
            if method not in group.methods:
                group.methods.append(method)
            seen = per_scenario[key]
            entry = seen.get(result.id)
            seen[result.id] = RootCauseScenario(
                result.id, result.file, result.line, (entry.records if entry else 0) + 1
            )
    for key, group in groups.items():
        group.scenarios = list(per_scenario[key].values())
        group.group_types.sort()
        group.methods.sort()
        group.why = CHECKS[group.check].why(group)
    return sorted(groups.values(), key=lambda g: (-g.records, -len(g.scenarios), g.key))
