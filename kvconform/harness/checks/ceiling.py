"""``ceiling``: no group's table holds more than the contract allows (over-allocation).

The floor is a lower bound only: a table with a block too many passes it, and every
such block is one another request cannot have. The ceiling is the other side, from
the independent model of :mod:`kvconform.model.contract`: where the layout fixes the
count (token columns up to the largest reach since the request started, a
cross-attention group's encoder columns, a ring, a Mamba state spanning
``max_model_len``) the live side's table holds no column past it; where it does not,
a stated upper bound (a window's real blocks, Mamba "align"'s real states).

Judged on the live side only (the allocator, or vLLM's scheduler or engine that
decided the steps): the predictor and the recorded warmup size a dummy batch, whose
extra blocks cost nothing. A table *below* the exact count is the floor's to judge
(it names the positions without a block); between the floor and the count (a table
shortened after rejected drafts) no kernel misses a block, so neither check fails.

The reach uses the larger of the contract's lookahead and the one the parties were
told (``Trajectory.lookahead``, vLLM's ``num_lookahead_tokens`` or the scenario's
override): where they differ, check ``lookahead`` reports the cause and this check
does not repeat it. While a request's KV loads asynchronously it is the contract's
(0), as vLLM promises (``lookahead`` judges that step).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import PARTY_NAMES, blocks, failure_at, named
from kvconform.model.checks import Check, always
from kvconform.model.contract import allowance, ceiling_bound, token_span
from kvconform.model.floors import cdiv
from kvconform.model.observations import GroupInfo, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame

OVER_COLUMNS = "holds more columns than the largest reach since the request started"
OVER_REAL = "holds more real blocks than the layout reads"
# The cause of an OVER_COLUMNS failure that the lookahead counted past the end of a prefix
# hit adopted with SWA bounded replay explains (:func:`lookahead_past_replayed_hit`): the
# signature's suffix, so that a triaged bug of this shape (docs/findings.md #33,
# scenarios/explore-known.yaml) does not excuse any other over-allocation.
REPLAY_LOOKAHEAD = "the lookahead past a replayed prefix hit"


def find(trajectory: Trajectory) -> Iterator[Failure]:
    events = sorted(trajectory.events, key=lambda event: event.seq)
    next_event = 0
    # (request, group) -> the largest reach since the request (re)started; and the
    # tokens of its last steps (in flight under async scheduling).
    largest: dict[tuple[str, int], int] = {}
    previous: dict[tuple[str, int], list[int]] = {}
    told = trajectory.lookahead
    cap = trajectory.max_model_len
    depth = trajectory.steps_in_flight
    stated_in_flight = trajectory.in_flight_tokens
    async_loads = trajectory.async_loads
    encoder_lens = trajectory.encoder_lens
    null = trajectory.null_block
    replayed = replayed_hits(trajectory)
    bounds = [ceiling_bound(group) for group in trajectory.groups]
    for index, obs in enumerate(trajectory.observations):
        while next_event < len(events) and events[next_event].seq <= index:
            gone = events[next_event].request
            for key in [key for key in largest if key[0] == gone]:
                del largest[key]
                previous.pop(key, None)
            next_event += 1
        key = (obs.request, obs.group)
        lookahead = obs.lookahead if index in async_loads else max(obs.lookahead, told)
        written = obs.computed + obs.scheduled + lookahead
        if 0 < cap < written:
            written = cap
        most = largest.get(key, 0)
        if written > most:
            most = written
        if replayed:
            most = max(most, replayed.get((obs.step, obs.request), 0))
        largest[key] = most
        in_flight = stated_in_flight.get(index, 0) if stated_in_flight else 0
        if depth:
            earlier = previous.setdefault(key, [])
            in_flight = in_flight or sum(earlier[-depth:])
            earlier.append(obs.scheduled)
            del earlier[:-depth]
        bound = bounds[obs.group]
        if obs.live is None or bound is None:
            continue
        columns, real = bound(
            most, encoder_lens.get(obs.request, 0), obs.scheduled, lookahead, in_flight
        )
        if obs.live <= columns and (real is None or obs.block_ids is None):
            continue
        held_real = (
            len(obs.block_ids) - list(obs.block_ids).count(null) if obs.block_ids is not None else 0
        )
        if obs.live <= columns and (real is None or held_real <= real):
            continue
        group = trajectory.groups[obs.group]
        allowed = allowance(
            group,
            most,
            encoder_lens.get(obs.request, 0),
            obs.scheduled,
            lookahead,
            in_flight,
        )
        assert allowed is not None
        if obs.live > allowed.columns:
            how = "exactly" if allowed.exact else "at most"
            detail: dict[str, object] = {"invariant": OVER_COLUMNS, "allowed": allowed.columns}
            hit_end = replayed.get((obs.step, obs.request), 0) if replayed else 0
            past_hit = lookahead_past_replayed_hit(
                group, obs.live, hit_end, obs.computed + obs.scheduled, lookahead, cap
            )
            if past_hit:
                detail["cause"] = REPLAY_LOOKAHEAD
            yield failure_at(
                "ceiling",
                trajectory,
                obs,
                f"{PARTY_NAMES[Party.LIVE]} holds {blocks(obs.live)}, more than the "
                f"{allowed.columns} it needs ({how} {allowed.formula}; why: "
                f"{allowed.reason}): {blocks(obs.live - allowed.columns)} another request "
                "cannot have"
                + (
                    f" (as many as the {hit_end} positions of the replayed prefix hit and "
                    f"the {lookahead} lookahead positions past them give: the step's chunk ends inside "
                    "the replayed range, and its lookahead is counted from the hit's end)"
                    if past_hit
                    else ""
                ),
                detail,
                party=Party.LIVE,
            )
            continue
        assert allowed.real is not None
        yield failure_at(
            "ceiling",
            trajectory,
            obs,
            f"{PARTY_NAMES[Party.LIVE]} holds {held_real} real blocks, more than the "
            f"{allowed.real} its reads and writes span (why: {allowed.real_reason}): "
            f"{blocks(held_real - allowed.real)} that should be null and back in the pool",
            {"invariant": OVER_REAL, "allowed": allowed.real},
            party=Party.LIVE,
        )


def replayed_hits(trajectory: Trajectory) -> dict[tuple[int, str], int]:
    """(step, request) -> the most positions a prefix-cache hit it adopted with SWA
    bounded replay may cover.

    With bounded replay the scheduler counts only the hit less its replay as computed
    (``Request.replay_start``, recorded as the lowest position the step reads,
    ``Trajectory.read_bounds``) and recomputes the last ``prefix_replay_tokens`` (the
    window of the group that replays) of it; the table adopts the whole hit's blocks,
    which end at most the window past the replay's start.
    """
    hits: dict[tuple[int, str], int] = {}
    observations = trajectory.observations
    for index, start in trajectory.read_bounds.items():
        obs = observations[index]
        span = trajectory.groups[obs.group].read_span
        if span is None:
            continue
        key = (obs.step, obs.request)
        hits[key] = max(hits.get(key, 0), start + span[1])
    return hits


def lookahead_past_replayed_hit(
    group: GroupInfo, live: int, hit_end: int, scheduled_end: int, lookahead: int, cap: int
) -> bool:
    """Whether a token-column table of ``live`` columns, over the ceiling at the step that
    adopted a prefix hit ending at ``hit_end`` under SWA bounded replay, holds no more than
    the lookahead counted past the hit's end gives: ``max(hit_end, scheduled_end) +
    lookahead`` positions (capped at ``cap``), where the step writes only through
    ``scheduled_end + lookahead``. ``Scheduler.schedule`` hands ``allocate_slots`` the
    chunk less the replay (``num_tokens_past_hit``, 0 for a chunk that ends inside the
    replayed range) on top of the hit's tokens, and the whole lookahead on top of that
    (docs/findings.md #33). False off such a step, or for a family whose columns do not
    follow the tokens."""
    if not hit_end or hit_end <= scheduled_end:
        return False
    if group.floor_rule.family in ("encoder", "ring", "mamba-align", "mamba-state"):
        return False
    counted = max(hit_end, scheduled_end) + lookahead
    if 0 < cap < counted:
        counted = cap
    return live <= cdiv(counted, token_span(group))


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    invariant = (failure.detail or {}).get("invariant", OVER_COLUMNS)
    return Blame(named(result, Party.LIVE), invariant)


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(invariant, spec class); a failure whose cause is named (``detail["cause"]``:
    :data:`REPLAY_LOOKAHEAD`) splits by it, as sanity's signature does."""
    detail = failure.detail or {}
    invariant = str(detail.get("invariant", "-"))
    cause = detail.get("cause")
    return (f"{invariant}: {cause}" if cause else invariant), failure.spec_type or "-"


CHECK = Check(
    "ceiling",
    "no table holds more blocks than the contract allows (no over-allocation)",
    find,
    blame,
    signature,
    always(
        "a block past what the kernels read and write is one another request cannot "
        "have: over-allocation costs concurrency (kvconform.model.contract)"
    ),
)
