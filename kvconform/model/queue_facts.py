"""What a ``schedule()`` call found in vLLM's queues, as facts: each request's place and
state, the facts that decide whether the coming step may pass it over (:class:`HoldFacts`)
and the pure rule that decides it (:func:`held_back`), the multimodal input it waits at and
the encoder's room. Recorded by the scheduler oracle
(:mod:`kvconform.oracles.scheduler.queues`), judged by the liveness and fairness families
(:mod:`kvconform.harness.checks.liveness`, :mod:`kvconform.harness.checks.fairness`); part of
the payloads of :mod:`kvconform.model.facts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# The reason ``QueuedRequest.held_back`` records for a request with a multimodal input ahead
# (its placeholder not computed past): ``_try_schedule_encoder_inputs`` may cut its tokens
# to 0. Whether that excuses a call is the liveness family's to judge
# (``kvconform/harness/checks/liveness.py``, with :class:`PendingInput`).
ENCODER_HELD_BACK = "the encoder budget or cache"


# The reason a request waiting for something outside the scheduler is recorded with, by
# vLLM's status name (``RequestStatus``); a status of this family not listed is its own name.
WAITING_FOR_REASONS: Mapping[str, str] = {
    "WAITING_FOR_REMOTE_KVS": "its KV load is in flight",
    "WAITING_FOR_FSM": "its structured-output grammar is not compiled",
    "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": "its structured-output grammar is not compiled",
    "WAITING_FOR_STREAMING_REQ": "its session waits for input",
}


def lookahead_cuts_to_nothing(left: int, cap: int, lookahead: int) -> bool:
    """Whether ``Scheduler._reserve_prefill_lookahead`` cuts every chunk of a request with
    ``left`` prompt tokens to compute, whose chunks are capped at ``cap`` tokens, to nothing.

    Read from the method: a chunk of ``n`` tokens that would leave ``0 < left - n <
    lookahead`` is cut by ``lookahead - (left - n)``, to ``left - lookahead`` ("Either
    finish the prefill or leave at least num_prefill_lookahead for the next chunk"). A
    chunk that finishes the prompt (``cap >= left``) is not cut; one that leaves the
    lookahead or more is not cut; with ``left > lookahead`` the cut leaves ``left -
    lookahead > 0`` tokens, progress. Only ``cap < left <= lookahead`` leaves nothing, and
    no call changes that: the request's cap is what it gets with the whole budget free.
    """
    return 0 < cap < left <= lookahead


def block_split_cuts_to_nothing(
    start: int, chunk: int, prefill_left: int, block: int, split_limit: int
) -> bool:
    """Whether Mamba "align"'s block-aligned split (``Scheduler._mamba_block_aligned_split``)
    cuts every chunk of a request at ``start`` to nothing: its chunk of ``chunk`` tokens with
    the whole budget free (the request's token budget, ``min(max_num_scheduled_tokens,
    max_num_batched_tokens - draft slots)``, and the long-prefill threshold in force), with
    ``prefill_left`` tokens to the prefill's end, in Mamba blocks of ``block`` tokens.

    Read from the method: a chunk that ends short of the prefill's end ends on a block
    boundary, floored (``end // block * block``), unless the floor does not pass ``start``
    and the block is wider than the split's limit (``split_limit``: ``max_num_scheduled_tokens``,
    or the configured long-prefill threshold below it): "A block too wide for one chunk
    advances sub-block". The split's other stops only shorten a chunk. So a chunk that
    finishes the prefill is kept; one that reaches a boundary past ``start`` keeps what
    precedes it; one that reaches none is cut to nothing where the block is within the limit.
    The limit is not the request's budget: the draft slots a drafter takes of the batch
    (``draft_model``: 1) leave a request less than ``max_num_scheduled_tokens``, so a block
    within the limit can be wider than every chunk the request gets (docs/findings.md #28).
    No call changes that: ``chunk`` is what the request gets with the whole budget free.
    """
    if not 0 < chunk < prefill_left:
        return False
    return (start + chunk) // block * block <= start and block <= split_limit


def arrived_loads_held_behind(need: int, available: int, arrived_held: Sequence[int]) -> bool:
    """Whether a stalled head-of-line request that needs ``need`` blocks, with ``available``
    to give, is held by requests queued behind it whose KV loads have arrived
    (``arrived_held``: the blocks each still holds in ``WAITING_FOR_REMOTE_KVS``).

    Read from ``Scheduler.schedule``: a request leaves ``WAITING_FOR_REMOTE_KVS`` only when
    the waiting loop reaches it (``_handle_blocked_waiting_request``), and the loop breaks at
    the first request whose ``allocate_slots`` returns None. So when the head does not fit
    and a loaded request behind it holds blocks, the loaded one never runs and never frees
    them, and nothing else changes the pool: the head waits for blocks only the requests it
    stands before can return (docs/findings.md #30). Nothing held behind it, or a head that
    fits, is no such stall.
    """
    return need > available and sum(arrived_held) > 0


@dataclass(frozen=True)
class HoldFacts:
    """What the scheduler oracle read of a live request and of the scheduler before a
    ``schedule()`` call, as plain facts: everything :func:`held_back` decides by (each
    field is named after what it is read from; the releases' differences are the oracle's,
    ``kvconform.oracles.vllm``). The defaults are a waiting request that nothing holds.

    ``running``: in the scheduler's running queue. ``status``: ``Request.status``'s name.
    ``lora``: a ``lora_request``. ``mamba_split``: the scheduler's
    ``need_mamba_block_aligned_split``. ``stale_output``: ``num_stale_output_tokens``.
    ``kv_transfer``: non-empty ``kv_transfer_params``. ``cache_aware_window``: the
    scheduler's (0: none). ``placeholders``: ``num_output_placeholders``. ``known``:
    ``num_tokens_with_spec`` (``num_tokens`` where the release has none). ``max_tokens``:
    the request's (None where it has none). ``decode_deferred``: pipeline parallelism's decode
    cadence holds it in the coming step (``next_decode_eligible_step`` past the step after
    ``current_step``). ``prefill_chunk``: ``is_prefill_chunk``. ``prefill_interval``: the
    scheduler's ``local_prefill_interval`` (1: none). ``lookahead``: the drafter's prefill
    shift (``num_prefill_lookahead``, 0 without one). ``chunk_cap``: the chunk the request
    gets with the whole budget free (``SchedulingQueues.prefill_chunk_cap``), read for a
    running prefill chunk under a lookahead above 1 only (0 elsewhere: nothing reads it).
    ``split_chunk``, ``prefill_end``, ``mamba_block``, ``split_limit``: what Mamba "align"'s
    split decides a running request's chunk by (:func:`block_split_cuts_to_nothing`): the
    chunk it gets with the whole budget free before the split
    (``SchedulingQueues.unsplit_chunk``), where the split takes its prefill to end
    (``max(num_prompt_tokens, num_tokens - 1)``), the Mamba block and the split's limit
    (``SchedulingQueues.mamba_split_limits``), read for a running request under the split
    only (0 elsewhere: nothing reads them).
    ``sampled``: ``num_sampled_tokens_per_step``. ``max_model_len``: the scheduler's (None
    where it has none). ``encoder_ahead``: a multimodal placeholder the request has not
    computed past (:func:`first_input_ahead`), or an encoder-cache connector that decides
    for it."""

    running: bool = False
    status: str = "WAITING"
    lora: bool = False
    mamba_split: bool = False
    stale_output: int = 0
    kv_transfer: bool = False
    cache_aware_window: int = 0
    placeholders: int = 0
    known: int = 0
    max_tokens: int | None = None
    decode_deferred: bool = False
    prefill_chunk: bool = False
    prefill_interval: int = 1
    lookahead: int = 0
    chunk_cap: int = 0
    split_chunk: int = 0
    prefill_end: int = 0
    mamba_block: int = 0
    split_limit: int = 0
    sampled: int = 1
    max_model_len: int | None = None
    encoder_ahead: bool = False


def held_back(hold: HoldFacts, computed: int, tokens: int, prompt: int) -> str:
    """Why ``Scheduler.schedule`` may pass a request over in the coming step without
    breaking its policy ("" none), from what the oracle read (``hold``) and the request's
    computed tokens, its tokens (``num_tokens``: the prompt and outputs) and its prompt.

    Each reason is a ``continue`` or a queue of its own in ``schedule()``; the list, its
    order and why each is legitimate: docs/contract.md, "Liveness and fairness". The
    first that holds is the one recorded. :data:`ENCODER_HELD_BACK` comes last, only where
    no other reason holds, so that a reason that always excuses is not hidden behind the
    one the liveness family judges (``QueuedRequest.encoder_input``)."""
    other = _held_back_otherwise(hold, computed, tokens, prompt)
    if other:
        return other
    return ENCODER_HELD_BACK if hold.encoder_ahead else ""


def _held_back_otherwise(hold: HoldFacts, computed: int, tokens: int, prompt: int) -> str:
    """:func:`held_back`'s reasons but the encoder's, in their order."""
    if hold.status.startswith("WAITING_FOR"):
        return WAITING_FOR_REASONS.get(hold.status, hold.status)
    if hold.lora:
        return "the LoRA limit"
    if hold.mamba_split and block_split_may_cut(hold, computed, tokens):
        return "a Mamba block-aligned chunk"
    if hold.stale_output and not hold.running:
        return "its stale output is in flight"
    if hold.kv_transfer and not hold.running:
        return "the KV connector's queue"
    if not hold.running:
        if hold.cache_aware_window:
            return "cache-aware admission reorders the waiting queue"
        return ""
    if hold.known + hold.placeholders - computed <= 0:
        return "its next token is not known before a step in flight is processed"
    if (
        hold.placeholders
        and hold.max_tokens is not None
        and computed + 2 - hold.placeholders >= prompt + hold.max_tokens
    ):
        return "its last token is in flight"
    if hold.decode_deferred:
        return "the pipeline's decode cadence"
    if hold.prefill_chunk:
        if hold.prefill_interval > 1:
            return "the prefill cadence"
        if lookahead_may_cut(hold, computed, tokens) and not block_split_stuck(hold, computed):
            return "the prefill lookahead window"
    if hold.max_model_len is not None and computed + hold.sampled >= hold.max_model_len:
        return "max_model_len"
    return ""


def lookahead_may_cut(hold: HoldFacts, computed: int, tokens: int) -> bool:
    """Whether ``_reserve_prefill_lookahead`` may cut a running prefill's chunk to nothing
    in the coming call without the request being stuck there: the prompt's ``0 < R <=
    lookahead`` tokens left (with more, the cut leaves ``R - lookahead > 0`` tokens,
    progress), the lookahead more than 1 (multi-module MTP: "No-op for eagle-family
    drafters (lookahead 1)", the same in 0.28.0-0.34.0; with 1 it excused any prefill chunk,
    issue 35's running #24 form), and a chunk with the whole budget free that is not cut to
    nothing (:func:`lookahead_cuts_to_nothing`): then only the budget other requests take in
    that call cuts it, and they progress. Where the capped chunk is always cut to nothing
    (docs/findings.md #26) the request can never end there, and no excuse is granted: the
    liveness family's progress rule judges the call."""
    left = tokens - computed
    if hold.lookahead <= 1 or not 0 < left <= hold.lookahead:
        return False
    return not lookahead_cuts_to_nothing(left, hold.chunk_cap, hold.lookahead)


def block_split_may_cut(hold: HoldFacts, computed: int, tokens: int) -> bool:
    """Whether Mamba "align"'s split (``_mamba_block_aligned_split``) may cut a request's
    chunk to nothing in the coming call without the request being stuck there.

    A waiting request: yes, as recorded; its split starts at its prefix-cache hit, which the
    waiting loop looks up only when it reaches it, and a chunk split to nothing there breaks
    the loop, so a request that can never be admitted is check ``capacity``'s stall
    (``mamba_split_cause``, kvconform/oracles/scheduler/stalls.py). A running request: only
    while it prefills (the method returns the chunk unchanged from ``start >= prefill_end``:
    "Split only during prefill"), and only where the chunk it gets with the whole budget free
    is not cut to nothing (:func:`block_split_cuts_to_nothing`): then only the budget other
    requests take in that call can leave it a chunk the split floors to nothing, and they
    progress. Where the whole-budget chunk is floored to nothing, no call changes that
    (docs/findings.md #28, its running form: a streaming session's turn resumed off the
    block grid runs to the next boundary and stops there), and no excuse is granted: the
    liveness family's progress rule and the fairness family judge the call. Nor where the
    split keeps a whole-budget chunk (``chunk_cap``, read with the split) that multi-module
    MTP's lookahead reservation, applied after it, cuts to nothing at every call
    (:func:`lookahead_cuts_to_nothing`; docs/findings.md #26 through the split: a chunk
    starting mid-block stops at the block's end, within the lookahead of the prompt's end):
    the split is not what holds the request there, and nothing changes it."""
    if not hold.running:
        return True
    if computed >= hold.prefill_end or block_split_stuck(hold, computed):
        return False
    if hold.lookahead > 1 and hold.prefill_chunk:
        return not lookahead_cuts_to_nothing(tokens - computed, hold.chunk_cap, hold.lookahead)
    return True


def block_split_stuck(hold: HoldFacts, computed: int) -> bool:
    """Whether a running request's chunk with the whole budget free, recorded in ``hold``,
    is floored to nothing by Mamba "align"'s split at every call
    (:func:`block_split_cuts_to_nothing`; docs/findings.md #28, its running form)."""
    if not (hold.mamba_split and hold.running) or computed >= hold.prefill_end:
        return False
    return block_split_cuts_to_nothing(
        computed, hold.split_chunk, hold.prefill_end - computed, hold.mamba_block, hold.split_limit
    )


def first_input_ahead(inputs: Sequence[tuple[int, int]], computed: int) -> int | None:
    """The index of the first multimodal input (``(offset, length)``, in prompt order)
    whose placeholder range a request at ``computed`` has not computed past: the first one
    ``Scheduler._try_schedule_encoder_inputs`` weighs in its coming call; None where
    there is none.

    The call weighs the inputs ``get_mm_features_in_window`` returns for
    ``[num_computed_tokens, num_computed_tokens + num_new_tokens + shift_computed_tokens)``:
    the drafter's prefill shift (``num_prefill_lookahead``) moves the window's end only,
    its start stays at ``num_computed_tokens`` (``lo``: the first input whose end passes
    it; the same in every release from 0.25.0 to 0.34.0). An input that ends at or before
    the computed tokens is never weighed again, whatever the shift: it neither holds the
    request back nor is it the input that does (issue 35, the explorer's stall on 0.33.0:
    an input just computed, still cached for the step in flight, was taken for the one
    the request stops at)."""
    for index, (offset, length) in enumerate(inputs):
        if offset + length > computed:
            return index
    return None


class PendingInput(NamedTuple):
    """The first multimodal input a request has not computed past
    (:func:`first_input_ahead`), as a ``schedule()`` call found it: its placeholder's ``offset``
    and ``length`` in prompt tokens, the encoder ``embeds`` it takes of the budget and
    the cache (``PlaceholderRange.get_num_embeds``), and whether the encoder cache
    already holds its output (``EncoderCacheManager.cached``: no room needed)."""

    offset: int
    length: int
    embeds: int
    cached: bool


class QueuedRequest(NamedTuple):
    """A live request as a ``schedule()`` call found it (liveness and fairness families):
    ``added``, the order the engine handed requests to the scheduler (``add_request``:
    FCFS's arrival); ``priority`` and ``stamp``, the rank of its ``Request.arrival_time``
    (the priority policy's order, ``(priority, arrival_time)``); its computed and known
    tokens, prompt, ``max_tokens``, the device blocks it holds; ``hold``: what the oracle read
    that decides whether vLLM may pass it over in this step, and :attr:`held_back`, the reason
    :func:`held_back` derives from it ("" none; the reasons are listed in docs/contract.md);
    ``encoder_input``: the input it is held at where that reason is :data:`ENCODER_HELD_BACK`
    (None: none, or one the oracle cannot read: an encoder-cache connector, an
    encoder-decoder model);
    ``frees_deferred``: a running request whose blocks vLLM may not free in this call (a step
    in flight may still write them), so that a preemption that comes to it gives up the call
    (docs/contract.md, "Liveness and fairness");
    ``in_flight``: a running request's tokens scheduled in steps not yet processed
    (``num_in_flight_tokens``): vLLM frees the blocks a window has passed only below the
    processed tokens, ``computed - in_flight``."""

    request: str
    added: int
    priority: int
    stamp: int
    computed: int
    tokens: int
    prompt: int
    max_tokens: int
    held: int
    hold: HoldFacts = HoldFacts()
    frees_deferred: bool = False
    encoder_input: PendingInput | None = None
    in_flight: int = 0

    @property
    def held_back(self) -> str:
        """Why vLLM may pass the request over in this step ("" none): :func:`held_back`
        over the recorded facts, never an answer read from vLLM."""
        return held_back(self.hold, self.computed, self.tokens, self.prompt)


class StepQueues(NamedTuple):
    """A ``schedule()`` call's queues and what it made of them (liveness and fairness
    families of ``sanity``): the waiting and running requests before it (running in
    vLLM's order), the tokens it scheduled with the blocks each scheduled request holds
    after it and the position its step ends at (a prefix-cache hit included), the requests it preempted, its token budgets (``max_num_scheduled_tokens``,
    ``max_num_batched_tokens`` and the draft slots each request takes of the latter),
    ``max_num_seqs``, the free blocks before and after it (and those a deferred free holds
    back before it) and the admission watermark,
    the steps in flight, the engine's pause, chunked prefill and full-sequence admission,
    and the encoder's budget and room."""

    policy: str
    waiting: tuple[QueuedRequest, ...]
    running: tuple[QueuedRequest, ...]
    # request -> (tokens, blocks held after, computed after: the step's end position)
    scheduled: Mapping[str, tuple[int, int, int]]
    preempted: tuple[str, ...]
    token_budget: int
    input_budget: int
    draft_slots: int
    max_num_seqs: int
    free_before: int
    free_after: int
    watermark: int
    pool: int
    in_flight: int
    paused: bool
    chunked_prefill: bool
    reserve_full: bool
    # The encoder's side of the call (the liveness family's excuse at an input): the
    # encoder budget (``max_num_encoder_input_tokens``), the embeddings the encoder cache
    # could take before the call (``num_freeable_slots``: free, or held by no live request),
    # the drafter's prefill shift (``num_prefill_lookahead``) and
    # ``disable_chunked_mm_input``; and the long-prefill threshold the call caps a
    # request's chunk at (0: none; vLLM lifts it with one request eligible).
    encoder_budget: int = 0
    encoder_room: int = 0
    prefill_shift: int = 0
    whole_inputs: bool = False
    chunk_cap: int = 0
    # The blocks the scheduler holds back for a deferred free before the call, held by no
    # live request (an asynchronous KV consumer with steps in flight: a request finished,
    # aborted or preempted while a step that may write its blocks is in flight gives them
    # back once that step is processed, ``Scheduler.deferred_frees``): not free, and no
    # preemption in the call frees them.
    deferred: int = 0
