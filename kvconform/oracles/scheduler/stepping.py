"""The scheduler oracle's stepping: vLLM's scheduler for one scenario, stepped the way vLLM's
engine core steps it (``sync``, ``async``, ``overlapped``) until every request is served or
it stalls, with every release of blocks observed and each ``schedule()`` recorded."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.errors import NotOffered, PoolExhausted, ScenarioError
from kvconform.model.acceptance import AcceptanceStream
from kvconform.model.facts import DeferredRelease, HeldAfterAbortAll, ZeroingGroups
from kvconform.model.observations import (
    GroupInfo,
)
from kvconform.model.scenario import Scenario
from kvconform.oracles.live import OUTPUT_OFFSET, first_output_token
from kvconform.oracles.scheduler.config import build_scheduler
from kvconform.oracles.scheduler.inputs import (
    install_encoder_budget,
    new_requests,
    received_loads,
    started_loads,
)
from kvconform.oracles.scheduler.lifecycle import AppliedStep, Lifecycle
from kvconform.oracles.scheduler.queues import QueueSnapshot
from kvconform.oracles.scheduler.records import (
    AbortRecord,
    DeferredFreeRecord,
    FreeRecord,
    ResetRecord,
    ScheduledRequest,
    SchedulerRun,
    StepFact,
    StepRecord,
)
from kvconform.oracles.scheduler.sessions import Sessions
from kvconform.oracles.scheduler.stalls import stalled_run
from kvconform.oracles.scheduler.step_facts import (
    KvEventMirror,
    record_census,
    record_encoder_input_stats,
    record_encoder_step,
    record_zeroing,
)
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.calls import muted_vllm_logs, quiet_logs
from kvconform.oracles.vllm.scheduling import Scheduling

# Draft token ids sit above a request's outputs (the layout of kvconform.oracles.live),
# so no prefix-cache hit ever comes from a draft.
_DRAFT_OFFSET = 900_000

# A schedule() call that schedules nothing, with nothing in flight and no
# arrival to wait for, cannot change the scheduler's state; a few in a row mean
# the requests can never be served.
_STALL_STEPS = 3


# -- stepping --------------------------------------------------------------------------


class SchedulerOracle:
    """vLLM's scheduler for one scenario, with its requests, stepped to the end."""

    # The groups (their floor rules) and the floor's lookahead: set by run_scheduler.
    floors: Sequence[GroupInfo] | None = None
    floor_lookahead: int = 0

    def __init__(self, vllm: Vllm, scenario: Scenario, num_speculative_tokens: int) -> None:
        assert scenario.scheduler is not None
        self.vllm = vllm
        self.api = api = vllm.part(Scheduling)
        self.scenario = scenario
        self.limits = scenario.scheduler
        model, spec = scenario.model, scenario.speculative
        self.method = vllm.canonical_method(spec.method) if spec is not None else None
        self.num_spec = spec.num_speculative_tokens if spec is not None else 0
        built = build_scheduler(vllm, scenario, num_speculative_tokens, self.method)
        self.config, self.scheduler = built.config, built.scheduler
        block_size, hash_block_size = built.block_size, built.hash_block_size
        self.manager = self.scheduler.kv_cache_manager
        self.connector_hits = api.watch_connector_lookups(self.scheduler)
        self.run = SchedulerRun(
            scheduler_class=type(self.scheduler).__name__,
            mode=self.limits.mode,
            lookahead=api.lookahead_of(self.scheduler),
            config_lookahead=api.lookahead_of(self.config),
            prefill_lookahead=api.lookahead_of(self.config, "num_prefill_lookahead_tokens"),
            max_concurrent_batches=built.max_concurrent_batches,
            model_runner=built.model_runner,
            null_block=vllm.null_block_id(self.manager),
            max_num_scheduled_tokens=getattr(self.scheduler, "max_num_scheduled_tokens", None),
        )
        if any(r.load_failure == "request" for r in scenario.requests.values()):
            if not api.reports_failed_loads():
                raise NotOffered(
                    vllm.version,
                    "a KV load reported failed as a whole (KVConnectorOutput.failed_recving)",
                    "this release's connector output has no failed_recving",
                )
        self._observe_frees()
        self._events = KvEventMirror(self) if model.kv_cache_events else None
        # The newest step with scheduled tokens, and the step whose output is being applied.
        self._newest_busy: int | None = None
        self._applying: int | None = None
        # A P/D decode instance (a kv_consumer connector) with batches in flight: vLLM must
        # not return a request's blocks while a step that scheduled it may still write them
        # (Scheduler.defer_block_free); each request's last step with scheduled tokens.
        self._defers = self.limits.overlapped and any(
            r.remote_prefill for r in scenario.requests.values()
        )
        self._last_busy: dict[str, int] = {}
        # Whether vLLM defers frees (Scheduler.defer_block_free: a kv_consumer connector and
        # more than one batch, in lockstep too), where its pops and drains are observed.
        self._pool_defers = api.observe_deferred_frees(
            self.scheduler, self._deferred_pop, self._deferred_drain
        )
        install_encoder_budget(self)
        hasher = None
        if model.enable_caching:
            hasher = vllm.block_hasher(
                hash_block_size, api.lookahead_of(self.config, "num_hash_lookahead_tokens") or 0
            )
        self._pending = sorted(
            scenario.requests.values(),
            key=lambda r: (r.arrival, list(scenario.requests).index(r.name)),
        )
        self._requests = new_requests(vllm, scenario, hasher, block_size)
        self._acceptance = {
            name: AcceptanceStream(req.acceptance, name) for name, req in scenario.requests.items()
        }
        self._next_output = {
            name: first_output_token(i) for i, name in enumerate(scenario.requests)
        }
        # The order the engine handed requests to the scheduler (FCFS's arrival), and the
        # rank of each Request.arrival_time (the priority policy's tie-break).
        self._added: dict[str, int] = {}
        self._stamps = {
            name: rank
            for rank, name in enumerate(
                sorted(self._requests, key=lambda n: self._requests[n].arrival_time)
            )
        }
        self._started: set[str] = set()  # scheduled at least once
        self._restart: set[str] = set()  # preempted, not scheduled since
        # Requests whose blocks vLLM freed since the last schedule()'s zeroing list.
        self.freed_since_zeroing: set[str] = set()
        self._remote = {name for name, req in scenario.requests.items() if req.remote_prefill}
        self._loading: dict[str, int] = {}  # KV loads in flight: steps until received
        self._loaded: set[str] = set()  # began loading remote KV, not scheduled since
        # The groups whose new blocks vLLM zeroes (None: it zeroes nothing).
        self._zeroed_groups = vllm.recording_groups(self.manager)
        self.run.zeroing.append(
            StepFact(
                0,
                "-",
                ZeroingGroups(
                    tuple(self._zeroed_groups or ()), vllm.zeroes_new_blocks(self.manager)
                ),
            )
        )
        # (step, request) of the client's aborts, in order.
        self._aborts = sorted(
            (req.abort_at, name)
            for name, req in scenario.requests.items()
            if req.abort_at is not None
        )
        self._resets = list(self.limits.resets)
        # (step, paused) switches of the engine's pause for new requests, in order.
        self._pause_switches = [
            (step, paused, pause.mode == "abort" and paused)
            for pause in self.limits.pauses
            for step, paused in ((pause.at, True), (pause.resume_at, False))
        ]
        self._paused = False
        self._lifecycle = Lifecycle(self)
        self._sessions = Sessions(self, hasher)
        self._step = 0  # schedule() calls made (and skipped while idle before an arrival)
        self._current = 0  # the ongoing or latest schedule() call

    # -- observation --------------------------------------------------------------

    def _observe_frees(self) -> None:
        manager, run, vllm = self.manager, self.run, self.vllm
        free = manager.free

        def recording_free(request: Any) -> Any:
            rid = request.request_id
            held = tuple(list(ids) for ids in manager.get_block_ids(rid))
            before = vllm.free_block_count(manager)
            result = free(request)
            kind = (
                ("abort" if self.api.is_aborted(request) else "finish")
                if request.is_finished()
                else "preempt"
            )
            if kind != "preempt":
                run.finished.add(rid)
                self._lifecycle.ended(request)
            else:
                self._restart.add(rid)
            self.freed_since_zeroing.add(rid)
            self._record_release(rid, kind, before, vllm.free_block_count(manager))
            self._sessions.released(rid, self._current, kind)
            run.events.append(
                FreeRecord(
                    self._current,
                    rid,
                    kind,
                    held,
                    before,
                    vllm.free_block_count(manager),
                    tuple(list(ids) for ids in manager.get_block_ids(rid)),
                    rid in self._loading,
                )
            )
            return result

        # An instance attribute: the scheduler calls self.kv_cache_manager.free.
        manager.free = recording_free

    def _record_release(self, rid: str, kind: str, before: int, after: int) -> None:
        """Blocks that went back to the pool under a scheduler that defers frees, with the
        steps that may still write them (judged by ``checks.lifecycle``)."""
        if not self._defers:
            return
        processed = -1 if self._applying is None else self._applying
        self.run.lifecycle.append(
            StepFact(
                self._current,
                rid,
                DeferredRelease(kind, before, after, self._last_busy.get(rid), processed),
            )
        )

    def _deferred_pop(self, request: Any, held: tuple[list[int], ...]) -> None:
        """vLLM took a request's blocks out of its table without returning them: a finished
        request's, or (releases before 0.30.0, which preempt a request whose step is in
        flight rather than give up the call) a preempted one's, whose status is still
        RUNNING when ``_preempt_request`` frees its blocks."""
        rid = request.request_id
        if request.is_finished():
            kind = "abort" if self.api.is_aborted(request) else "finish"
            self.run.finished.add(rid)
            self._lifecycle.ended(request)
        else:
            kind = "preempt"
            self._restart.add(rid)
            self.freed_since_zeroing.add(rid)
        self._sessions.released(rid, self._current, kind)
        self.run.deferred_frees.append(
            DeferredFreeRecord(self._current, rid, kind, held, self._newest_busy)
        )

    def _deferred_drain(self, returned: list[tuple[list[int], int, int]]) -> None:
        """vLLM returned deferred blocks to the pool: match them to the requests' (or to a
        block copy's retained ends).

        Both sides without the null block: a request's table holds it where a sliding
        window dropped blocks, and ``pop_blocks_for_free`` hands the table over as it is
        before 0.33.0 (from 0.33.0 it trims the null head, ``trim_null_head``), so the
        drain returns it too (``free_blocks`` skips it)."""
        null = self.run.null_block
        for block_ids, before, after in returned:
            wanted = set(block_ids)
            wanted.discard(null)
            for records in (self.run.deferred_frees, self.run.retained_copies):
                found = next(
                    (
                        index
                        for index, record in enumerate(records)
                        if record.returned is None
                        and {b for ids in record.held for b in ids if b != null} == wanted
                    ),
                    None,
                )
                if found is not None:
                    records[found] = records[found]._replace(
                        returned=self._applying, free_before=before, free_after=after
                    )
                    break

    def _record(self, output: Any, in_flight: int) -> list[tuple[str, int | None]]:
        """Record one schedule() and decide the fabricated output of each request."""
        drafts = self.api.scheduled_drafts(output)
        rows = []
        answers: list[tuple[str, int | None]] = []
        loading_now: set[str] = set()
        for load in started_loads(self):
            loading_now.add(load.request)
            self._lifecycle.loaded(load)
        for rid, scheduled in output.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            computed = int(request.num_computed_tokens) - scheduled
            if rid not in self._started:
                phase = "loaded" if rid in self._loaded else "new"
            elif rid in self._restart:
                phase = "resumed"
            elif self._sessions.resuming(rid):
                phase = "turn"  # a streaming session's next turn, on the KV it kept
            else:
                phase = "running"
            self._started.add(rid)
            self._restart.discard(rid)
            if scheduled:
                self._last_busy[rid] = self._step
            num_drafts = len(drafts.get(rid, ()))
            chunk = bool(request.is_prefill_chunk)
            accepted = (
                None if chunk else self._acceptance[rid].next(num_drafts) if num_drafts else 0
            )
            answers.append((rid, accepted))
            rows.append(
                ScheduledRequest(
                    rid,
                    phase,
                    computed,
                    scheduled,
                    num_drafts,
                    computed if phase not in ("running", "turn") else 0,
                    int(request.num_tokens),
                    int(request.num_prompt_tokens),
                    chunk,
                    accepted,
                    tuple(list(ids) for ids in self.manager.get_block_ids(rid)),
                    int(getattr(request, "replay_start", 0) or 0),
                )
            )
        self.run.events.append(
            StepRecord(self._step, tuple(rows), in_flight, self.vllm.free_block_count(self.manager))
        )
        self._lifecycle.scheduled(rows)
        self._sessions.scheduled(self._step, rows)
        record_zeroing(self, output, rows, loading_now)
        record_census(self)
        record_encoder_step(self, output, rows)
        record_encoder_input_stats(self, output)
        return answers

    # -- the engine loop ----------------------------------------------------------

    def _admit(self) -> None:
        while self._pending and self._pending[0].arrival <= self._step:
            name = self._pending.pop(0).name
            self._added[name] = len(self._added)
            self.scheduler.add_request(self._requests[name])
        self._sessions.add_chunks(self._step)
        while self._pause_switches and self._pause_switches[0][0] <= self._step:
            _, self._paused, abort = self._pause_switches.pop(0)
            if abort:
                self._current = self._step
                self.api.abort_all(self.scheduler)
                # Only a request whose KV load is in flight keeps its blocks until it is done.
                for rid in sorted(set(self.scheduler.requests) - set(self._loading)):
                    self.run.lifecycle.append(StepFact(self._step, rid, HeldAfterAbortAll()))
            self.api.pause_new_requests(self.scheduler, self._paused)
        # The client's aborts, as EngineCore.abort_requests applies them between steps.
        while self._aborts and self._aborts[0][0] <= self._step:
            _, rid = self._aborts.pop(0)
            request = self.scheduler.requests.get(rid)
            if request is None or request.is_finished():
                continue  # finished before the abort arrived: nothing to abort
            self.run.events.append(AbortRecord(self._step, rid, self.api.status_name(request)))
            self.api.abort(self.scheduler, rid)
        while self._resets and self._resets[0].at <= self._step:
            reset = self._resets.pop(0)
            self._current = self._step
            done = self.api.reset_prefix_cache(self.scheduler, reset.running, reset.connector)
            self._lifecycle.reset(done, reset.connector)
            self.run.resets.append(
                ResetRecord(
                    self._step, reset.running, done, reset.succeeds, reset.line, reset.connector
                )
            )

    def _next_arrival(self) -> int | None:
        """The next schedule() call before which a request or a session's chunk arrives."""
        times = [self._pending[0].arrival] if self._pending else []
        if self._pause_switches:
            times.append(self._pause_switches[0][0])
        chunk = self._sessions.next_chunk()
        return min(times + ([chunk] if chunk is not None else []), default=None)

    def _model_output(self, answers: list[tuple[str, int | None]]) -> Any:
        received, failed, invalid = received_loads(self)
        self._lifecycle.received(received)
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for rid, accepted in answers:
            req_ids.append(rid)
            if accepted is None:
                sampled.append([])  # a prefill chunk inside the prompt samples nothing
                continue
            first = self._next_output[rid]
            self._next_output[rid] = first + 1 + accepted
            sampled.append(self._lifecycle.sampled(rid, list(range(first, first + 1 + accepted))))
            self._sessions.sampled(rid, 1 + accepted)
        return self.api.model_runner_output(req_ids, sampled, received, failed, invalid)

    def _feed_drafts(self, output: Any) -> None:
        """What ``EngineCore.post_step`` does for a synchronous scheduler."""
        if not self.num_spec or self.api.skips_drafts(output):
            return
        count = self.api.drafts_per_step(output, self.num_spec)
        # The runner's drafts cover its whole batch (take_draft_token_ids), a request that
        # finished in this step included: vLLM skips it (update_draft_token_ids).
        req_ids = list(output.num_scheduled_tokens)
        drafts = [
            [self._next_output[rid] - OUTPUT_OFFSET + _DRAFT_OFFSET + i for i in range(count)]
            for rid in req_ids
        ]
        self.scheduler.update_draft_token_ids(self.api.draft_token_ids(req_ids, drafts))

    def step_to_end(self) -> SchedulerRun:
        scheduler, vllm = self.scheduler, self.vllm
        sync = self.limits.mode == "sync"
        size = self.run.max_concurrent_batches if self.limits.overlapped else 1
        queue: deque[tuple[Any, Any, AppliedStep]] = deque()
        idle_since: int | None = None
        while True:
            self._admit()
            # A KV load in flight (an aborted request's included) is work until received.
            if scheduler.has_requests() or self._loading:
                if self._step >= self.limits.max_steps:
                    raise ScenarioError(
                        self.limits.where or self.scenario.where.at("scheduler"),
                        f"requests still unfinished after max_steps {self.limits.max_steps} "
                        "schedule() calls; raise scheduler.max_steps or shorten the requests",
                    )
                in_flight = len(queue)
                self._current = self._step
                queues = QueueSnapshot(self)
                output = scheduler.schedule()
                if output.total_num_scheduled_tokens > 0:
                    self._newest_busy = self._step
                copies = self.api.block_copies(output) if self._pool_defers else []
                if copies:
                    # The worker reads both ends of each copy in this step: where vLLM defers
                    # frees, they go back to the pool only once it is processed, the step's
                    # copies as one deferred entry (Scheduler._free_cow_retained_blocks).
                    self.run.retained_copies.append(
                        DeferredFreeRecord(
                            self._current,
                            "",
                            "copy",
                            tuple([source, copy] for source, copy in copies),
                            self._newest_busy,
                        )
                    )
                queues.record(self, output, in_flight)
                answers = self._record(output, in_flight)
                self._step += 1
                # A KV load in flight makes progress without scheduled tokens. A step in
                # flight that scheduled nothing does not: its output changes no request
                # (overlapped mode keeps empty steps in flight too, and a stall there
                # would otherwise never be seen, ending at max_steps).
                executed = output.total_num_scheduled_tokens > 0 or bool(self._loading)
                busy_in_flight = any(
                    queued.total_num_scheduled_tokens > 0 for queued, _, _ in queue
                )
                if executed or busy_in_flight:
                    idle_since = None
                elif idle_since is None:
                    idle_since = self._step - 1
                if idle_since is not None and self._step - idle_since >= _STALL_STEPS:
                    if self._next_arrival() is None:
                        stalled = stalled_run(self, idle_since)
                        if isinstance(stalled, PoolExhausted):
                            raise stalled
                        self.run.stall = stalled
                        break
                    self._step = max(self._step, self._next_arrival() or 0)
                queue.appendleft((output, self._model_output(answers), self._lifecycle.step()))
                if len(queue) < size and (executed or scheduler.has_requests()):
                    continue
            elif not queue:
                if self._next_arrival() is None:
                    break
                # Idle until the next arrival: the engine does not schedule meanwhile.
                self._step = max(self._step, self._next_arrival() or 0)
                continue
            output, model_output, applied = queue.pop()
            # vLLM logs a KV load failure the scenario states as an error ("Failing 1
            # request(s) due to KV load failure"): the run's verdict says what happened.
            self._applying = applied.step
            with muted_vllm_logs(logging.ERROR):
                result = scheduler.update_from_output(output, model_output)
            self._lifecycle.applied(applied, result)
            if self._events is not None:
                self._events.published(applied.step)
            self._sessions.applied()
            if sync:
                self._feed_drafts(output)
        self.run.final_free_blocks = vllm.free_block_count(self.manager)
        self._lifecycle.ended_run()
        # As the engine core shuts down: the scheduler's KV connector with it.
        with quiet_logs():
            scheduler.shutdown()
        return self.run


def run_scheduler(
    vllm: Vllm,
    scenario: Scenario,
    num_speculative_tokens: int,
    floors: Sequence[GroupInfo] | None = None,
    floor_lookahead: int = 0,
    started: Callable[[SchedulerRun], None] | None = None,
) -> SchedulerRun:
    """Build vLLM's scheduler for a ``kind: scheduler`` scenario and step it to the end.

    ``floors``: the groups (their floor rules), with ``floor_lookahead``, to tell a stall that is
    the scenario's (its pool too small) from one that is vLLM's (:class:`StallRecord`).
    ``started``: given the run being recorded before the first step, so that what it holds
    survives an exception out of a step (the driver reports the steps up to a crash).
    """
    oracle = SchedulerOracle(vllm, scenario, num_speculative_tokens)
    oracle.floors, oracle.floor_lookahead = floors, floor_lookahead
    if started is not None:
        started(oracle.run)
    return oracle.step_to_end()
