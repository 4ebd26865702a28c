"""What a ``schedule()`` call found in the scheduler's queues and what it made of them
(:class:`~kvconform.model.queue_facts.StepQueues`, judged by the liveness and fairness families of
``sanity``): ids and counts only, read before and after the call."""

from __future__ import annotations

from typing import Any

from kvconform.model.queue_facts import (
    ENCODER_HELD_BACK,
    PendingInput,
    QueuedRequest,
    StepQueues,
    held_back,
)
from kvconform.oracles.scheduler.records import FreeRecord, StepFact
from kvconform.oracles.scheduler.state import OracleState


def held_blocks(oracle: OracleState, rid: str) -> int:
    """The distinct real blocks (the null block apart) the request holds over its groups."""
    null = oracle.run.null_block
    return len({b for ids in oracle.manager.get_block_ids(rid) for b in ids if b != null})


def _queued(oracle: OracleState, request: Any, running: bool) -> QueuedRequest:
    rid = request.request_id
    api = oracle.api
    hold = api.hold_facts(oracle.scheduler, request, running)
    computed, tokens, prompt = (
        int(request.num_computed_tokens),
        int(request.num_tokens),
        int(request.num_prompt_tokens),
    )
    pending = None
    # The input's facts are read where the model's rule finds the encoder holds it.
    if held_back(hold, computed, tokens, prompt) == ENCODER_HELD_BACK:
        found = api.pending_input(oracle.scheduler, request)
        pending = PendingInput(*found) if found is not None else None
    return QueuedRequest(
        rid,
        oracle._added.get(rid, -1),
        int(getattr(request, "priority", 0) or 0),
        oracle._stamps.get(rid, -1),
        computed,
        tokens,
        prompt,
        int(getattr(request, "max_tokens", 0) or 0),
        held_blocks(oracle, rid),
        hold,
        running and api.frees_deferred(oracle.scheduler, request),
        pending,
        api.in_flight_tokens(request) if running else 0,
    )


def _chunk_cap(oracle: OracleState) -> int:
    """The long-prefill threshold the coming ``schedule()`` call caps a request's chunk at
    (0: none): with more than one request running or waiting (``get_request_counts``),
    ``long_prefill_token_threshold``, floored at ``max_num_batched_tokens`` over those
    requests where it is adaptive (vLLM 0.34.0's ``Scheduler.schedule``: "When it is the
    only request there is nobody to starve"). With chunked prefill only where the release
    gates the threshold on it (0.34.0); up to 0.33.0 it caps chunks with chunked prefill off
    too (``threshold_needs_chunked_prefill``)."""
    limits = oracle.limits
    threshold = int(limits.long_prefill_token_threshold or 0)
    if not threshold:
        return 0
    if not limits.enable_chunked_prefill and oracle.api.threshold_needs_chunked_prefill(
        oracle.scheduler
    ):
        return 0
    eligible = oracle.api.eligible_requests(oracle.scheduler)
    if eligible <= 1:
        return 0
    if limits.long_prefill_token_threshold_adaptive:
        threshold = max(threshold, int(limits.max_num_batched_tokens) // eligible)
    return threshold


def _deferred(oracle: OracleState, live: tuple[QueuedRequest, ...], gone: tuple[str, ...]) -> int:
    """The blocks held back for a deferred free that no ``live`` request's table holds (a
    prefix-cache hit may share one): neither free nor any running request's to give up.

    Besides ``Scheduler.deferred_frees``, the tables of finished requests vLLM still keeps
    (``gone``): a request aborted while its KV load is in flight keeps its blocks until the
    connector reports the load done (``finish_requests``: ``delay_free_blocks`` for a
    ``WAITING_FOR_REMOTE_KVS`` request whose load has not finished, ``_aborted_kv_loads``;
    ``_update_from_kv_xfer_finished`` frees them), as does one whose connector delays the
    free (``request_finished``). No preemption frees those either (the explorer's 0.34.0
    stall: a load aborted beside a running request that needs its block)."""
    deferred = set(oracle.api.deferred_block_ids(oracle.scheduler))
    for rid in gone:
        deferred.update(b for ids in oracle.manager.get_block_ids(rid) for b in ids)
    if not deferred:
        return 0
    held = {
        block
        for request in live
        for ids in oracle.manager.get_block_ids(request.request)
        for block in ids
    }
    return len(deferred - held - {oracle.run.null_block})


class QueueSnapshot:
    """The queues before a ``schedule()`` call; :meth:`record` adds the call's fact."""

    def __init__(self, oracle: OracleState) -> None:
        scheduler = oracle.scheduler
        running_ids = [r.request_id for r in getattr(scheduler, "running", ())]
        in_running = set(running_ids)
        finished = oracle.run.finished
        self.running = tuple(_queued(oracle, scheduler.requests[rid], True) for rid in running_ids)
        self.waiting = tuple(
            _queued(oracle, request, False)
            for rid, request in scheduler.requests.items()
            if rid not in in_running and rid not in finished and not request.is_finished()
        )
        # Finished requests the scheduler still holds (a delayed free): their blocks are
        # neither free nor any live request's.
        gone = tuple(
            rid
            for rid, request in scheduler.requests.items()
            if rid not in in_running and (rid in finished or request.is_finished())
        )
        self.free = oracle.vllm.free_block_count(oracle.manager)
        self.deferred = _deferred(oracle, self.running + self.waiting, gone)
        self.encoder_budget, self.encoder_room = oracle.api.encoder_room(scheduler)
        self.chunk_cap = _chunk_cap(oracle)
        self.events = len(oracle.run.events)

    def record(self, oracle: OracleState, output: Any, in_flight: int) -> None:
        limits, model = oracle.limits, oracle.scenario.model
        token_budget, input_budget, draft_slots, seats = oracle.api.scheduling_limits(
            oracle.scheduler, oracle.config
        )
        preempted = tuple(
            event.request
            for event in oracle.run.events[self.events :]
            if isinstance(event, FreeRecord) and event.kind == "preempt"
        )
        requests = oracle.scheduler.requests
        scheduled = {
            rid: (int(tokens), held_blocks(oracle, rid), int(requests[rid].num_computed_tokens))
            for rid, tokens in output.num_scheduled_tokens.items()
        }
        oracle.run.queues.append(
            StepFact(
                oracle._current,
                "-",
                StepQueues(
                    limits.policy,
                    self.waiting,
                    self.running,
                    scheduled,
                    preempted,
                    token_budget,
                    input_budget,
                    draft_slots,
                    seats,
                    self.free,
                    oracle.vllm.free_block_count(oracle.manager),
                    oracle.vllm.watermark_blocks(oracle.manager),
                    oracle.vllm.pool_size(oracle.manager),
                    in_flight,
                    oracle._paused,
                    bool(limits.enable_chunked_prefill),
                    bool(model.scheduler_reserve_full_isl),
                    self.encoder_budget,
                    self.encoder_room,
                    oracle.api.prefill_shift(oracle.scheduler),
                    bool(limits.disable_chunked_mm_input),
                    self.chunk_cap,
                    self.deferred,
                ),
            )
        )
