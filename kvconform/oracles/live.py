"""The live party: vLLM's own ``KVCacheManager``, driven as its scheduler drives it.

Every call mirrors what ``vllm/v1/core/sched/scheduler.py`` does around
``allocate_slots``:

* A request entering from the waiting queue (first chunk, or first chunk after a
  preemption) first looks up its prefix-cache hit with ``get_computed_blocks``
  (capped so at least one token is scheduled) and stores the lookup's
  ``shared_prefix_boundary`` on the request as the scheduler does, then calls ``allocate_slots``
  with the hit, the scenario's lookahead and, for encoder-decoder models, its
  encoder length, plus what the call says the scheduler passes (``external``
  tokens from a KV connector, ``full_sequence_must_fit``, ``reserved_blocks``)
  and ``has_scheduled_reqs`` as the scheduler computes it (whether another
  request is running); it is then marked running.
* A running request calls ``allocate_slots(request, scheduled,
  num_lookahead_tokens=lookahead)``, with ``num_in_flight_tokens`` set to the call's
  ``in_flight`` (the tokens of its earlier steps an asynchronous scheduler has not
  had back yet) for the call.
* After the step, ``num_computed_tokens`` advances by the scheduled tokens,
  rejected drafts are rolled back from it, sampled tokens are appended and, as
  the scheduler does under speculative decoding, verified blocks are cached.
* ``preempt`` frees the blocks and resets the computed count; ``finish`` frees.
* Each step starts with ``new_step_starts`` (:meth:`LiveAllocator.new_step`), as
  ``Scheduler.schedule`` starts: Mamba "align" refuses a request whose prefix hit
  ends on a state another request cached in the same step, until the next one.
  Each step ends as ``schedule`` ends (:meth:`LiveAllocator.end_step`): the boundary
  states of Mamba "align" groups cached in the step are handed to a KV connector
  (``take_boundary_state_offloads``, recorded for :mod:`kvconform.harness.checks.handoffs`), then
  ``take_kv_cache_block_copies`` and the blocks a copy-on-write retained go back.

``allocate_slots`` returning ``None`` where the call is not marked ``refused``
(where ``None`` is the answer the scenario expects: :meth:`LiveAllocator.is_refused`)
is the scenario's fault only when its own arithmetic does not fit the pool: the
blocks the requests holding blocks and the call may rightly take
(:meth:`~kvconform.model.observations.GroupInfo.pool_blocks`), less what a shared
prefix lets them share, past the pool less the null block (a :class:`PoolExhausted`).
Otherwise it is vLLM's (:class:`StepDenied`, the ``capacity`` check): what vLLM's
tables hold beyond the floors is a statement about vLLM, not about the scenario.

The oracle judges nothing else: what vLLM answered, zeroed, handed over, announced
and returned is kept as facts (:mod:`kvconform.model.facts`) in ``call_facts`` (of a
call) and ``step_facts`` (of the step, by request), which the driver records with
where they happened and the ``sanity`` families of :mod:`kvconform.harness.checks`
judge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvconform.errors import Location, PoolExhausted, ScenarioError
from kvconform.model.facts import (
    AdmissionHit,
    DefaultDisagreement,
    DeferredReturn,
    Eviction,
    FinalizedTails,
    InFlightPop,
    LookupEvents,
    Payload,
    PoolCensus,
    PrefixStats,
    ResetAnswer,
    RetainedHit,
    StepEvents,
    StepHandoffs,
    ZeroingGroups,
    ZeroingList,
)
from kvconform.model.floors import MAMBA_ALIGNED_STATE, aligned_state_call_blocks, pool_columns
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Action, Call, ModelSpec, RequestSpec
from kvconform.oracles.resolve import extra_retained_tokens, group_specs
from kvconform.oracles.vllm import Vllm

# Token ids: disjoint ranges per request so that prefix-cache hits happen only
# where a scenario asks for them (prefix_from), never on outputs. Every party that
# builds vLLM requests (live, scheduler, the benchmark's bare loop) uses this layout.
ID_STRIDE = 1_000_000
OUTPUT_OFFSET = 500_000


def prompt_tokens(index: int, spec: RequestSpec, prompts: Mapping[str, list[int]]) -> list[int]:
    """The prompt of the ``index``-th request; a ``prefix_from`` prefix is copied from
    that request's prompt in ``prompts``."""
    base = (index + 1) * ID_STRIDE
    prompt = list(range(base, base + spec.prompt_len))
    if spec.prefix_from is not None:
        prompt[: spec.prefix_len] = prompts[spec.prefix_from][: spec.prefix_len]
    return prompt


def first_output_token(index: int) -> int:
    """The first sampled token id of the ``index``-th request."""
    return (index + 1) * ID_STRIDE + OUTPUT_OFFSET


def manager_for(
    vllm: Vllm,
    model: ModelSpec,
    specs: Sequence[Any],
    speculative_options: Mapping[str, int | bool] | None = None,
) -> Any:
    """A ``KVCacheManager`` for ``model``'s pool and groups, built as the scheduler builds it."""
    return vllm.new_manager(
        vllm.kv_cache_config(
            model.num_blocks,
            specs,
            [g.eagle_group for g in model.groups],
            prefix_cache_retention_interval=model.prefix_cache_retention_interval,
            roles=[GROUP_TYPES[g.type].role for g in model.groups],
            hisparse_host_blocks=model.hisparse_host_blocks,
        ),
        max_model_len=model.max_model_len,
        scheduler_block_size=model.scheduler_block_size,
        hash_block_size=model.hash_block_size,
        enable_caching=model.enable_caching,
        dcp_world_size=model.dcp_world_size,
        watermark=model.watermark,
        max_in_flight_tokens=model.max_in_flight_tokens,
        log_stats=model.log_stats,
        enable_kv_cache_events=model.kv_cache_events,
        enable_mamba_shared_prefix_checkpoint=model.mamba_shared_prefix_checkpoint,
        **({"metrics_collector": vllm.metrics_collector()} if model.log_stats else {}),
        **dict(speculative_options or {}),
    )


