"""What the scheduler oracle records of each step beside its counts (the facts
:mod:`kvconform.harness.checks` judges): the step's zeroing list, the pool's census, the worker's encoder work
and the encoder inputs the step reports, and the KV-cache events the scheduler publishes."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from kvconform.model.facts import (
    EncoderInputStats,
    EncoderStep,
    MmInput,
    PoolCensus,
    PublishedEvents,
    StepZeroingList,
)
from kvconform.oracles.scheduler.records import ScheduledRequest, StepFact
from kvconform.oracles.scheduler.state import OracleState
from kvconform.oracles.vllm.scheduling import Scheduling


def record_zeroing(
    oracle: OracleState, output: Any, rows: Sequence[ScheduledRequest], loading_now: set[str]
) -> None:
    """The step's zeroing list, where vLLM zeroes new blocks (Mamba layers, mixed
    precision; #35219), with every request's tables and the tokens valid before the
    step (judged by ``checks.zeroing``)."""
    recording = oracle._zeroed_groups
    freed, oracle.freed_since_zeroing = frozenset(oracle.freed_since_zeroing), set()
    if recording is None:
        return
    held = {
        rid: tuple(tuple(ids) for ids in oracle.manager.get_block_ids(rid))
        for rid in oracle.scheduler.requests
    }
    judged = frozenset(set(output.num_scheduled_tokens) | loading_now)
    # Tokens a synchronous load writes in this step are not valid before it: the worker
    # zeroes their blocks first, then the connector writes them.
    loads = oracle.vllm.step_sync_loads(output)
    valid_end = {
        row.request: row.computed - loads.get(row.request, 0)
        for row in rows
        if row.phase != "running"
    }
    # A request beginning an asynchronous load counts its loaded tokens as computed: they
    # are valid once the load lands, which the worker's zeroing must not race.
    for rid in loading_now:
        valid_end[rid] = int(oracle.scheduler.requests[rid].num_computed_tokens)
    groups = oracle.scenario.model.groups
    oracle.run.zeroing.append(
        StepFact(
            oracle._step,
            "-",
            StepZeroingList(
                tuple(recording),
                tuple(g.block_size for g in groups),
                held,
                judged,
                frozenset(loading_now),
                valid_end,
                frozenset(oracle.vllm.step_blocks_to_zero(output)),
                freed,
                frozenset(copy for _, copy in oracle.api.block_copies(output)),
            ),
        )
    )


def record_census(oracle: OracleState) -> None:
    """The pool after a ``schedule()`` (checked by the conservation family): the free
    count, every request's tables, the blocks vLLM popped for a deferred free and has not
    returned yet, and their reference counts. The blocks vLLM 0.28.0 pins for a KV
    connector's partial-tail offload count with the deferred ones (``pinned_blocks``):
    each pin is a reference off every table, held until the request's free, and without
    it a pinned block reads as leaked, or as counted once too often where its request's
    table holds it too (the explorer's seed-0 run on 0.28.0, docs/explore.md)."""
    null = oracle.run.null_block
    tables = {
        rid: tuple(tuple(ids) for ids in oracle.manager.get_block_ids(rid))
        for rid in oracle.scheduler.requests
    }
    deferred = tuple(
        b
        for record in chain(oracle.run.deferred_frees, oracle.run.retained_copies)
        if record.returned is None
        for ids in record.held
        for b in ids
        if b != null
    ) + oracle.vllm.pinned_blocks(oracle.manager)
    held = {b for table in tables.values() for ids in table for b in ids if b != null}
    refs, hashed = oracle.vllm.block_refs(oracle.manager, held | set(deferred))
    oracle.run.census.append(
        StepFact(
            oracle._step,
            "-",
            PoolCensus(
                oracle.vllm.free_block_count(oracle.manager),
                oracle.vllm.pool_size(oracle.manager),
                tables,
                deferred,
                refs,
                hashed,
                frozenset(oracle.scheduler.requests.keys() - oracle.run.finished),
                _bookkeeping(oracle),
            ),
        )
    )


def _bookkeeping(oracle: OracleState) -> dict[str, frozenset[str]]:
    """vLLM's per-request state, read only after a request ended since the last census
    (what must be dropped is dropped then, or stays): the scan costs a step's time."""
    ended = len(oracle.run.finished)
    if ended == oracle.run.finished_at_census:
        return {}
    oracle.run.finished_at_census = ended
    ids = oracle.scheduler.requests.keys() | oracle.run.finished
    found = oracle.vllm.request_keyed_state(oracle.manager, ids)
    found.update(oracle.api.scheduler_request_state(oracle.scheduler, ids))
    return found


def record_encoder_step(oracle: OracleState, output: Any, rows: Sequence[ScheduledRequest]) -> None:
    """The step's encoder work, as the worker runs it (judged by ``checks.encoder``).

    The model runner drops the encoder outputs the step frees
    (``free_encoder_mm_hashes``), runs the encoder on the inputs the step schedules
    (``scheduled_encoder_inputs``) and then gathers, for every placeholder token the
    step computes, its input's encoder output from its cache.
    """
    if oracle.run.encoder_budget is None:
        return
    freed = tuple(oracle.api.freed_encoder_outputs(output))
    run = tuple(
        (rid, index)
        for rid, indexes in sorted(oracle.api.scheduled_encoder_inputs(output).items())
        for index in indexes
    )
    requests = oracle.scenario.requests
    run_now = [f"{rid}[{index}] {requests[rid].mm_inputs[index].length}" for rid, index in run]
    note = [f"encoder runs {', '.join(run_now)}"] if run_now else []
    note += [f"evicts {', '.join(freed)}"] if freed else []
    if note:
        oracle.run.encoder_notes[oracle._step] = "; ".join(note)
    named = {rid for rid, _ in run} | {row.request for row in rows}
    oracle.run.encoder.append(
        StepFact(
            oracle._step,
            "-",
            EncoderStep(
                freed,
                run,
                tuple((row.request, row.computed, row.scheduled) for row in rows),
                oracle.run.encoder_budget,
                oracle.run.encoder_cache_size or 0,
                bool(oracle.limits.disable_chunked_mm_input),
                {
                    rid: tuple(
                        MmInput(m.identifier, m.offset, m.end, m.length)
                        for m in requests[rid].mm_inputs
                    )
                    for rid in sorted(named)
                },
            ),
        )
    )


def record_encoder_input_stats(oracle: OracleState, output: Any) -> None:
    """``scheduler.log_iteration_details``: the step's ``scheduled_encoder_input_stats``
    and the inputs it schedules, their lengths the scenario's (judged by
    ``checks.encoder``)."""
    if not oracle.limits.log_iteration_details:
        return
    scheduled = tuple(
        (m.identifier, m.length)
        for rid, indexes in oracle.api.scheduled_encoder_inputs(output).items()
        for m in (oracle.scenario.requests[rid].mm_inputs[index] for index in indexes)
    )
    reported = oracle.api.encoder_input_stats(output)
    oracle.run.encoder.append(
        StepFact(
            oracle._step,
            "-",
            EncoderInputStats(reported, scheduled),
        )
    )


# -- KV-cache events: what a router learns of the prefix cache ----------------------------


class KvEventMirror:
    """With ``model.kv_cache_events``, records the events the scheduler publishes: after
    each ``update_from_output`` (which drains the manager's and the connector's events and
    publishes them), the events and what the pool caches then (judged by
    ``checks.kv_events``; invariant ``EVENTS_DIVERGE``, check ``sanity``)."""

    def __init__(self, oracle: OracleState) -> None:
        self.oracle = oracle
        self.queue = oracle.vllm.part(Scheduling).observe_published_events(oracle.scheduler)

    def published(self, step: int) -> None:
        vllm = self.oracle.vllm
        events = vllm.kv_cache_events(self.queue)
        self.queue.clear()
        cached = vllm.cached_block_counts(self.oracle.manager)
        self.oracle.run.lifecycle.append(
            StepFact(step, "-", PublishedEvents(tuple(events), cached))
        )
