"""``agree``: the predictor and the live allocator (and the recorded warmup) hold alike.

vLLM's V2 warmup sizes its reservations with the predictor
``_reserved_block_count``, so the allocator must hold what it predicts. Blocks
are not returned when drafts are rejected, so the comparison is with the running
maximum of the prediction since the request last (re)started; in scheduler mode it starts,
for a request that loads its KV asynchronously, at the prediction for the loaded tokens (a
load that fails at a block under ``kv_load_failure_policy: recompute`` keeps the blocks it
was given while its computed count is cut to the valid prefix). Without a
predictor (a release before it existed) the recorded warmup and the live replay
of its steps must agree with each other.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.floor import floor_family
from kvconform.harness.checks.records import (
    PARTY_NAMES,
    above,
    below_floor,
    blocks,
    count,
    failure_at,
    live_party,
    named,
)
from kvconform.model.checks import Check, always
from kvconform.model.observations import Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import PARTIES, Blame


def find(trajectory: Trajectory) -> Iterator[Failure]:
    for obs in trajectory.observations:
        reference, live = obs.predicted_max, obs.live
        if obs.warmup is None and (live is None or live == reference):
            continue  # the common case: no recorded warmup, and live agrees or is absent
        if reference is None:
            # Without a predictor the recorded warmup and the live replay must agree.
            if obs.warmup is not None and obs.live is not None and obs.warmup != obs.live:
                yield failure_at(
                    "agree",
                    trajectory,
                    obs,
                    f"{PARTY_NAMES[Party.WARMUP]} holds {blocks(obs.warmup)} but "
                    f"{PARTY_NAMES[Party.LIVE]} holds {blocks(obs.live)} for the same steps",
                    party=Party.WARMUP,
                )
            continue
        for party in (Party.LIVE, Party.WARMUP):
            held = getattr(obs, party)
            if held is None or held == reference:
                continue
            rolled = (
                f" (running maximum; {obs.predicted} for this step alone)"
                if obs.predicted != reference
                else ""
            )
            yield failure_at(
                "agree",
                trajectory,
                obs,
                f"{PARTY_NAMES[party]} holds {blocks(held)} but {PARTY_NAMES[Party.PREDICTED]} "
                f"predicts {reference}{rolled} for {obs.computed} + {obs.scheduled} tokens with "
                f"lookahead {trajectory.lookahead}",
                {"predicted_max": reference},
                party=party,
            )


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    """The one of the two below the floor; where both hold at least the floor, the one
    holding (or predicting) more: the contract asks for no more than the floor.

    A disagreement where one side is below the floor follows from that side's
    shortfall (``follows``): the root causes fold it into the shortfall's group, so a
    predictor that merely disagrees with a short allocator is not a cause of its own.
    """
    held_party, live = named(result, failure.party), live_party(result)
    floor, detail = failure.floor, failure.detail or {}
    held = count(failure, failure.party or Party.LIVE)
    if failure.party == Party.WARMUP and "predicted_max" not in detail:
        reference, reference_party = failure.live, live  # no predictor: warmup against live
    else:
        reference, reference_party = detail.get("predicted_max", failure.predicted), Party.PREDICTED
    if floor is None or held is None or reference is None:
        return Blame(held_party, "disagrees")
    held_name = PARTIES[held_party].description
    reference_name = PARTIES[reference_party].description
    verb = "predicts" if reference_party == Party.PREDICTED else "holds"
    if reference < floor:
        return Blame(
            reference_party,
            f"{verb} fewer than {held_name} holds and " + below_floor(reference, floor, failure),
            follows=reference_party,
        )
    if held < floor:
        return Blame(
            held_party,
            f"holds fewer than {reference_name} {verb} and {below_floor(held, floor, failure)}",
            follows=held_party,
        )
    if held > reference:
        return Blame(
            held_party, f"holds more than {reference_name} {above(held, reference, failure)}"
        )
    # The predictor's running maximum above a holding at the floor: where the holder fell
    # short at an earlier step of the request, the maximum remembers that step.
    return Blame(
        reference_party,
        f"{verb} more than {held_name} holds {above(reference, held, failure)}",
        follows=held_party,
    )


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(floor family, which side holds more)."""
    reference = (failure.detail or {}).get("predicted_max", failure.predicted)
    side = "live above" if (failure.live or 0) > (reference or 0) else "live below"
    return floor_family(result, failure), side


CHECK = Check(
    "agree",
    "the warmup predictor and the live allocator (and the recorded warmup) hold alike",
    find,
    blame,
    signature,
    always(
        "the warmup sizes the KV cache with the predictor's count, so the live allocator "
        "(and the recorded warmup) must hold what it predicts; after rejected drafts the "
        "comparison is with the running maximum, because blocks are not given back"
    ),
)