class StepDenied(Exception):
    """vLLM refused a call whose blocks the floor's arithmetic fits in the pool."""

    def __init__(
        self, call: Call, who: str, need: int, available: int, free: int, detail: str
    ) -> None:
        super().__init__(f"{who} refused {call.label} of {call.request!r}")
        self.call, self.who, self.need = call, who, need
        self.available, self.free, self.detail = available, free, detail


class LiveAllocator:
    """One ``KVCacheManager`` shared by all requests of a scenario."""

    def _full_sequence_must_fit(self, call: Call) -> bool:
        """What vLLM's scheduler passes at an admission: ``scheduler_reserve_full_isl``
        (the scenario's setting, vLLM's default unless stated), unless the chunk says."""
        if not call.first_chunk:
            return False
        stated = call.options.full_sequence_must_fit
        return self.model.scheduler_reserve_full_isl if stated is None else stated

    def __init__(
        self, vllm: Vllm, model: ModelSpec, trajectory: Trajectory, *, as_scheduler: bool = True
    ) -> None:
        """A manager for ``model``'s pool and groups, allocating with ``run``'s lookahead.

        ``as_scheduler``: built with what vLLM's scheduler passes for its
        speculative config (``Vllm.manager_options``: EAGLE block drop, prefill
        lookahead, lookahead block hashes); off for a warmup replay, whose
        requests never came through a scheduler.
        """
        options = (
            vllm.manager_options(
                trajectory.method,
                trajectory.num_speculative_tokens,
                trajectory.sample_from_anchor,
                model.enable_caching,
                trajectory.disable_lookahead_block_hashes,
            )
            if as_scheduler
            else {}
        )
        extra = extra_retained_tokens(model)
        if as_scheduler and extra:
            # Multi-module MTP (the only case the loader admits a sliding window's
            # extra_retained_tokens for): vLLM's num_prefill_lookahead_tokens is k, not
            # the single-module 1 the model-less config holder gives.
            options["num_prefill_lookahead"] = extra + 1
        self.vllm = vllm
        self.model = model
        self.lookahead = trajectory.lookahead
        # The groups (their floor rules and fixed inputs) and the floor's lookahead (what
        # the drafter writes): the arithmetic a refusal is judged by.
        self._groups = trajectory.groups
        self.floor_lookahead = (
            trajectory.lookahead
            if trajectory.floor_lookahead is None
            else trajectory.floor_lookahead
        )
        self.specs = group_specs(vllm, model, trajectory.num_speculative_tokens)
        self.manager = manager_for(vllm, model, self.specs, options)
        self.null_block = vllm.null_block_id(self.manager)
        # HiSparse's coordinator, bound before the first admission; the step's scheduled
        # requests: id -> (tokens computed once the step completes, tokens scheduled).
        self._hisparse = vllm.hisparse_coordinator(self.manager)
        # Fixed for the manager's life, so asked once: the groups whose new blocks vLLM
        # zeroes (None: it zeroes nothing) and those that retain a longer prefix hit.
        self._zeroing_groups = vllm.recording_groups(self.manager)
        self._own_pool_groups = {
            g for g, info in enumerate(trajectory.groups) if GROUP_TYPES[info.type].own_pool
        }
        self._retained_hit_groups = vllm.retained_hit_groups(self.manager)
        self._scheduled: dict[str, tuple[int, int]] = {}
        # Events a prefix hit re-announced (kv_cache_report_mode "full"), by identity: the
        # router already counts those blocks, so the mirror leaves them out.
        self._reannouncements: list[Any] = []
        # With log_stats: what the step's admissions looked up, (requests, queries, hits)
        # of new and of preempted requests, and whether a reset succeeded since the stats
        # were last taken; the requests preempted so far.
        self._stats_expected = [0] * 6
        self._stats_reset = False
        self._ever_preempted: set[str] = set()
        # Requests finished while their last step was in flight: their popped blocks wait
        # for the end of the next step (request, blocks, whether that step has begun).
        self._deferred: list[tuple[str, list[Any], bool]] = []
        self._hasher = (
            vllm.block_hasher(
                model.hash_block_size, int(options.get("num_hash_lookahead_tokens", 0))
            )
            if model.enable_caching
            else None
        )
        self._requests: dict[str, Any] = {}
        # The scenario's own pool arithmetic, which decides whose a refusal is: per request
        # holding blocks, its last call (the most device-pool blocks per group that call
        # may rightly leave it, GroupInfo.pool_blocks, are counted only at a refusal: the
        # loop stays as cheap as before); the prefix it may share (prefix_from, tokens);
        # its encoder length.
        self._last_calls: dict[str, Call] = {}
        self._shares: dict[str, tuple[str, int]] = {}
        self._encoder_lens: dict[str, int] = {}
        self._prompts: dict[str, list[int]] = {}
        self._outputs: dict[str, int] = {}
        self._first_outputs: dict[str, int] = {}
        # Requests whose kv_cache_report_mode is "full".
        self._report_full: set[str] = set()
        # Requests whose sampling parameters skip reading the prefix cache.
        self._skips_reading: set[str] = set()
        self._running = vllm.running_status()
        self._preempted = vllm.preempted_status()
        self._waiting = vllm.waiting_status()
        self._all_groups = tuple(range(len(model.groups)))
        # Requests whose KV an asynchronous load brought in and that wait to be admitted.
        self._loaded: set[str] = set()
        # Requests admitted and neither preempted nor finished: the scheduler's
        # `running` list, whose emptiness decides whether the watermark applies.
        self._running_names: set[str] = set()
        self._finished: set[str] = set()  # finished requests (their bookkeeping must go)
        # What vLLM did, for check `sanity` (kvconform.model.facts): of a call, (call,
        # fact); of the step, (request, fact), the request "-" for the step as a whole.
        self.call_facts: list[tuple[Call, Payload]] = []
        self.step_facts: list[tuple[str, Payload]] = []
        # Mamba "align" groups whose cached boundary states a step hands a KV connector
        # (model/handoffs.py), and what was cached when the step began.
        self._handoff_groups = (
            vllm.boundary_state_groups(self.manager) if model.enable_caching else []
        )
        self._cached_states: set[tuple[int, int, int]] = set()
        # The cache keys of every boundary state handed to the connector so far.
        self._freed_this_step: set[int] = set()
        self.step_facts.append(
            (
                "-",
                ZeroingGroups(
                    tuple(self._zeroing_groups or ()), vllm.zeroes_new_blocks(self.manager)
                ),
            )
        )
        for disagreement in vllm.forwarded_default_disagreements(self.manager):
            self.step_facts.append(("-", DefaultDisagreement(disagreement)))

    def add_request(self, spec: RequestSpec, index: int) -> None:
        prompt = self._prompts[spec.name] = prompt_tokens(index, spec, self._prompts)
        self._outputs[spec.name] = self._first_outputs[spec.name] = first_output_token(index)
        self._requests[spec.name] = self.vllm.new_request(
            spec.name,
            prompt,
            self._hasher,
            kv_cache_report_full=spec.kv_cache_report_full,
            skip_reading_prefix_cache=spec.skip_reading_prefix_cache,
        )
        if spec.prefix_from is not None and spec.prefix_len:
            self._shares[spec.name] = (spec.prefix_from, spec.prefix_len)
        if spec.kv_cache_report_full:
            self._report_full.add(spec.name)
        if spec.skip_reading_prefix_cache:
            self._skips_reading.add(spec.name)

    def new_step(self) -> None:
        """A scheduler step begins: ``Scheduler.schedule`` calls ``new_step_starts`` first."""
        self.vllm.new_step_starts(self.manager)
        if self._handoff_groups:
            self._cached_states = self.vllm.boundary_states_cached(
                self.manager, self._handoff_groups
            )
            self._freed_this_step.clear()

    def end_step(self) -> None:
        """Every request of the step is allocated: the boundary states cached in the step
        are handed to the connector, then the step's copy-on-write copies and the blocks
        retained for them released, as ``schedule`` ends."""
        if self._handoff_groups:
            self._record_handoffs()
        self.vllm.release_block_copies(self.manager)
        if self._hisparse is not None:
            self.vllm.hisparse_step(self._hisparse, self._scheduled)
        self._scheduled.clear()
        if self.model.kv_cache_events:
            self._record_kv_events()
        self.return_deferred(ended_step=True)
        if self.model.log_stats:
            self._record_stats()
        if self._hisparse is None:  # HiSparse's connector holds blocks outside the tables
            self._record_census()

    def _record_census(self) -> None:
        """The pool after the step, for check ``conservation``: the free count, the live
        tables of the device pool's groups, the blocks still deferred, their references."""
        own_pool = self._own_pool_groups
        null = self.null_block
        tables = {
            name: tuple(
                tuple(ids) if group not in own_pool else ()
                for group, ids in enumerate(self.block_ids(name))
            )
            for name in sorted(self._running_names | self._loaded)
        }
        deferred = tuple(
            b.block_id for _, blocks, _ in self._deferred for b in blocks if b.block_id != null
        )
        held = {b for table in tables.values() for ids in table for b in ids if b != null}
        refs, hashed = self.vllm.block_refs(self.manager, held | set(deferred))
        self.step_facts.append(
            (
                "-",
                PoolCensus(
                    self.free_blocks(),
                    self.vllm.pool_size(self.manager),
                    tables,
                    deferred,
                    refs,
                    hashed,
                    frozenset(self._requests.keys() - self._finished),
                    self.vllm.request_keyed_state(self.manager, self._requests.keys()),
                ),
            )
        )

    def finish_in_flight(self, name: str) -> None:
        """A request finishes while its last step is in flight (a KV consumer under
        asynchronous scheduling, ``Scheduler._free_request_blocks``): its blocks are popped
        (``pop_blocks_for_free``), still referenced, and go back to the pool only once that
        step's output is applied (``_drain_deferred_frees``), at the end of the next step.
        The popped blocks must be the ones its tables held."""
        self._note_freed(name)
        held = sorted(b for ids in self.block_ids(name) for b in ids if b != self.null_block)
        popped = self.manager.pop_blocks_for_free(self._requests[name])
        ids = sorted(b.block_id for b in popped if b.block_id != self.null_block)
        self._running_names.discard(name)
        after = tuple(tuple(ids) for ids in self.block_ids(name))
        self.step_facts.append((name, InFlightPop(tuple(held), tuple(ids), after)))
        self._deferred.append((name, popped, False))
        self._finished.add(name)

    def return_deferred(self, ended_step: bool = False) -> None:
        """Return the deferred blocks whose in-flight step has completed, tail first (the
        scheduler frees them in reverse order): at the end of every step after the finish's
        step (``ended_step``), or at the run's end. Each popped block that no live request
        holds goes back to the free queue."""
        waiting: list[tuple[str, list[Any], bool]] = []
        for name, blocks, due in self._deferred:
            if ended_step and not due:
                waiting.append((name, blocks, True))
                continue
            live_ids = {
                b for other in self._running_names | self._loaded
                for ids in self.block_ids(other) for b in ids
            }  # fmt: skip
            popped = {b.block_id for b in blocks if b.block_id != self.null_block}
            self._last_calls.pop(name, None)  # held, by the scenario, until now
            before = self.free_blocks()
            self.manager.block_pool.free_blocks(reversed(blocks))
            returned = self.free_blocks() - before
            self.step_facts.append(
                (
                    name,
                    DeferredReturn(
                        len(blocks),
                        tuple(sorted(popped)),
                        tuple(sorted(popped & live_ids)),
                        returned,
                    ),
                )
            )
        self._deferred = waiting

    def reset_prefix_cache(self, stated: bool) -> None:
        """``KVCacheManager.reset_prefix_cache`` between steps (an RLHF weight update, the
        ``/reset_prefix_cache`` endpoint): it must answer as ``stated`` (derived by hand: it
        succeeds only when no request holds a block), and a reset leaves nothing cached."""
        answer = bool(self.manager.reset_prefix_cache())
        if answer:
            self._stats_reset = True
        still = sum(self.vllm.cached_block_counts(self.manager).values()) if answer else 0
        self.step_facts.append(
            ("-", ResetAnswer(stated, answer, still, self.free_blocks(), self.model.num_blocks))
        )

    def evict_cached(self, columns: Sequence[tuple[str, int]], where: Location) -> None:
        """``KVCacheManager.evict_blocks`` of the blocks a KV connector reported invalid
        (``Scheduler._handle_invalid_blocks``): the blocks at these columns of the requests'
        group-0 tables leave the prefix cache; a request that holds one keeps it."""
        tables = {name: self.block_ids(name)[0] for name, _ in columns}
        chosen: set[int] = set()
        for name, column in columns:
            table = tables[name]
            if column >= len(table) or table[column] == self.null_block:
                raise ScenarioError(
                    where,
                    f"column {column} of request {name!r}'s group-0 table holds no block "
                    f"(the table is {table}); a connector reports blocks the request holds",
                )
            chosen.add(table[column])
        self.manager.evict_blocks(chosen)
        kept = sorted(b for b in chosen if self.vllm.block_is_cached(self.manager, b))
        self.step_facts.append(
            (", ".join(sorted(tables)), Eviction(tuple(sorted(chosen)), tuple(kept)))
        )

    def _record_stats(self) -> None:
        """The step's ``make_prefix_cache_stats`` and ``usage``, with what its admissions
        looked up (new and preempted requests apart) and the blocks the live requests'
        tables hold (null block and a group's own pool left out)."""
        stats = self.vllm.prefix_cache_stats(self.manager)
        own_pool = {g for g, info in enumerate(self._groups) if GROUP_TYPES[info.type].own_pool}
        held = {
            block
            for name in self._running_names | self._loaded
            for group, ids in enumerate(self.block_ids(name))
            if group not in own_pool
            for block in ids
            if block != self.null_block
        }
        # Blocks popped at an in-flight finish are still taken until they go back.
        held |= {b.block_id for _, blocks, _ in self._deferred for b in blocks}
        held.discard(self.null_block)
        self.step_facts.append(
            (
                "-",
                PrefixStats(
                    stats,
                    tuple(self._stats_expected),
                    self._stats_reset,
                    len(held),
                    self.model.num_blocks,
                ),
            )
        )
        self._stats_expected = [0] * 6
        self._stats_reset = False

    def _record_kv_events(self) -> None:
        """The step's KV-cache events (a lookup's re-announcements left out) and what the
        pools cache at its end (judged by :mod:`kvconform.harness.checks.kv_events`)."""
        events = self.vllm.take_kv_cache_events(
            self.manager, leave_out={id(e) for e in self._reannouncements}
        )
        self._reannouncements.clear()
        cached = self.vllm.cached_block_counts(self.manager)
        self.step_facts.append(("-", StepEvents(tuple(events), cached)))

    def _record_handoffs(self) -> None:
        """The boundary states handed to a KV connector in the step, and what the step
        cached (judged by :mod:`kvconform.harness.checks.handoffs`)."""
        offers = self.vllm.take_boundary_state_offers(self.manager)
        offered_keys = tuple(
            self.vllm.cached_key(self.manager, block)
            for states in offers.values()
            for _, block, _ in states
        )
        after = self.vllm.boundary_states_cached(self.manager, self._handoff_groups)
        tables = {
            name: tuple(tuple(ids) for ids in self.block_ids(name))
            for name in self._running_names | self._loaded
        }
        self.step_facts.append(
            (
                "-",
                StepHandoffs(
                    tuple(self._handoff_groups),
                    frozenset(self._cached_states),
                    frozenset(after),
                    {name: tuple(states) for name, states in offers.items()},
                    offered_keys,
                    tables,
                    frozenset(self._freed_this_step),
                ),
            )
        )

    def schedule(self, call: Call, encoder_len: int, where: Location) -> int:
        """Allocate for one call; returns the tokens it did not compute (hit and external).

        A refusal (``allocate_slots`` returns None) is the scenario's problem when the
        floor's own arithmetic does not fit the pool (:class:`PoolExhausted`), and vLLM's
        when it does (:class:`StepDenied`, judged by the ``capacity`` check).
        """
        free = self.vllm.free_block_count(self.manager)
        before = self.block_ids(call.request)
        held = [len(ids) for ids in before]
        new_blocks, hit, hit_blocks, external = self._allocate(call, encoder_len, where)
        if new_blocks is None:
            raise self._refusal(call, encoder_len, where, free, held, hit, hit_blocks)
        if self.model.log_stats and call.first_chunk and hit_blocks is not None:
            self._record_admission(call, hit)
        if self._zeroing_groups is not None:
            self._record_zeroing(call, before, hit_blocks, hit + external)
        if hit_blocks is not None and self._retained_hit_groups:
            self._record_retained_hit(call, hit_blocks, hit + external)
        request = self._requests[call.request]
        self._scheduled[call.request] = (
            min(call.computed + call.scheduled, int(request.num_tokens)),
            call.scheduled,
        )
        request.num_computed_tokens = call.computed + call.scheduled
        if call.first_chunk:
            self._encoder_lens[call.request] = encoder_len
        self._last_calls[call.request] = call
        self._loaded.discard(call.request)
        if call.options.load_async:
            # Waiting for its KV (WAITING_FOR_REMOTE_KVS), not running.
            request.status = self._waiting
            self._loaded.add(call.request)
        else:
            request.status = self._running
            self._running_names.add(call.request)
        return hit + external

    def _record_admission(self, call: Call, hit: int) -> None:
        """What ``Scheduler.schedule`` does once it admits a request whose prefix cache it
        looked up: ``record_prefix_cache_stats(request, hit)``; and what the step's stats
        must then count, from the scenario (its prompt and outputs, whether it was
        preempted before)."""
        request = self._requests[call.request]
        self.manager.record_prefix_cache_stats(request, hit)
        # A request that skips reading the prefix cache looked nothing up: not counted.
        if self.model.enable_caching and call.request not in self._skips_reading:
            tokens = len(self._prompts[call.request]) + (
                self._outputs[call.request] - self._first_outputs[call.request]
            )
            at = 3 if call.request in self._ever_preempted else 0
            for offset, value in enumerate((1, tokens, hit)):
                self._stats_expected[at + offset] += value

    def _record_zeroing(
        self, call: Call, before: tuple[list[int], ...], hit_blocks: Any, valid_tokens: int
    ) -> None:
        """The blocks vLLM hands the worker to zero, per recording group, with what holds
        valid KV: a prefix hit's blocks and, under an asynchronous load, those holding
        loaded tokens (the scheduler's ``skip_zeroing_group_ids``, in releases that have
        it); judged by :mod:`kvconform.harness.checks.zeroing`."""
        assert self._zeroing_groups is not None
        zeroed = self.vllm.take_blocks_to_zero(self.manager, self._zeroing_groups)
        after = self.block_ids(call.request)
        hits = self.vllm.hit_block_ids(hit_blocks)
        loaded = bool(
            call.options.load_async and self.vllm.skips_zeroing_loaded_blocks(self.manager)
        )
        for group, recorded in zeroed.items():
            self.call_facts.append(
                (
                    call,
                    ZeroingList(
                        group,
                        self.model.groups[group].block_size,
                        tuple(before[group]),
                        tuple(after[group]),
                        tuple(recorded),
                        tuple(hits.get(group, ())),
                        loaded,
                        valid_tokens,
                    ),
                )
            )

    def _record_retained_hit(self, call: Call, hit_blocks: Any, covered: int) -> None:
        """What a group that keeps a longer prefix hit than the others (HiSparse's host
        source, ``retains_longer_hit``) adopted of it: the hit, the tokens the request now
        has computed (its local hit and the connector's), its table after the call
        (judged by :mod:`kvconform.harness.checks.allocator`)."""
        hits = self.vllm.hit_block_ids(hit_blocks)
        tokens = min(covered, self.model.max_model_len)
        after = self.block_ids(call.request)
        for group in self._retained_hit_groups:
            self.call_facts.append(
                (
                    call,
                    RetainedHit(
                        group,
                        self.model.groups[group].block_size,
                        tuple(hits.get(group, [])),
                        tokens,
                        tuple(after[group]),
                    ),
                )
            )

    def is_refused(self, call: Call, encoder_len: int, where: Location) -> bool:
        """Make a call the scenario says must be refused; whether ``allocate_slots`` did.

        A refused call leaves the request as it was, as the scheduler leaves it.
        """
        new_blocks, _, _, _ = self._allocate(call, encoder_len, where)
        return new_blocks is None

    def _refusal(
        self,
        call: Call,
        encoder_len: int,
        where: Location,
        free: int,
        held: list[int],
        hit: int,
        hit_blocks: Any,
    ) -> Exception:
        """Whose a refusal is: the floor's arithmetic for this call against the pool.

        New blocks the floor's arithmetic needs: per group, the columns after the call
        (:func:`~kvconform.model.floors.pool_columns`: up to computed + scheduled +
        lookahead) minus the columns the request holds and the prefix hit brings, plus
        the hit's blocks that sit in the free queue. An admission under full-sequence admission
        needs the whole sequence's columns too. The blocks it may use: the free ones
        minus ``reserved_blocks`` and, while another request runs, the watermark.
        """
        request = self._requests[call.request]
        evictable = (
            self.vllm.evictable_blocks(hit_blocks, self.null_block) if hit_blocks is not None else 0
        )
        cap = self.model.max_model_len
        tokens = min(call.computed + call.scheduled + self.floor_lookahead, cap)
        whole = min(request.num_tokens, cap)
        full = call.first_chunk and self._full_sequence_must_fit(call)
        need = full_need = evictable
        for info, have in zip(self._groups, held, strict=True):
            if GROUP_TYPES[info.type].own_pool:
                continue  # HiSparse's host source: not the device pool's blocks
            span = info.block_size * int(info.floor_args.get("dcp_world_size", 1))
            extra = int(info.floor_args.get("num_speculative_blocks", 0))
            rule, hit_columns = info.floor_rule, hit // info.block_size
            columns = pool_columns(rule, tokens, encoder_len, span, extra)
            new = max(0, columns - max(have, hit_columns))
            whole_new = 0
            if full:
                whole_columns = pool_columns(rule, whole, encoder_len, span, extra)
                whole_new = max(0, whole_columns - max(have, hit_columns))
            if rule.family == MAMBA_ALIGNED_STATE.family:  # its other columns are null
                most = aligned_state_call_blocks(
                    extra,
                    int(info.floor_args.get("num_prefill_checkpoint_blocks", 0)),
                    partial_hit=call.first_chunk and hit > 0,
                )
                new, whole_new = min(new, most), min(whole_new, most)
            need += new
            full_need += whole_new
        running = bool(self._running_names - {call.request})
        watermark = self.vllm.watermark_blocks(self.manager) if call.first_chunk and running else 0
        available = free - call.options.reserved_blocks - watermark
        kept = (
            f" ({free} free"
            + (f", {call.options.reserved_blocks} reserved" if call.options.reserved_blocks else "")
            + (f", {watermark} kept by the watermark" if watermark else "")
            + ")"
        )
        # Whose the refusal is: the scenario's when, by its own arithmetic, the blocks the
        # requests holding blocks may rightly hold and this call may rightly ask (the
        # whole sequence under full-sequence admission), a shared prefix counted once,
        # exceed the pool less the null block. What vLLM's tables hold beyond that, or
        # free blocks it refused to give, are vLLM's to answer for (StepDenied: the
        # capacity check), never bad input.
        least = self._rightful_blocks(
            call, max(encoder_len, self._encoder_lens.get(call.request, 0)), whole=full
        )
        others, shared = self._held_beside(call.request, least)
        mine = sum(least)
        usable = self.model.num_blocks - 1 - call.options.reserved_blocks - watermark
        vllm_short = need > available or (full and full_need > available)
        if vllm_short and mine + others - shared > usable:
            held_by = ", ".join(
                f"{name}: {sum(self._rightful_blocks(last))}"
                for name, last in self._last_calls.items()
                if name != call.request
            )
            what = (
                f"{mine} blocks for the whole sequence of {request.num_tokens} tokens "
                "(full-sequence admission, scheduler_reserve_full_isl)"
                if full
                else f"{mine} blocks after it"
            )
            beside = (
                f" beside the {others} the requests holding blocks may hold ({held_by}"
                + (f"; {shared} shared by a prefix" if shared else "")
                + ")"
                if others
                else ""
            )
            reserved = (
                (f", {call.options.reserved_blocks} reserved" if call.options.reserved_blocks else "")
                + (f", {watermark} kept by the watermark" if watermark else "")
            )
            return PoolExhausted(
                where,
                f"by the floor's own arithmetic {call.label} of request {call.request!r} needs "
                f"{what}{beside}, but the pool of {self.model.num_blocks} blocks has {usable} "
                f"to give (the null block kept back{reserved}); raise model.num_blocks, "
                "preempt or finish a request, or mark the call refused",
            )
        detail = f"{available} of {self.model.num_blocks} blocks to give{kept}"
        if vllm_short:
            # The scenario's arithmetic fits: what vLLM's tables hold is vLLM's to answer for.
            floors = others + mine - shared
            in_use = self.model.num_blocks - 1 - free
            detail += (
                f"; by the scenario's own arithmetic the requests holding blocks and this "
                f"call take at most {floors} of the {usable} usable (vLLM's tables hold "
                f"{in_use} before the call)"
            )
        return StepDenied(
            call,
            "allocate_slots",
            full_need if full and full_need > need else need,
            available,
            free,
            detail + (f"; the whole sequence needs {full_need}" if full else ""),
        )

    def _rightful_blocks(
        self, call: Call, encoder_len: int | None = None, *, whole: bool = False
    ) -> tuple[int, ...]:
        """Per group, the most device-pool blocks ``call``'s request may rightly hold after it
        by the scenario's arithmetic (``whole``: its whole sequence, full-sequence admission)."""
        request = self._requests[call.request]
        if encoder_len is None:
            encoder_len = self._encoder_lens.get(call.request, 0)
        computed, scheduled = call.computed, call.scheduled
        if whole:
            computed, scheduled = 0, max(int(request.num_tokens), call.computed + scheduled)
        lookahead = 0 if call.options.load_async else self.floor_lookahead
        return tuple(
            info.pool_blocks(computed, scheduled, lookahead, encoder_len)
            for info in self._groups
        )

    def _held_beside(self, name: str, least: tuple[int, ...]) -> tuple[int, int]:
        """The blocks the other requests holding blocks may rightly hold, and the most of
        them a shared prefix (prefix caching) lets two of them, or one of them and
        ``name`` holding ``least``, share."""
        held = {
            other: self._rightful_blocks(last)
            for other, last in self._last_calls.items()
            if other != name
        }
        total = sum(sum(blocks) for blocks in held.values())
        held[name] = least
        shared = 0
        if self.model.enable_caching:
            for other, least in held.items():
                source, tokens = self._shares.get(other, ("", 0))
                if source in held:
                    shared += sum(
                        min(info.shared_blocks(tokens), mine, theirs)
                        for info, mine, theirs in zip(
                            self._groups, least, held[source], strict=True
                        )
                    )
        return total, shared

    def _allocate(self, call: Call, encoder_len: int, where: Location) -> tuple[Any, int, Any, int]:
        """``allocate_slots`` for one call: its answer (``None``: refused), the hit, the
        hit's blocks and the external (connector) tokens."""
        request = self._requests[call.request]
        hit = 0
        blocks = None
        external = 0
        running = bool(self._running_names - {call.request})
        if call.request in self._loaded:
            # The first chunk after an asynchronous load: the scheduler admits the
            # request from the waiting queue again, with its loaded tokens computed
            # and no prefix-cache lookup.
            new_blocks = self.vllm.allocate_slots(
                self.manager,
                request,
                call.scheduled,
                num_new_computed_tokens=0,
                new_computed_blocks=self.manager.empty_kv_cache_blocks,
                num_lookahead_tokens=self.lookahead,
                has_scheduled_reqs=running,
            )
        elif call.first_chunk:
            # What the scheduler passes when nothing is cached: the manager's own
            # empty blocks (get_computed_blocks' answer without prefix caching).
            blocks = self.manager.empty_kv_cache_blocks
            external = call.options.external
            if call.options.connector is not None:
                blocks, hit, external = self._connector_lookup(call, request)
            elif self.model.enable_caching:
                queued = len(self.vllm.queued_kv_events(self.manager))
                blocks, hit = self.vllm.computed_blocks(
                    self.manager, request, call.computed + call.scheduled - 1
                )
                if self.model.kv_cache_events:
                    self._record_lookup_events(call, blocks, hit, queued)
            if call.options.expect_hit is not None:
                self.call_facts.append((call, AdmissionHit(hit, call.options.expect_hit)))
            new_tokens = call.scheduled - hit - external
            if call.options.load_async and new_tokens != 0:
                raise ScenarioError(
                    where,
                    f"an asynchronous load computes nothing, but the prefix-cache hit of {hit} "
                    f"tokens and external {external} are not {call.label}",
                )
            if new_tokens < 1 and not call.options.load_async:
                raise ScenarioError(
                    where,
                    f"the prefix-cache hit of {hit} tokens and external {external} leave "
                    f"none of {call.label} to compute; vLLM computes at least one token of it",
                )
            new_blocks = self.vllm.allocate_slots(
                self.manager,
                request,
                new_tokens,
                num_new_computed_tokens=hit,
                new_computed_blocks=blocks,
                # The scheduler allocates no lookahead for a step that only loads KV
                # (limit_lookahead_tokens), and caches the blocks once the load is done.
                num_lookahead_tokens=0 if call.options.load_async else self.lookahead,
                num_external_computed_tokens=external,
                delay_cache_blocks=call.options.load_async,
                skip_zeroing_group_ids=self._all_groups if call.options.load_async else (),
                num_encoder_tokens=encoder_len,
                full_sequence_must_fit=self._full_sequence_must_fit(call),
                reserved_blocks=call.options.reserved_blocks,
                # What the scheduler passes: whether any request is running.
                has_scheduled_reqs=running,
            )
        else:
            # Under asynchronous scheduling the request's earlier steps may still be in
            # flight: their tokens count as computed (the scheduler advances the count
            # when it schedules them) and in num_in_flight_tokens until their output is
            # applied (_update_after_schedule, update_from_output).
            request.num_in_flight_tokens = call.options.in_flight
            try:
                new_blocks = self.vllm.allocate_slots(
                    self.manager, request, call.scheduled, num_lookahead_tokens=self.lookahead
                )
            finally:
                request.num_in_flight_tokens = 0
        return new_blocks, hit, blocks, external

    def _record_lookup_events(self, call: Call, blocks: Any, hit: int, queued: int) -> None:
        """The events a prefix-cache lookup queued, and, where the request asks for
        ``kv_cache_report_mode`` "full" and got a hit, the hashes its hit's blocks are
        cached under (judged by :mod:`kvconform.harness.checks.kv_events`)."""
        emitted = self.vllm.queued_kv_events(self.manager)[queued:]
        self._reannouncements.extend(emitted)
        said = self.vllm.announced_blocks(emitted)
        reused = (
            {group: tuple(hashes) for group, hashes in self.vllm.hit_block_hashes(blocks).items()}
            if hit and call.request in self._report_full
            else None
        )
        self.call_facts.append((call, LookupEvents(hit, tuple(said), len(emitted), reused)))

    def _connector_lookup(self, call: Call, request: Any) -> tuple[Any, int, int]:
        """The local hit and external tokens of an admission through a KV connector that
        takes divergent local hybrid hits, as ``Scheduler.schedule`` decides them.

        The scheduler looks the hit up with ``get_computed_blocks_for_connector`` and
        shows the connector the hit cut to the scheduler's block grid; the connector
        (NixlConnector's ``get_num_new_matched_tokens``) answers the tokens it holds
        past that. A remote hit longer than the local sub-block tail replaces the tail
        (``truncate_computed_blocks``); a shorter one loads nothing. A hit that ran deeper
        than a lagging group, with nothing external behind it, is reconciled with
        ``get_computed_blocks``.
        """
        assert call.options.connector is not None
        limit = call.computed + call.scheduled - 1
        blocks, hit, diverged = self.vllm.connector_computed_blocks(self.manager, request, limit)
        tail = hit % self.model.scheduler_block_size
        aligned = hit - tail
        answer = max(0, call.options.connector - aligned)
        if tail and answer > tail:
            blocks = self.vllm.truncate_computed_blocks(self.manager, blocks, aligned)
            hit, external = aligned, answer
        elif tail:
            external = 0
        else:
            external = answer
        if diverged and external == 0:
            blocks, hit = self.vllm.computed_blocks(self.manager, request, limit)
        return blocks, hit, external

    def complete(self, call: Call) -> None:
        """What ``update_from_output`` does after the step: rollback and sample.

        After an asynchronous load the scheduler caches the loaded blocks and puts
        the request back in the waiting queue (``_update_waiting_for_remote_kv``).
        """
        request = self._requests[call.request]
        if call.options.load_async:
            # The scheduler calls it whether or not prefix caching is on (the manager
            # caches only with it): _update_waiting_for_remote_kv.
            self.vllm.cache_blocks(self.manager, request, request.num_computed_tokens)
            return
        request.num_computed_tokens -= call.rejected
        if call.sampled:
            first = self._outputs[call.request]
            self._outputs[call.request] = first + call.sampled
            request.append_output_token_ids(list(range(first, first + call.sampled)))
            if self.model.enable_caching:
                self.vllm.cache_blocks(self.manager, request, request.num_computed_tokens)

    def replay(
        self,
        name: str,
        computed: int,
        scheduled: int,
        prompt_len: int,
        encoder_len: int,
        where: Location,
        label: str = "",
    ) -> None:
        """Allocate for a step known only by its counts (a recorded warmup step).

        A request the allocator does not hold enters from the waiting queue with
        a prompt of ``prompt_len`` tokens; a running one has its computed count
        set to the recorded ``computed`` first. After the step it holds one
        sampled token past ``computed + scheduled``, as after a step whose drafts
        were all accepted.
        """
        first_chunk = name not in self._requests
        if first_chunk:
            self.add_request(RequestSpec(name, prompt_len), len(self._prompts))
        request = self._requests[name]
        request.num_computed_tokens = computed
        action = Action.PREFILL if first_chunk else Action.SPEC
        call = Call(name, action, computed, scheduled, first_chunk=first_chunk, label=label)
        self.schedule(call, encoder_len if first_chunk else 0, where)
        sampled = max(0, computed + scheduled + 1 - request.num_tokens)
        self.complete(replace(call, sampled=sampled))

    def _note_freed(self, name: str) -> None:
        if self._handoff_groups:
            self._freed_this_step.update(b for ids in self.block_ids(name) for b in ids)

    def preempt(self, name: str) -> None:
        self._note_freed(name)
        request = self._requests[name]
        self.manager.free(request)
        request.status = self._preempted
        request.num_computed_tokens = 0
        # Scheduler._preempt_request counts it; the prefix-cache stats tell such a
        # request's lookups apart.
        request.num_preemptions += 1
        self._ever_preempted.add(name)
        self._running_names.discard(name)
        self._last_calls.pop(name, None)

    def _record_finalized_tails(self, name: str) -> None:
        """The partial-tail boundary states a finishing request hands its connector
        (``finalize_partial_tail_offloads``), with the states cached in its tables and
        their cache keys (judged by :mod:`kvconform.harness.checks.handoffs`)."""
        request = self._requests[name]
        offers = self.vllm.finalize_partial_tail_offers(self.manager, request)
        if offers is None:
            return
        table = tuple(tuple(ids) for ids in self.block_ids(name))
        cached = tuple(
            state
            for state in self.vllm.boundary_states_cached(self.manager, self._handoff_groups)
            if state[1] in table[state[0]]
        )
        key = self.vllm.cached_key
        self.step_facts.append(
            (
                name,
                FinalizedTails(
                    tuple(offers),
                    table,
                    int(request.num_computed_tokens),
                    cached,
                    {block: key(self.manager, block) for _, block, _ in cached},
                    tuple(key(self.manager, block) for _, block, _ in offers),
                ),
            )
        )

    def finish(self, name: str) -> None:
        if self._handoff_groups:
            self._record_finalized_tails(name)
        self._note_freed(name)
        self.manager.free(self._requests[name])
        self._running_names.discard(name)
        self._last_calls.pop(name, None)
        self._finished.add(name)

    def forget(self, name: str) -> None:
        """Drop a finished request, so that its name can enter again (warmup passes)."""
        del self._requests[name]
        self._finished.discard(name)

    def block_ids(self, name: str) -> tuple[list[int], ...]:
        return tuple(self.manager.get_block_ids(name))

    def free_blocks(self) -> int:
        return self.vllm.free_block_count(self.manager)
