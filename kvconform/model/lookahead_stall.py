"""A running prefill that ``Scheduler._reserve_prefill_lookahead`` cuts to nothing at every
call (docs/findings.md #26, its running form), read from a ``schedule()`` call's queues for
the liveness family, which names the cause of the empty call it fails."""

from __future__ import annotations

from kvconform.model.observations import request_token_budget
from kvconform.model.queue_facts import QueuedRequest, StepQueues, lookahead_cuts_to_nothing

__all__ = ["lookahead_stuck_cap"]


def lookahead_stuck_cap(request: QueuedRequest, queues: StepQueues) -> int:
    """The chunk cap (tokens) below the ``R`` prompt tokens a running, not held back
    ``request`` has left, with ``R`` within the drafter's prefill lookahead, so that
    :func:`lookahead_cuts_to_nothing` holds at every call; 0 where it does not.

    The cap as the call recorded it (chunked prefill or not: up to 0.33.0 the threshold
    caps a chunk with it off too, and the running loop's budget caps one either way): the
    request's token budget
    (``min(max_num_scheduled_tokens, max_num_batched_tokens - draft slots)``) and the
    long-prefill threshold in force (``StepQueues.chunk_cap``, 0 for none), and under Mamba
    "align"'s split the split's chunk the oracle recorded (``HoldFacts.chunk_cap``). The scheduler
    oracle reads the same cap from vLLM (``prefill_chunk_cap`` in
    ``kvconform.oracles.vllm.scheduling_queues``, ``HoldFacts.chunk_cap``), with which
    :func:`~kvconform.model.queue_facts.held_back` withholds the "prefill lookahead window"
    excuse from such a request."""
    if request.held_back or queues.prefill_shift <= 1:
        return 0
    left = request.tokens - request.computed
    cap = request_token_budget(queues)
    if queues.chunk_cap:
        cap = min(cap, queues.chunk_cap)
    if request.hold.mamba_split and request.hold.chunk_cap:
        # Mamba "align"'s split, which vLLM applies before the reservation, may stop the
        # chunk sooner (at the block's end): the cap the oracle read with it.
        cap = min(cap, request.hold.chunk_cap)
    return cap if lookahead_cuts_to_nothing(left, cap, queues.prefill_shift) else 0
