"""Whose a stall of vLLM's scheduler is, and what it shows of its cause.

A ``schedule()`` call that schedules nothing, with nothing in flight and no arrival to wait
for, cannot change the scheduler's state; a few in a row (the stepping's ``_STALL_STEPS``)
end the run. :func:`stalled_run` decides whose that is: the scenario's (a pool too small for
the request first in line: :class:`~kvconform.errors.PoolExhausted`, bad input), vLLM's (a
:class:`~kvconform.oracles.scheduler.records.StallRecord`, which the ``capacity`` check
judges), or nobody's yet (only running requests: the liveness family judges the empty calls).
:func:`stall_cause` names what kvconform knows of a stall's cause (``STALL_CAUSES`` in
``kvconform.model.observations``), so a finding's signature says which one it is;
:func:`arrived_load_cause`, the one that weighs the head's blocks against the free ones, is
asked where it names none (a head that does not fit before requests whose loads arrived).
Functions over the stepping's :class:`~kvconform.oracles.scheduler.stepping.SchedulerOracle`
(typed ``Any``: the stepping imports this module, and no package's modules import in a
circle), which calls them when it sees the empty calls.
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import PoolExhausted
from kvconform.model.floors import pool_columns
from kvconform.model.observations import (
    ARRIVED_LOAD_BEHIND_FRESH_HEAD,
    ARRIVED_LOAD_BEHIND_HEAD,
    MAMBA_BLOCK_PAST_BUDGET,
    MM_INPUT_PAST_BUDGET,
    MM_INPUT_PAST_THRESHOLD,
    PADDED_ROW_PAST_BUDGET,
    PREFILL_LOOKAHEAD_PAST_CAP,
    whole_input_chunk,
)
from kvconform.model.queue_facts import (
    arrived_loads_held_behind,
    block_split_cuts_to_nothing,
    lookahead_cuts_to_nothing,
)
from kvconform.oracles.scheduler.queues import held_blocks
from kvconform.oracles.scheduler.records import StallRecord

__all__ = [
    "arrived_load_cause",
    "first_in_line",
    "lookahead_cause",
    "mamba_split_cause",
    "mm_input_cause",
    "stall_cause",
    "stalled_run",
]


def stall_cause(oracle: Any, request: Any, computed: int, running: set[str]) -> str:
    """What a stall of the waiting ``request`` shows of its cause, where kvconform
    names one (``STALL_CAUSES``); "" otherwise.

    :data:`PADDED_ROW_PAST_BUDGET`: speculative decoding is on, the request has one
    token to compute past what it has computed or would adopt (its prefix-cache hit;
    a synchronous connector's fill, which ``DecodeBenchConnector`` makes every token
    but the last), the row of 1 + k tokens that ``Scheduler.schedule`` pads it to
    fits under ``max_model_len`` with the sampled token, and passes the request's
    token budget (``min(max_num_scheduled_tokens, max_num_batched_tokens - draft
    slots)``) with nothing else scheduled.

    Under ``disable_chunked_mm_input``, where the next token of
    the request, or of a running request (which may hold the seat it waits for),
    begins a multimodal input or lies inside it, the chunk that must take the rest of
    the input whole (:func:`whole_input_chunk`; with a drafter's prefill shift,
    ``num_prefill_lookahead_tokens``, which ``_try_schedule_encoder_inputs`` takes as
    ``shift_computed_tokens``, the roll-back ends a chunk ``shift`` tokens before the
    input, so a next token within ``shift`` tokens before it counts as on it and the
    chunk is ``shift`` tokens longer than the input) is either

    * :data:`MM_INPUT_PAST_BUDGET`: longer than the request's token budget,
      ``min(max_num_scheduled_tokens, max_num_batched_tokens - draft slots)``, which
      vLLM gives a request whether or not a threshold applies; or
    * :data:`MM_INPUT_PAST_THRESHOLD`: within it, but longer than the long-prefill
      threshold, which applies with more than one request running or waiting (with
      one, vLLM lifts the cap; the adaptive one floored at ``max_num_batched_tokens``
      over those requests), and up to 0.33.0 with chunked prefill off too (the
      scheduler's ``threshold_needs_chunked_prefill``: a prompt split at the threshold
      although chunked prefill is disabled).

    :data:`PREFILL_LOOKAHEAD_PAST_CAP` (:func:`lookahead_cause`): the request, or a running
    request, has its prompt's last tokens within the drafter's prefill lookahead and a
    chunk cap below them, so ``Scheduler._reserve_prefill_lookahead`` cuts its chunk to
    nothing at every call.

    :data:`MAMBA_BLOCK_PAST_BUDGET` (:func:`mamba_split_cause`): the request, or a running
    request, has a chunk with the whole budget free that ends short of its prefill's end
    and reaches no Mamba block boundary, with the block within the split's limit, so
    ``Scheduler._mamba_block_aligned_split`` floors it to nothing at every call.
    """
    stuck = [(request, computed)] + [
        (oracle.scheduler.requests[rid], int(oracle.scheduler.requests[rid].num_computed_tokens))
        for rid in sorted(running)
    ]
    causes = [mm_input_cause(oracle, r, c) for r, c in stuck]
    for cause in (MM_INPUT_PAST_BUDGET, MM_INPUT_PAST_THRESHOLD):
        if cause in causes:
            return cause
    k = oracle.num_spec
    tokens = int(request.num_tokens)
    if not computed:
        fills = tokens - 1 if oracle.limits.kv_connector == "decode_bench" else 0
        computed = max(oracle.api.cached_tokens(oracle.manager, request), fills)
    # The waiting request from what it would adopt, as the waiting loop computes its chunk.
    if any(lookahead_cause(oracle, r, c) for r, c in [(request, computed), *stuck[1:]]):
        return PREFILL_LOOKAHEAD_PAST_CAP
    if any(mamba_split_cause(oracle, r, c) for r, c in [(request, computed), *stuck[1:]]):
        return MAMBA_BLOCK_PAST_BUDGET
    if not k or not computed or tokens - computed != 1:
        return ""
    if computed + 1 + k + 1 > oracle.scenario.model.max_model_len:
        return ""
    token_budget, input_budget, draft_slots, _ = oracle.api.scheduling_limits(
        oracle.scheduler, oracle.config
    )
    if 1 + k <= min(token_budget, input_budget - draft_slots):
        return ""
    return PADDED_ROW_PAST_BUDGET


def mm_input_cause(oracle: Any, request: Any, computed: int) -> str:
    """See :func:`stall_cause`: :data:`MM_INPUT_PAST_BUDGET`,
    :data:`MM_INPUT_PAST_THRESHOLD` or ""."""
    limits = oracle.limits
    if not limits.disable_chunked_mm_input:
        return ""
    inputs = oracle.scenario.requests[request.request_id].mm_inputs
    chunk = whole_input_chunk(
        [(item.offset, item.length) for item in inputs],
        computed,
        oracle.api.prefill_shift(oracle.scheduler),
    )
    if not chunk:
        return ""
    token_budget, input_budget, draft_slots, _ = oracle.api.scheduling_limits(
        oracle.scheduler, oracle.config
    )
    if chunk > min(token_budget, input_budget - draft_slots):
        return MM_INPUT_PAST_BUDGET
    threshold = limits.long_prefill_token_threshold
    eligible = oracle.api.eligible_requests(oracle.scheduler)
    if not threshold or eligible <= 1:
        return ""
    if not limits.enable_chunked_prefill and oracle.api.threshold_needs_chunked_prefill(
        oracle.scheduler
    ):
        return ""
    if limits.long_prefill_token_threshold_adaptive:
        threshold = max(threshold, limits.max_num_batched_tokens // eligible)
    return MM_INPUT_PAST_THRESHOLD if chunk > threshold else ""


def lookahead_cause(oracle: Any, request: Any, computed: int) -> bool:
    """Whether ``Scheduler._reserve_prefill_lookahead`` cuts every chunk of ``request``
    (at ``computed``) to nothing (:func:`lookahead_cuts_to_nothing`, docs/findings.md #26):
    the prompt's tokens left within the drafter's prefill lookahead
    (``num_prefill_lookahead``: k for multi-module MTP), and the chunk the request gets
    with the whole budget free (its token budget, ``min(max_num_scheduled_tokens,
    max_num_batched_tokens - draft slots)``, and the long-prefill threshold where one is in
    force, then Mamba "align"'s block-aligned split of that chunk) below them. Chunked
    prefill off is no exception: the threshold caps a chunk there too up to 0.33.0
    (``long_prefill_cap``), and without one the cap is the prompt's rest, never below it."""
    lookahead = oracle.api.prefill_shift(oracle.scheduler)
    left = int(request.num_tokens) - computed
    cap = oracle.api.prefill_chunk_cap(oracle.scheduler, oracle.config, request, computed)
    return lookahead_cuts_to_nothing(left, cap, lookahead)


def mamba_split_cause(oracle: Any, request: Any, computed: int) -> bool:
    """Whether Mamba "align"'s block-aligned split cuts every chunk of ``request`` (at
    ``computed``) to nothing (:func:`block_split_cuts_to_nothing`, docs/findings.md #28):
    the chunk it gets with the whole budget free (``SchedulingQueues.unsplit_chunk``) ends
    short of its prefill's end and reaches no block boundary, and the block is within the
    split's limit, which lets only a block wider than ``max_num_scheduled_tokens`` (or the
    threshold) advance sub-block: the draft slots leave the request less."""
    limits = oracle.api.mamba_split_limits(oracle.scheduler, oracle.config)
    if limits is None:
        return False
    block, split_limit = limits
    chunk = oracle.api.unsplit_chunk(oracle.scheduler, oracle.config, request, computed)
    prefill_left = oracle.api.prefill_end(request) - computed
    return block_split_cuts_to_nothing(computed, chunk, prefill_left, block, split_limit)


def arrived_load_cause(oracle: Any, head: str, need: int, available: int) -> str:
    """:data:`ARRIVED_LOAD_BEHIND_HEAD` where the stalled ``head`` (needing ``need`` blocks,
    ``available`` to give) stands before requests whose KV loads the driver reported
    received and that still hold blocks in ``WAITING_FOR_REMOTE_KVS``
    (:func:`arrived_loads_held_behind`, docs/findings.md #30); "" otherwise. A load still in
    flight is no such request: the stepping declares no stall while one is. A head that never
    loaded KV (no remote prefill: #30's head is a load that failed) gets
    :data:`ARRIVED_LOAD_BEHIND_FRESH_HEAD`, the queue order before 0.31.0 (#34)."""
    arrived_held = [
        held_blocks(oracle, rid)
        for rid in sorted(oracle._loaded - set(oracle._loading) - {head})
        if rid in oracle.scheduler.requests
        and oracle.api.is_loading_remote_kv(oracle.scheduler.requests[rid])
    ]
    if not arrived_loads_held_behind(need, available, arrived_held):
        return ""
    return ARRIVED_LOAD_BEHIND_HEAD if head in oracle._remote else ARRIVED_LOAD_BEHIND_FRESH_HEAD


def first_in_line(oracle: Any, queued: list[str]) -> str | None:
    """The waiting request (of ``queued``, live and not running, in the scenario's order)
    the waiting loop of ``Scheduler.schedule`` reaches first, whose refusal breaks it.

    From 0.31.0 the loop drains ``kv_holding_waiting`` (requests that hold KV blocks: a
    load in flight or arrived, and a load that failed as a whole, which stays there,
    docs/findings.md #30) before the other waiting queues ("Requests holding KV blocks are
    always drained first"); within a queue the priority policy takes the least
    ``(priority, arrival_time)`` (``RequestQueue``'s heap order; ``_stamps`` ranks the
    arrival times, which follow the scenario's order: the requests are built up front),
    FCFS the queue's order. The scenario's order alone may name a request that only waits
    behind the head (the explorer's 0.34.0 stalls: a failed load of priority 0 heads a
    loaded one of priority 1 listed before it, #30; a loaded remote prefill padded past its
    budget ahead of a request listed before it, #19). Membership of ``kv_holding_waiting``
    is read from the scheduler (a fact of its queues; whether the head fits stays the
    floor's arithmetic); releases without it have one waiting queue, in the policy's order
    (before 0.31.0, ``waiting`` and ``skipped_waiting``, whose heads the priority policy
    compares in that order: a fresh request may head a loaded one, docs/findings.md #34)."""
    holding = getattr(oracle.scheduler, "kv_holding_waiting", None)
    ahead = [r.request_id for r in holding] if holding is not None else []
    priority = oracle.limits.policy == "priority"

    def rank(rid: str) -> tuple[int, ...]:
        first = 0 if rid in ahead else 1
        if priority:
            request = oracle.scheduler.requests[rid]
            return (first, int(getattr(request, "priority", 0) or 0), oracle._stamps.get(rid, -1))
        return (first, ahead.index(rid) if rid in ahead else queued.index(rid))

    return min(queued, key=rank) if queued else None


def stalled_run(oracle: Any, since: int) -> PoolExhausted | StallRecord | None:
    """Whose a stall is: the scenario's when no waiting request fits the pool by the
    floor's arithmetic, vLLM's (a :class:`StallRecord`) when one does.

    The waiting request first in line needs its next chunk's floor columns (the
    token budget's worth, or the rest of its prompt) minus what it holds, and under
    full-sequence admission its whole sequence's, against the free blocks (minus the
    watermark while another request runs). Where that does not fit, the scenario
    alone decides: when the blocks the request may rightly take (GroupInfo.pool_blocks)
    fit the pool less the null block with nothing else held, vLLM's scheduler could free
    what the others hold (preemption) and the stall is vLLM's; only a request that
    cannot fit an empty pool makes the scenario wrong. What vLLM's tables hold is
    never bad input. With no request waiting, running requests whose blocks for one
    more token each fit the pool are vLLM's too: None, the run stops and the liveness
    family judges the empty calls.
    """
    waiting = [rid for rid in oracle._requests if rid in oracle.scheduler.requests]
    model = oracle.scenario.model
    free = oracle.vllm.free_block_count(oracle.manager)
    running = {r.request_id for r in getattr(oracle.scheduler, "running", ())}
    head = first_in_line(oracle, [rid for rid in waiting if rid not in running])
    if head is not None and oracle.floors is not None:
        request = oracle.scheduler.requests[head]
        computed = int(request.num_computed_tokens)
        budget = oracle.limits.max_num_batched_tokens
        left = int(request.num_tokens) - computed
        chunk = min(left, budget) if oracle.limits.enable_chunked_prefill else left
        held = [len(ids) for ids in oracle.manager.get_block_ids(head)]
        need = full_need = 0
        cap = model.max_model_len
        tokens = min(computed + chunk + oracle.floor_lookahead, cap)
        whole = min(int(request.num_tokens), cap)
        for info, have in zip(oracle.floors, held, strict=True):
            span = info.block_size * int(info.floor_args.get("dcp_world_size", 1))
            extra = int(info.floor_args.get("num_speculative_blocks", 0))
            rule = info.floor_rule
            need += max(0, pool_columns(rule, tokens, 0, span, extra) - have)
            full_need += max(0, pool_columns(rule, whole, 0, span, extra) - have)
        full = model.scheduler_reserve_full_isl
        watermark = oracle.vllm.watermark_blocks(oracle.manager) if running else 0
        available = free - watermark
        alone = sum(
            info.pool_blocks(0, whole if full else computed + chunk, oracle.floor_lookahead, 0)
            for info in oracle.floors
        )
        fits_free = need <= available and (not full or full_need <= available)
        if fits_free or alone <= model.num_blocks - 1:
            wanted = max(need, full_need if full else 0)
            return StallRecord(
                since, head, wanted, available, free,
                f"{available} of {model.num_blocks} blocks to give ({free} free"
                + (f", {watermark} kept by the watermark" if watermark else "")
                + f"); its next chunk of {chunk} tokens needs {need}"
                + (f", its whole sequence {full_need}" if full else "")
                + ("" if fits_free else f"; alone it takes at most {alone} blocks, which the "
                   "pool less the null block holds"),
                stall_cause(oracle, request, computed, running)
                or arrived_load_cause(oracle, head, wanted, available),
            )  # fmt: skip
    if head is None and running and oracle.floors is not None:
        # Only running requests, stuck: when their blocks for one more token each fit
        # the pool, the run stops here and the liveness family of check sanity judges
        # the calls that scheduled nothing (vLLM's, not the scenario's).
        need = 0
        for rid in running:
            request = oracle.scheduler.requests[rid]
            computed = int(request.num_computed_tokens)
            need += sum(
                info.pool_blocks(computed, 1, oracle.floor_lookahead, 0) for info in oracle.floors
            )
        if need <= model.num_blocks - 1:
            return None
    return PoolExhausted(
        oracle.scenario.where.at("model.num_blocks"),
        f"vLLM's scheduler scheduled nothing from step {since} on, with nothing in flight, "
        f"while requests {', '.join(waiting)} wait; {oracle.vllm.free_block_count(oracle.manager)} "
        f"of {model.num_blocks} blocks are free: the pool (model.num_blocks) or the token "
        "budget (scheduler.max_num_batched_tokens) is too small for them",
    )
