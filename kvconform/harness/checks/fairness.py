"""``sanity``, the fairness family: vLLM's scheduler serves requests in its policy's order.

Judged on each ``schedule()`` call's queues (:class:`~kvconform.model.queue_facts.StepQueues`).
The order is the policy's: FCFS, the order the engine handed the requests to the
scheduler; priority, ``(priority, Request.arrival_time)``, lower first. A request held
back for a listed reason (``QueuedRequest.held_back``; docs/contract.md, "Liveness and
fairness") may be passed over; no other may:

* **no passing.** A waiting request admitted in a call (scheduled tokens, holding no KV
  before it: vLLM drains requests that hold KV, a finished KV load or a session's next
  turn, first) is not later in the order than a waiting request left unscheduled that
  could have taken its place: the earlier one's next chunk (all its tokens without
  chunked prefill; its whole sequence under full-sequence admission) within the token
  budget left plus the admitted request's tokens, and its blocks (the floor's upper
  bound, less what it holds) within the free blocks after the call plus those the
  admitted request took, less the admission watermark.
* **no running request skipped.** In a call with no preemption, a running request with
  tokens to compute that is not held back (one whose next token comes with a step still
  in flight, or whose last token is in flight, is) is scheduled when the
  budget left after the call has a token for it and the free blocks (less the
  watermark) hold its blocks for one more token (a call that schedules nothing at all
  is the liveness family's progress rule): ``schedule()`` walks its running
  requests in order and stops only when the budget is spent or a request cannot get
  blocks, where it preempts.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.liveness import (
    asked_blocks,
    blocks_for,
    lookahead_note,
    mamba_note,
    next_tokens,
    row_of,
)
from kvconform.harness.checks.records import at_request, fact_failure, facts_of
from kvconform.model.facts import Fact
from kvconform.model.observations import (
    MAMBA_BLOCK_PAST_BUDGET,
    PREFILL_LOOKAHEAD_PAST_CAP,
    Trajectory,
)
from kvconform.model.queue_facts import QueuedRequest, StepQueues
from kvconform.model.results import Failure

PASSED = "admits a later request ahead of an earlier one that fits"
SKIPPED = "skips a running request the budget and blocks allow"
# A running prefill that _reserve_prefill_lookahead cuts to nothing at every call (#26's
# running form) is skipped beside requests that progress: named, as the liveness family names
# its empty calls, so that the explorer's triage of #26 covers it and no other skip.
SKIPPED_LOOKAHEAD = f"{SKIPPED}: {PREFILL_LOOKAHEAD_PAST_CAP}"
# The same for a running prefill whose every chunk Mamba "align"'s split floors to nothing
# (#28's running form).
SKIPPED_MAMBA = f"{SKIPPED}: {MAMBA_BLOCK_PAST_BUDGET}"


def order(policy: str, request: QueuedRequest) -> tuple[int, ...]:
    """The policy's order: FCFS by arrival at the scheduler, priority by (priority,
    arrival_time)."""
    if policy == "priority":
        return (request.priority, request.stamp)
    return (request.added,)


def _budget_left(queues: StepQueues) -> int:
    """The tokens a further request could still get in the call (``schedule()``'s
    ``min(token_budget, input_budget - draft_slots)``)."""
    tokens = sum(t for t, _, _ in queues.scheduled.values())
    inputs = sum(t + queues.draft_slots for t, _, _ in queues.scheduled.values())
    return min(queues.token_budget - tokens, queues.input_budget - inputs - queues.draft_slots)


def _passing(
    trajectory: Trajectory, index: int, fact: Fact, queues: StepQueues
) -> Iterator[tuple[int, Failure]]:
    if queues.paused:
        return
    left = _budget_left(queues)
    scheduled = queues.scheduled
    admitted = [
        r
        for r in queues.waiting
        if scheduled.get(r.request, (0, 0, 0))[0] and not r.held and not r.held_back
    ]
    reported: set[str] = set()
    for late in admitted:
        tokens, held_after, _ = scheduled[late.request]
        for early in queues.waiting:
            if (
                early.request in scheduled
                or early.held_back
                or early.request in reported
                or order(queues.policy, early) >= order(queues.policy, late)
            ):
                continue
            remaining = early.tokens - early.computed
            budget = left + tokens
            if remaining <= 0 or (not queues.chunked_prefill and remaining > budget):
                continue
            chunk = min(remaining, budget)
            reserved = remaining if queues.reserve_full else chunk
            need = blocks_for(trajectory, early, reserved) - early.held
            room = queues.free_after + held_after - late.held - queues.watermark
            if need > room:
                continue
            reported.add(early.request)
            yield (
                index,
                fact_failure(
                    at_request(trajectory, fact, early.request),
                    f"left waiting while {late.request}, later in the {queues.policy} order, was "
                    f"admitted with {tokens} tokens; in its place it fits: {chunk} tokens of the "
                    f"{budget} the budget had, {need} blocks of the {room} free",
                    PASSED,
                ),
            )


def _skipping(
    trajectory: Trajectory, index: int, fact: Fact, queues: StepQueues
) -> Iterator[tuple[int, Failure]]:
    if queues.preempted or _budget_left(queues) < 1:
        return
    if not any(tokens for tokens, _, _ in queues.scheduled.values()):
        return  # a call that schedules nothing is the liveness family's (progress)
    room = queues.free_after - queues.watermark
    for request in queues.running:
        if request.held_back or request.request in queues.scheduled:
            continue
        if request.tokens - request.computed <= 0:
            continue
        need = blocks_for(trajectory, request, 1) - request.held
        if need > room:
            continue
        if any(r.frees_deferred for r in queues.running):
            # vLLM asks blocks for the request's whole next chunk or row (next_tokens), and
            # where they do not fit and the victim's step is in flight it gives up the call
            # rather than preempt (_request_blocks_can_be_freed): the rest of the running
            # queue is passed over legitimately.
            tokens = next_tokens(request, queues, row_of(trajectory), _budget_left(queues))
            if asked_blocks(trajectory, request, tokens) > room:
                continue
        cause = lookahead_note(request, queues)
        invariant = SKIPPED_LOOKAHEAD if cause else SKIPPED
        if not cause:
            cause = mamba_note(request)
            invariant = SKIPPED_MAMBA if cause else SKIPPED
        yield (
            index,
            fact_failure(
                at_request(trajectory, fact, request.request),
                f"running, with {request.tokens - request.computed} token(s) to compute, but not "
                f"scheduled, while the budget had {_budget_left(queues)} token(s) left and "
                f"{room} free block(s) (it needs {max(need, 0)}) and nothing was preempted" + cause,
                invariant,
            ),
        )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the fairness family, in recording order."""
    for index, fact in facts_of(trajectory, StepQueues):
        queues = fact.what
        assert isinstance(queues, StepQueues)
        yield from _passing(trajectory, index, fact, queues)
        yield from _skipping(trajectory, index, fact, queues)
