"""``floor``: every party holds at least the reference floor of its group type.

The floor is the contract (:mod:`kvconform.model.floors`): for token-indexed
groups ``cdiv(min(computed + scheduled + lookahead, max_model_len),
block_size)``, the columns up to the last position the target or the drafter
writes; other group types have their own rule in their registry entry
(:mod:`kvconform.model.group_types`). A party below it lets a write land
outside the request's blocks: vLLM's slot-mapping kernel does not bound the
column index. The message says which positions have no block.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import (
    PARTY_NAMES,
    blocks,
    count,
    failure_at,
    named,
    shortfall,
)
from kvconform.model.checks import Check
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame, RootCause, describe_shortfalls


def find(trajectory: Trajectory) -> Iterator[Failure]:
    for obs in trajectory.observations:
        floor, live, predicted, warmup = obs.floor, obs.live, obs.predicted, obs.warmup
        # The common case, every party at or above the floor, without a loop.
        if (
            (live is None or live >= floor)
            and (predicted is None or predicted >= floor)
            and (warmup is None or warmup >= floor)
        ):
            continue
        for party in (Party.LIVE, Party.PREDICTED, Party.WARMUP):
            held = getattr(obs, party)
            if held is None or held >= obs.floor:
                continue
            group = trajectory.groups[obs.group]
            rule = group.floor_rule
            floor_input = group.floor_input(
                obs.computed,
                obs.scheduled,
                obs.lookahead,
                trajectory.encoder_lens.get(obs.request, 0),
            )
            consequence = ""
            if rule.counts_token_columns:
                per_block = group.block_size * floor_input.dcp_world_size
                consequence = "; " + uncovered_positions(
                    obs, held, per_block, trajectory.max_model_len
                )
            yield failure_at(
                "floor",
                trajectory,
                obs,
                f"{PARTY_NAMES[party]} holds {blocks(held)}, below the floor of "
                f"{obs.floor} = {rule.formula(floor_input)}{consequence} (why: {rule.reason})",
                party=party,
            )


def uncovered_positions(
    obs: Observation, held: int, columns_per_block: int, max_model_len: int
) -> str:
    """Which written positions have no block: the drafter's only, or the target's too."""
    covered = held * columns_per_block
    end = min(obs.computed + obs.scheduled + obs.lookahead, max_model_len) - 1
    if covered >= obs.computed + obs.scheduled:
        return f"the drafter's positions {covered}..{end} have no block"
    return f"positions {covered}..{end} have no block, the target's own among them"


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    """The party below the floor, and the shape of its shortfall: the cause the step's
    other records (the write outside its blocks, the disagreement) follow from."""
    party = named(result, failure.party)
    held = count(failure, failure.party or Party.LIVE)
    if failure.floor is None or held is None:
        return Blame(party, "fails the floor check")
    short = shortfall(held, failure.floor, failure)
    return Blame(party, describe_shortfalls([short])[1], short=short)


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(party, spec class): each spec class has its own allocator manager in vLLM; but
    the predictor is one function whose branches follow the floor rules, so a predictor
    shortfall is told apart by the rule's family, not the class."""
    party = failure.party or Party.LIVE
    if party == Party.PREDICTED:
        return party, floor_family(result, failure)
    return party, failure.spec_type or "-"


def floor_family(result: ScenarioResult, failure: Failure) -> str:
    """The family of the floor rule the failure's group falls under (FloorRule.family)."""
    trajectory = result.trajectory
    if trajectory is None or failure.group is None:
        return "-"
    return trajectory.groups[failure.group].floor_rule.family


def why(cause: RootCause) -> str:
    """The floor rules' reasons for the group types the root cause spans."""
    reasons: dict[str, list[str]] = {}
    for group_type in cause.group_types:
        reasons.setdefault(GROUP_TYPES[group_type].floor.reason, []).append(group_type)
    if len(reasons) == 1:
        return next(iter(reasons))
    return "; ".join(f"{', '.join(types)}: {reason}" for reason, types in reasons.items())


CHECK = Check(
    "floor",
    "every party holds at least the floor of its group type",
    find,
    blame,
    signature,
    why,
)
