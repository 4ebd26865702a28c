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

:class:`LiveAllocator` drives the manager here; what it records is in
:mod:`kvconform.oracles.live_facts`, whose a refusal is in
:mod:`kvconform.oracles.live_refusals`, and the state both read in
:mod:`kvconform.oracles.live_state`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.model.facts import AdmissionHit, DefaultDisagreement, Payload, ZeroingGroups
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Action, Call, ModelSpec, RequestSpec
from kvconform.oracles.live_facts import LiveFacts
from kvconform.oracles.live_refusals import LiveRefusals
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


class LiveAllocator(LiveFacts, LiveRefusals):
    """One ``KVCacheManager`` shared by all requests of a scenario."""

    def __init__(
        self, vllm: Vllm, model: ModelSpec, trajectory: Trajectory, *, as_scheduler: bool = True
    ) -> None:
        """A manager for ``model``'s pool and groups, allocating with ``run``'s lookahead.

        ``as_scheduler``: built with what vLLM's scheduler passes for its
        speculative config (``Vllm.manager_options``: EAGLE block drop, prefill
        lookahead, lookahead block hashes); off for a warmup replay, whose
        requests never came through a scheduler. Such a replay makes no prefix-cache
        lookup either: the warmup hands each request blocks for every token it computes
        (its hand-built ``SchedulerOutput`` has no hit), so a hit the replay took -- the
        null columns ``ChunkedLocalAttentionManager.find_longest_cache_hit`` returns before
        the last token's chunk, another warmup request's cached blocks of the same token
        ids -- would hold tokens the warmup's step computes as cached.
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
        self._looks_up_prefix_cache = as_scheduler
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
        # The calling request's tables as the last call to schedule left them.
        self.table_after_call: tuple[list[int], ...] = ()
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
        self._finished_at_census = 0
        self._census_tables = {}
        # Each request's tables as its last call left them (a tuple of fresh lists).
        self._tables_after: dict[str, tuple[list[int], ...]] = {}
        self._touched = set()
        self._read_table = vllm.table_reader(self.manager)
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

    def schedule(self, call: Call, encoder_len: int, where: Location) -> int:
        """Allocate for one call; returns the tokens it did not compute (hit and external).

        A refusal (``allocate_slots`` returns None) is the scenario's problem when the
        floor's own arithmetic does not fit the pool (:class:`PoolExhausted`), and vLLM's
        when it does (:class:`StepDenied`, judged by the ``capacity`` check).
        """
        free = self.vllm.free_block_count(self.manager)
        # What the request's last call left (its table changes by its own calls only).
        before = self._tables_after.get(call.request) or self._no_tables()
        new_blocks, hit, hit_blocks, external = self._allocate(call, encoder_len, where)
        if new_blocks is None:
            # ``before`` holds lists get_block_ids built for this oracle: the call left
            # them as they were, so what the request held is counted only here.
            held = [len(ids) for ids in before]
            raise self._refusal(call, encoder_len, where, free, held, hit, hit_blocks)
        # The request's tables after the call, read once: the zeroing and retained-hit
        # records and the driver's observations all read this one answer.
        self.table_after_call = after = self._tables_after[call.request] = self.block_ids(
            call.request
        )
        if self.model.log_stats and call.first_chunk and hit_blocks is not None:
            self._record_admission(call, hit)
        if self._zeroing_groups is not None:
            self._record_zeroing(call, before, after, hit_blocks, hit + external)
        if hit_blocks is not None and self._retained_hit_groups:
            self._record_retained_hit(call, after, hit_blocks, hit + external)
        request = self._requests[call.request]
        self._scheduled[call.request] = (
            min(call.computed + call.scheduled, int(request.num_tokens)),
            call.scheduled,
        )
        request.num_computed_tokens = call.computed + call.scheduled
        if call.first_chunk:
            self._encoder_lens[call.request] = encoder_len
        self._last_calls[call.request] = call
        self._touched.add(call.request)
        self._loaded.discard(call.request)
        if call.options.load_async:
            # Waiting for its KV (WAITING_FOR_REMOTE_KVS), not running.
            request.status = self._waiting
            self._loaded.add(call.request)
        else:
            request.status = self._running
            self._running_names.add(call.request)
        return hit + external

    def is_refused(self, call: Call, encoder_len: int, where: Location) -> bool:
        """Make a call the scenario says must be refused; whether ``allocate_slots`` did.

        A refused call leaves the request as it was, as the scheduler leaves it.
        """
        new_blocks, _, _, _ = self._allocate(call, encoder_len, where)
        if new_blocks is not None:
            # Granted after all: the request holds what vLLM gave it, and the pool's census
            # at the end of the step counts its table (the driver stops after this step).
            self._running_names.add(call.request)
            self._touched.add(call.request)
            self._tables_after.pop(call.request, None)
        return new_blocks is None

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
            elif self.model.enable_caching and self._looks_up_prefix_cache:
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

    def preempt(self, name: str) -> None:
        self._note_freed(name)
        self._tables_after.pop(name, None)
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

    def finish(self, name: str) -> None:
        if self._handoff_groups:
            self._record_finalized_tails(name)
        self._note_freed(name)
        self._tables_after.pop(name, None)
        self.manager.free(self._requests[name])
        self._running_names.discard(name)
        self._last_calls.pop(name, None)
        self._finished.add(name)

    def forget(self, name: str) -> None:
        """Drop a finished request, so that its name can enter again (warmup passes)."""
        del self._requests[name]
        self._tables_after.pop(name, None)
        self._finished.discard(name)
