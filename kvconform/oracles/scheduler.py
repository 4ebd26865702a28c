"""The scheduler party: vLLM's own ``Scheduler`` / ``AsyncScheduler``, stepped offline.

In allocator mode a scenario decides every ``allocate_slots`` call. In
scheduler mode vLLM's scheduler decides chunking, admission, preemption and
the lookahead, exactly as in production, and this module records what it
reserved. It

* writes tiny *config-only* model folders under kvconform's cache (a Llama
  config; a MiMo config for MTP, whose target carries the MTP modules; a
  one-layer draft for EAGLE and draft models; a DFlash draft config): no
  weights, no tokenizer, no download;
* builds the ``VllmConfig`` an engine with the scenario's limits would build.
  vLLM's first ``ModelConfig`` / ``SpeculativeConfig`` of a process inspects
  model architectures (seconds; cached on disk under ``VLLM_CACHE_ROOT``, which
  :func:`kvconform.oracles.vllm.load` points at kvconform's cache), so
  they are built once per process and handed out as deep copies;
* steps the scheduler the way vLLM's engine core does: ``sync`` like
  ``EngineCore.step`` (schedule, output, then the drafter's next drafts through
  ``update_draft_token_ids``); ``async`` the same with ``AsyncScheduler``,
  which inserts draft placeholders itself; ``overlapped`` like
  ``EngineCore.step_with_batch_queue``, scheduling step N+1 before step N's
  output is applied;
* answers every step with a fabricated ``ModelRunnerOutput``: nothing for a
  prefill chunk that ends inside the prompt, otherwise one sampled token plus
  the accepted drafts, as the request's acceptance pattern says;
* records, right after every ``schedule()``, each scheduled request's counts as
  the scheduler keeps them and the block ids it holds per group, and every
  release of blocks (the manager's ``free``, wrapped to observe it, not to
  change it) with the pool's free count around it;
* for a request prefilled remotely (``remote_prefill``), runs vLLM's
  ``NixlConnector`` on the scheduler side (a P/D decode instance): the
  ``schedule()`` that admits it allocates blocks for the prompt's KV and parks it
  in ``WAITING_FOR_REMOTE_KVS``, which is recorded with the blocks it holds
  then; the fabricated output of the ``remote_prefill``-th step from there
  reports the transfer received (``finished_recving``), as the worker would;
* with ``scheduler.kv_connector: decode_bench``, runs vLLM's ``DecodeBenchConnector``, which
  loads each new request's prompt synchronously in the step that admits it;
* for requests with multimodal inputs (``mm_inputs``), gives the scheduler an encoder budget
  and cache as vLLM's own scheduler tests do on a text model, and follows the worker's
  encoder cache through each step's ``scheduled_encoder_inputs`` and
  ``free_encoder_mm_hashes`` (:meth:`SchedulerOracle._record_encoder_step`).

The driver (:mod:`kvconform.harness.drivers.scheduler`) turns these records into
observations. What the fabricated output does not model is listed in
``docs/scheduler-mode.md``.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from kvconform.errors import NotOffered, PoolExhausted, ScenarioError, VllmUnavailable
from kvconform.model.acceptance import AcceptanceStream
from kvconform.model.facts import (
    DeferredRelease,
    EncoderInputStats,
    EncoderStep,
    HeldAfterAbortAll,
    MmInput,
    PausedAdmission,
    Payload,
    PublishedEvents,
    RequestEnd,
    RunEnded,
    SessionReleased,
    SessionTurn,
    SpecDecodeMetrics,
    StepStats,
    StepZeroingList,
    StopApplied,
)
from kvconform.model.floors import pool_columns
from kvconform.model.methods import method_for
from kvconform.model.observations import GroupInfo
from kvconform.model.scenario import RequestSpec, Scenario, StreamChunk
from kvconform.model.tiny_model import SCHEDULER_TARGET
from kvconform.oracles.live import ID_STRIDE, OUTPUT_OFFSET, first_output_token, prompt_tokens
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.tiny_models import model_folder
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.calls import quiet_logs
from kvconform.oracles.vllm.messages import first_line
from kvconform.oracles.vllm.scheduling import Scheduling

# Draft token ids sit above a request's outputs (the layout of kvconform.oracles.live),
# so no prefix-cache hit ever comes from a draft.
_DRAFT_OFFSET = 900_000

# The token a request's stop_at-th output is, by what stops it (RequestSpec.stop_with):
# below every prompt, output and draft id, so nothing else ever samples it.
_STOP_TOKEN_IDS = {"stop_token": 7, "eos": 2}

# A schedule() call that schedules nothing, with nothing in flight and no
# arrival to wait for, cannot change the scheduler's state; a few in a row mean
# the requests can never be served.
_STALL_STEPS = 3


# -- configuration, built once per process ---------------------------------------------

_CONFIGS: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def model_and_speculative_config(
    vllm: Vllm, scenario: Scenario, method: str | None
) -> tuple[Any, Any]:
    """``(ModelConfig, SpeculativeConfig | None)`` for a scenario: fresh copies of cached ones."""
    spec = scenario.speculative
    assert scenario.scheduler is not None
    entry = method_for(method)
    target_model = entry.target if entry is not None else SCHEDULER_TARGET
    extra = dict(target_model.extra)
    if entry is not None and entry.mtp_modules:
        extra["num_nextn_predict_layers"] = scenario.scheduler.num_nextn_predict_layers
    if spec is not None and not spec.sample_from_anchor:
        extra["sample_from_anchor"] = False  # DSpark's fill-in layout
    target = str(model_folder(replace(target_model, extra=extra)))
    draft_model = entry.draft if entry is not None and spec is not None else None
    draft = str(model_folder(draft_model)) if draft_model is not None else None
    max_model_len = scenario.model.max_model_len
    k = spec.num_speculative_tokens if spec is not None else 0
    # SpeculativeConfig's switch back to EAGLE's trailing-block drop (0.33); releases
    # without it always drop under prefix caching.
    no_hashes = spec is not None and spec.disable_lookahead_block_hashes
    key = (vllm.location, target, draft, method, k, max_model_len, no_hashes)
    if key not in _CONFIGS:
        api = vllm.part(Scheduling)
        try:
            model_config = api.model_config(target, max_model_len)
        except Exception as exc:  # noqa: BLE001 - vLLM refusing the tiny model
            raise VllmUnavailable(
                vllm.version, "a ModelConfig for kvconform's config-only model", first_line(exc)
            ) from None
        speculative = None
        if spec is not None and method is not None:
            options = dict(entry.speculative_options) if entry is not None else {}
            if draft is not None:
                options["model"] = draft
            if no_hashes:
                options["disable_lookahead_block_hashes"] = True
            try:
                speculative = api.model_speculative_config(model_config, method, k, **options)
            except Exception as exc:  # noqa: BLE001 - the method cannot be built here
                # Not NotOffered: what fails here is this machine as often as the release
                # (a drafter's package missing, the architecture inspection's subprocess).
                raise VllmUnavailable(
                    vllm.version,
                    f"a SpeculativeConfig for method {method!r} in scheduler mode",
                    first_line(exc),
                ) from None
        _CONFIGS[key] = (model_config, speculative)
    # One deepcopy of the pair keeps the draft's reference to its target config.
    return copy.deepcopy(_CONFIGS[key])


# -- records ---------------------------------------------------------------------------


class ScheduledRequest(NamedTuple):
    """One request's part in one ``schedule()``, as the scheduler counted it."""

    request: str
    phase: str  # "new" (first admission), "resumed" (after preemption) or "running"
    computed: int  # tokens computed before the step (prefix hit and in-flight steps included)
    scheduled: int  # tokens scheduled, drafts included
    drafts: int  # draft tokens among them
    cached: int  # prefix-cache hit adopted at admission (new / resumed only)
    known_tokens: int  # prompt + outputs the scheduler has applied so far
    prompt_len: int
    prefill_chunk: bool  # the step ends inside the known tokens: it samples nothing
    accepted: int | None  # drafts the fabricated output accepts; None: samples nothing
    block_ids: tuple[list[int], ...]
    # SWA bounded replay (a group with prefix_replay_tokens): the position from which
    # the request's sliding-window KV exists (Request.replay_start); 0: none.
    replay_start: int = 0


class LoadRecord(NamedTuple):
    """A request began loading its KV asynchronously (``WAITING_FOR_REMOTE_KVS``)."""

    step: int
    request: str
    tokens: int  # num_computed_tokens once loaded: the local prefix hit plus the remote KV
    block_ids: tuple[list[int], ...]
    # Per group, the blocks the connector writes the remote KV into: those of the
    # request's table that hold no cached KV (its local prefix hit's blocks are cached;
    # vLLM caches the loaded ones only once the load is done, delay_cache_blocks).
    loading: tuple[list[int], ...] = ()


class LoadDoneRecord(NamedTuple):
    """The worker reported a request's KV load received (``finished_recving``)."""

    step: int  # the schedule() whose model output carries the report
    request: str


class AbortRecord(NamedTuple):
    """The client aborted a request: ``Scheduler.finish_requests(..., FINISHED_ABORTED)``."""

    step: int  # the schedule() call it came before
    request: str
    status: str  # the request's status when it was aborted (e.g. WAITING_FOR_REMOTE_KVS)


class ResetRecord(NamedTuple):
    """``Scheduler.reset_prefix_cache`` was called before a schedule(), and what it answered."""

    step: int
    running: bool
    succeeded: bool
    succeeds: bool  # what the scenario states
    line: int | None
    connector: bool = False  # reset_connector: the KV connector's cache too


class DeferredFreeRecord(NamedTuple):
    """A request's blocks that vLLM took out of its table while a step that may write them
    was in flight (``Scheduler.defer_block_free``), and when they went back to the pool.

    ``fence``: the newest step with scheduled tokens when they were taken, whose output
    vLLM must process before it returns them (its ``sched_step_seq`` fence); ``returned``:
    the step whose ``update_from_output`` returned them (None: not returned by the end).
    """

    step: int  # the schedule() call the blocks were taken out before, or during
    request: str
    kind: str  # "finish" or "abort"
    held: tuple[list[int], ...]
    fence: int | None
    returned: int | None = None
    free_before: int = 0
    free_after: int = 0


class StepRecord(NamedTuple):
    step: int
    requests: tuple[ScheduledRequest, ...]
    in_flight: int  # steps scheduled earlier whose output was not applied yet
    free_blocks: int


class StallRecord(NamedTuple):
    """The scheduler scheduled nothing while a waiting request fits the pool by the floor."""

    step: int  # the schedule() call it stopped scheduling at
    request: str
    floor_need: int
    available: int
    free: int
    detail: str


class FreeRecord(NamedTuple):
    """The scheduler released a request's blocks (``KVCacheManager.free``)."""

    step: int  # the latest schedule() at the time
    request: str
    kind: str  # "finish", "abort" (the client aborted it) or "preempt"
    held: tuple[list[int], ...]
    free_before: int
    free_after: int
    held_after: tuple[list[int], ...]
    # The fabricated worker was still loading the request's KV into these blocks (an
    # asynchronous load not reported received yet).
    loading: bool = False


class StepFact(NamedTuple):
    """What vLLM's scheduler did at a step, as a fact for check ``sanity``
    (:mod:`kvconform.model.facts`): its zeroing list; the worker's encoder work; what
    ``update_from_output`` makes of an output (a stop, ``SchedulerStats``, the KV-cache
    events, a session's kept KV). ``request`` "-" for the step as a whole."""

    step: int
    request: str
    what: Payload


@dataclass
class SchedulerRun:
    """What the scheduler did, in call order, and the settings it ran with."""

    scheduler_class: str
    mode: str
    lookahead: int | None  # Scheduler.num_lookahead_tokens
    config_lookahead: int | None  # VllmConfig.num_lookahead_tokens
    prefill_lookahead: int | None  # VllmConfig.num_prefill_lookahead_tokens
    max_concurrent_batches: int
    null_block: int
    model_runner: str = "V2"  # the model runner the configuration was built for
    events: list[StepRecord | FreeRecord | LoadRecord | LoadDoneRecord | AbortRecord] = field(
        default_factory=list
    )
    finished: set[str] = field(default_factory=set)
    final_free_blocks: int | None = None
    max_num_scheduled_tokens: int | None = None
    # Where the scheduler stopped serving a request the pool holds (liveness); the
    # run stops there.
    stall: StallRecord | None = None
    resets: list[ResetRecord] = field(default_factory=list)
    # The facts check `sanity` judges, by what they are of (kvconform.model.facts).
    zeroing: list[StepFact] = field(default_factory=list)
    encoder: list[StepFact] = field(default_factory=list)
    # What each step does with the encoder, in a few words (explain's step notes).
    encoder_notes: dict[int, str] = field(default_factory=dict)
    # With multimodal inputs: the scheduler's encoder compute budget and cache size.
    encoder_budget: int | None = None
    encoder_cache_size: int | None = None
    lifecycle: list[StepFact] = field(default_factory=list)
    deferred_frees: list[DeferredFreeRecord] = field(default_factory=list)


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
        model_config, speculative = model_and_speculative_config(vllm, scenario, self.method)
        where = self.limits.where or scenario.where.at("scheduler")
        kv_specs = group_specs(vllm, model, num_speculative_tokens)
        # As vLLM's engine core builds it: the retention interval from the cache config.
        kv_cache_config = vllm.kv_cache_config(
            model.num_blocks,
            kv_specs,
            prefix_cache_retention_interval=model.prefix_cache_retention_interval,
        )
        with api.model_runner(self.limits.model_runner):
            try:
                self.config = api.scheduler_vllm_config(
                    model_config,
                    speculative,
                    block_size=model.scheduler_block_size,
                    num_blocks=model.num_blocks,
                    enable_prefix_caching=model.enable_caching,
                    prefix_cache_retention_interval=model.prefix_cache_retention_interval,
                    scheduler_reserve_full_isl=model.scheduler_reserve_full_isl,
                    max_num_seqs=self.limits.max_num_seqs,
                    max_num_batched_tokens=self.limits.max_num_batched_tokens,
                    enable_chunked_prefill=self.limits.enable_chunked_prefill,
                    long_prefill_token_threshold=self.limits.long_prefill_token_threshold,
                    async_scheduling=self.limits.async_scheduling,
                    remote_prefill=any(r.remote_prefill for r in scenario.requests.values()),
                    mamba_cache_mode=next(
                        (
                            str(g.options["mamba_cache_mode"])
                            for g in model.groups
                            if g.options.get("mamba_cache_mode") is not None
                        ),
                        None,
                    ),
                    policy=self.limits.policy,
                    kv_connector=self.limits.kv_connector,
                    disable_chunked_mm_input=self.limits.disable_chunked_mm_input,
                    log_iteration_details=self.limits.log_iteration_details,
                    long_prefill_token_threshold_adaptive=(
                        self.limits.long_prefill_token_threshold_adaptive
                    ),
                    kv_load_failure_policy=self.limits.kv_load_failure_policy,
                    prefill_schedule_interval=self.limits.prefill_schedule_interval,
                    kv_cache_events=model.kv_cache_events,
                    spec_decode_metrics=self.limits.spec_decode_metrics,
                )
                block_size, hash_block_size = api.kv_block_sizes(kv_cache_config, self.config)
                max_concurrent_batches = api.max_concurrent_batches(self.config)
                runner_name = api.model_runner_name(self.config)
            except VllmUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - vLLM refusing the configuration
                # The loader checked vLLM's generic limits; what is left is a method,
                # mode or combination this release does not run.
                raise NotOffered(
                    vllm.version, f"support for these settings ({where})", first_line(exc)
                ) from None
            # Raising here, on a configuration vLLM accepted, is a finding (a crash).
            self.scheduler = api.new_scheduler(
                self.config,
                kv_cache_config,
                block_size,
                hash_block_size,
                log_stats=self.limits.log_stats,
            )
        self.manager = self.scheduler.kv_cache_manager
        self.run = SchedulerRun(
            scheduler_class=type(self.scheduler).__name__,
            mode=self.limits.mode,
            lookahead=api.lookahead_of(self.scheduler),
            config_lookahead=api.lookahead_of(self.config),
            prefill_lookahead=api.lookahead_of(self.config, "num_prefill_lookahead_tokens"),
            max_concurrent_batches=max_concurrent_batches,
            model_runner=runner_name,
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
        api.observe_deferred_frees(self.scheduler, self._deferred_pop, self._deferred_drain)
        self._install_encoder_budget()
        hasher = None
        if model.enable_caching:
            hasher = vllm.block_hasher(
                hash_block_size, api.lookahead_of(self.config, "num_hash_lookahead_tokens") or 0
            )
        self._pending = sorted(
            scenario.requests.values(),
            key=lambda r: (r.arrival, list(scenario.requests).index(r.name)),
        )
        self._requests: dict[str, Any] = {}
        prompts: dict[str, list[int]] = {}
        for index, req in enumerate(scenario.requests.values()):
            prompt = prompts[req.name] = prompt_tokens(index, req, prompts)
            request = self._requests[req.name] = vllm.new_request(
                req.name,
                prompt,
                hasher,
                max_tokens=req.max_tokens,
                priority=req.priority,
                mm_features=(
                    api.mm_features([(m.offset, m.length, m.identifier) for m in req.mm_inputs])
                    if req.mm_inputs
                    else None
                ),
                resumable=bool(req.stream),
                **_stop_options(req),
            )
            if req.remote_prefill:
                request.kv_transfer_params = api.remote_prefill_params(
                    req.name, req.prompt_len, block_size
                )
        self._acceptance = {
            name: AcceptanceStream(req.acceptance, name) for name, req in scenario.requests.items()
        }
        self._next_output = {
            name: first_output_token(i) for i, name in enumerate(scenario.requests)
        }
        self._started: set[str] = set()  # scheduled at least once
        self._restart: set[str] = set()  # preempted, not scheduled since
        self._remote = {name for name, req in scenario.requests.items() if req.remote_prefill}
        self._loading: dict[str, int] = {}  # KV loads in flight: steps until received
        self._loaded: set[str] = set()  # began loading remote KV, not scheduled since
        # The groups whose new blocks vLLM zeroes (None: it zeroes nothing).
        self._zeroed_groups = vllm.recording_groups(self.manager)
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
        """vLLM took a finished request's blocks out of its table without returning them."""
        rid = request.request_id
        kind = "abort" if self.api.is_aborted(request) else "finish"
        self.run.finished.add(rid)
        self._lifecycle.ended(request)
        self._sessions.released(rid, self._current, kind)
        self.run.deferred_frees.append(
            DeferredFreeRecord(self._current, rid, kind, held, self._newest_busy)
        )

    def _deferred_drain(self, returned: list[tuple[list[int], int, int]]) -> None:
        """vLLM returned deferred blocks to the pool: match them to the requests'."""
        records = self.run.deferred_frees
        for block_ids, before, after in returned:
            wanted = set(block_ids)
            for index, record in enumerate(records):
                null = self.run.null_block
                held = {b for ids in record.held for b in ids if b != null}
                if record.returned is None and held == wanted:
                    records[index] = record._replace(
                        returned=self._applying, free_before=before, free_after=after
                    )
                    break

    def _record(self, output: Any, in_flight: int) -> list[tuple[str, int | None]]:
        """Record one schedule() and decide the fabricated output of each request."""
        drafts = self.api.scheduled_drafts(output)
        rows = []
        answers: list[tuple[str, int | None]] = []
        vllm = self.vllm
        loading_now: set[str] = set()
        for rid in sorted(self._remote - self._loaded):
            request = self.scheduler.requests.get(rid)
            if request is not None and self.api.is_loading_remote_kv(request):
                loading_now.add(rid)
                self._loaded.add(rid)
                self._loading[rid] = self.scenario.requests[rid].remote_prefill
                held = tuple(list(ids) for ids in self.manager.get_block_ids(rid))
                null = self.run.null_block
                self.run.events.append(
                    LoadRecord(
                        self._step,
                        rid,
                        int(request.num_computed_tokens),
                        held,
                        tuple(
                            [
                                b
                                for b in ids
                                if b != null and not vllm.block_is_cached(self.manager, b)
                            ]
                            for ids in held
                        ),
                    )
                )
                self._lifecycle.loaded(self.run.events[-1])  # type: ignore[arg-type]
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
        self._record_zeroing(output, rows, loading_now)
        self._record_encoder_step(output, rows)
        self._record_encoder_input_stats(output)
        return answers

    # -- multimodal encoder inputs ------------------------------------------------

    def _install_encoder_budget(self) -> None:
        """An encoder budget and cache for a scenario with multimodal inputs (none otherwise:
        the tiny model is text-only, so vLLM gives its scheduler neither)."""
        inputs = [m for r in self.scenario.requests.values() for m in r.mm_inputs]
        if not inputs:
            return
        self.run.encoder_budget, self.run.encoder_cache_size = self.api.install_encoder_budget(
            self.scheduler,
            max(m.length for m in inputs),
            self.limits.max_num_encoder_input_tokens,
            self.limits.encoder_cache_size,
        )

    def _record_encoder_step(self, output: Any, rows: Sequence[ScheduledRequest]) -> None:
        """The step's encoder work, as the worker runs it (judged by ``checks.encoder``).

        The model runner drops the encoder outputs the step frees
        (``free_encoder_mm_hashes``), runs the encoder on the inputs the step schedules
        (``scheduled_encoder_inputs``) and then gathers, for every placeholder token the
        step computes, its input's encoder output from its cache.
        """
        if self.run.encoder_budget is None:
            return
        freed = tuple(self.api.freed_encoder_outputs(output))
        run = tuple(
            (rid, index)
            for rid, indexes in sorted(self.api.scheduled_encoder_inputs(output).items())
            for index in indexes
        )
        requests = self.scenario.requests
        run_now = [f"{rid}[{index}] {requests[rid].mm_inputs[index].length}" for rid, index in run]
        note = [f"encoder runs {', '.join(run_now)}"] if run_now else []
        note += [f"evicts {', '.join(freed)}"] if freed else []
        if note:
            self.run.encoder_notes[self._step] = "; ".join(note)
        named = {rid for rid, _ in run} | {row.request for row in rows}
        self.run.encoder.append(
            StepFact(
                self._step,
                "-",
                EncoderStep(
                    freed,
                    run,
                    tuple((row.request, row.computed, row.scheduled) for row in rows),
                    self.run.encoder_budget,
                    self.run.encoder_cache_size or 0,
                    bool(self.limits.disable_chunked_mm_input),
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

    def _record_encoder_input_stats(self, output: Any) -> None:
        """``scheduler.log_iteration_details``: the step's ``scheduled_encoder_input_stats``
        and the inputs it schedules, their lengths the scenario's (judged by
        ``checks.encoder``)."""
        if not self.limits.log_iteration_details:
            return
        scheduled = tuple(
            (m.identifier, m.length)
            for rid, indexes in self.api.scheduled_encoder_inputs(output).items()
            for m in (self.scenario.requests[rid].mm_inputs[index] for index in indexes)
        )
        reported = self.api.encoder_input_stats(output)
        self.run.encoder.append(
            StepFact(
                self._step,
                "-",
                EncoderInputStats(reported, scheduled),
            )
        )

    def _record_zeroing(
        self, output: Any, rows: Sequence[ScheduledRequest], loading_now: set[str]
    ) -> None:
        """The step's zeroing list, where vLLM zeroes new blocks (Mamba layers, mixed
        precision; #35219), with every request's tables and the tokens valid before the
        step (judged by ``checks.zeroing``)."""
        recording = self._zeroed_groups
        if recording is None:
            return
        held = {
            rid: tuple(tuple(ids) for ids in self.manager.get_block_ids(rid))
            for rid in self.scheduler.requests
        }
        judged = frozenset(set(output.num_scheduled_tokens) | loading_now)
        # Tokens a synchronous load writes in this step are not valid before it: the worker
        # zeroes their blocks first, then the connector writes them.
        loads = self.vllm.step_sync_loads(output)
        valid_end = {
            row.request: row.computed - loads.get(row.request, 0)
            for row in rows
            if row.phase != "running"
        }
        groups = self.scenario.model.groups
        self.run.zeroing.append(
            StepFact(
                self._step,
                "-",
                StepZeroingList(
                    tuple(recording),
                    tuple(g.block_size for g in groups),
                    held,
                    judged,
                    frozenset(loading_now),
                    valid_end,
                    frozenset(self.vllm.step_blocks_to_zero(output)),
                ),
            )
        )

    # -- the engine loop ----------------------------------------------------------

    def _admit(self) -> None:
        while self._pending and self._pending[0].arrival <= self._step:
            self.scheduler.add_request(self._requests[self._pending.pop(0).name])
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
        # The worker reports a transfer received in the output of the step it finished in,
        # and with it whether the load failed (as a whole, or leaving a block unwritten).
        received: set[str] = set()
        failed: set[str] = set()
        invalid: set[int] = set()
        for rid in list(self._loading):
            self._loading[rid] -= 1
            if self._loading[rid] <= 0:
                received.add(rid)
                del self._loading[rid]
                self.run.events.append(LoadDoneRecord(self._current, rid))
                failure = self.scenario.requests[rid].load_failure
                if failure == "request":
                    failed.add(rid)
                elif isinstance(failure, int):
                    invalid.add(self.manager.get_block_ids(rid)[0][failure])
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

    def _stalled(self, since: int) -> PoolExhausted | StallRecord:
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
        never bad input.
        """
        waiting = [rid for rid in self._requests if rid in self.scheduler.requests]
        model = self.scenario.model
        free = self.vllm.free_block_count(self.manager)
        running = {r.request_id for r in getattr(self.scheduler, "running", ())}
        head = next((rid for rid in waiting if rid not in running), None)
        if head is not None and self.floors is not None:
            request = self.scheduler.requests[head]
            computed = int(request.num_computed_tokens)
            budget = self.limits.max_num_batched_tokens
            left = int(request.num_tokens) - computed
            chunk = min(left, budget) if self.limits.enable_chunked_prefill else left
            held = [len(ids) for ids in self.manager.get_block_ids(head)]
            need = full_need = 0
            cap = model.max_model_len
            tokens = min(computed + chunk + self.floor_lookahead, cap)
            whole = min(int(request.num_tokens), cap)
            for info, have in zip(self.floors, held, strict=True):
                span = info.block_size * int(info.floor_args.get("dcp_world_size", 1))
                extra = int(info.floor_args.get("num_speculative_blocks", 0))
                rule = info.floor_rule
                need += max(0, pool_columns(rule, tokens, 0, span, extra) - have)
                full_need += max(0, pool_columns(rule, whole, 0, span, extra) - have)
            full = model.scheduler_reserve_full_isl
            watermark = self.vllm.watermark_blocks(self.manager) if running else 0
            available = free - watermark
            alone = sum(
                info.pool_blocks(0, whole if full else computed + chunk, self.floor_lookahead, 0)
                for info in self.floors
            )
            fits_free = need <= available and (not full or full_need <= available)
            if fits_free or alone <= model.num_blocks - 1:
                return StallRecord(
                    since, head, max(need, full_need if full else 0), available, free,
                    f"{available} of {model.num_blocks} blocks to give ({free} free"
                    + (f", {watermark} kept by the watermark" if watermark else "")
                    + f"); its next chunk of {chunk} tokens needs {need}"
                    + (f", its whole sequence {full_need}" if full else "")
                    + ("" if fits_free else f"; alone it takes at most {alone} blocks, which the "
                       "pool less the null block holds"),
                )  # fmt: skip
        return PoolExhausted(
            self.scenario.where.at("model.num_blocks"),
            f"vLLM's scheduler scheduled nothing from step {since} on, with nothing in flight, "
            f"while requests {', '.join(waiting)} wait; {self.vllm.free_block_count(self.manager)} "
            f"of {model.num_blocks} blocks are free: the pool (model.num_blocks) or the token "
            "budget (scheduler.max_num_batched_tokens) is too small for them",
        )

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
                output = scheduler.schedule()
                if output.total_num_scheduled_tokens > 0:
                    self._newest_busy = self._step
                answers = self._record(output, in_flight)
                self._step += 1
                # A KV load in flight makes progress without scheduled tokens.
                executed = output.total_num_scheduled_tokens > 0 or bool(self._loading)
                if executed or in_flight:
                    idle_since = None
                elif idle_since is None:
                    idle_since = self._step - 1
                if idle_since is not None and self._step - idle_since >= _STALL_STEPS:
                    if self._next_arrival() is None:
                        stalled = self._stalled(idle_since)
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
            with quiet_logs(logging.ERROR):
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


# -- KV-cache events: what a router learns of the prefix cache ----------------------------


class KvEventMirror:
    """With ``model.kv_cache_events``, records the events the scheduler publishes: after
    each ``update_from_output`` (which drains the manager's and the connector's events and
    publishes them), the events and what the pool caches then (judged by
    ``checks.kv_events``; invariant ``EVENTS_DIVERGE``, check ``sanity``)."""

    def __init__(self, oracle: SchedulerOracle) -> None:
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


# -- stops and stats: what vLLM's update_from_output must make of each output -----------


def _stop_options(req: RequestSpec) -> dict[str, Any]:
    """``new_request``'s stop options for a request's ``stop_at`` / ``stop_with``."""
    if req.stop_at is None:
        return {}
    token = _STOP_TOKEN_IDS[req.stop_with]
    return {"eos_token_id": token} if req.stop_with == "eos" else {"stop_token_ids": [token]}


class AppliedStep(NamedTuple):
    """One step's fabricated output, as kvconform made it, until the scheduler applies it."""

    step: int
    rows: tuple[ScheduledRequest, ...]
    stops: dict[str, int]  # request -> its output count once the stop token is sampled


class Lifecycle:
    """Records what ``update_from_output`` makes of each fabricated output, for
    ``checks.lifecycle`` to judge: a request ends with the output that samples its stop
    token (``stop_at``: ``check_stop``), and with ``scheduler.log_stats`` the
    ``SchedulerStats`` it returns equal what the recorded steps give
    (``Scheduler.make_stats``):

    * ``kv_cache_usage``: the distinct blocks the requests hold, over the pool without its
      null block (``BlockPool.get_usage``);
    * ``prefix_cache_stats``: per admission since the last output (vLLM records a lookup
      when it admits, ``record_prefix_cache_stats``), one request, its ``num_tokens`` as
      queries and its prefix-cache hit as hits, apart for a resumed (preempted) one; none
      without prefix caching;
    * ``spec_decoding_stats``: per request of the step with drafts verified, one draft, its
      drafts and the accepted ones (``make_spec_decoding_stats``); None with no draft.
    """

    def __init__(self, oracle: SchedulerOracle) -> None:
        self.oracle = oracle
        self.requests = oracle.scenario.requests
        self.outputs = dict.fromkeys(self.requests, 0)  # output tokens sampled so far
        self.ends: dict[str, tuple[bool, int, int]] = {}  # (stopped, outputs, update)
        self.updates = 0  # outputs applied
        self._rows: tuple[ScheduledRequest, ...] = ()
        self._stops: dict[str, int] = {}
        self._admissions: list[ScheduledRequest] = []
        # Admissions that began an asynchronous KV load: (request, prompt tokens, local hit,
        # local hit + loaded tokens).
        self._loads: list[tuple[str, int, int, int]] = []
        self.errors: set[str] = set()  # finished with an error (FINISHED_ERROR)
        # Per request, its verifications so far: (drafts, accepted).
        self.verifications: dict[str, list[tuple[int, int]]] = {}

    def _fact(self, step: int, request: str, what: Payload) -> None:
        self.oracle.run.lifecycle.append(StepFact(step, request, what))

    # what kvconform fabricates

    def scheduled(self, rows: Sequence[ScheduledRequest]) -> None:
        self._rows = tuple(rows)
        if self.oracle._paused:
            for row in rows:
                if row.phase in ("new", "resumed"):
                    self._fact(self.oracle._current, row.request, PausedAdmission(row.phase))
        # A session's next turn looks nothing up: it resumes on the KV it kept.
        self._admissions += [row for row in rows if row.phase not in ("running", "turn")]

    def loaded(self, record: LoadRecord) -> None:
        """An admission that parks a request for its asynchronous KV load: its local hit is
        the blocks of group 0 that hold cached KV (the loaded ones are cached only once the
        load is done)."""
        model = self.oracle.scenario.model
        null = self.oracle.run.null_block
        cached = [b for b in record.block_ids[0] if b != null and b not in record.loading[0]]
        local = len(cached) * model.groups[0].block_size
        prompt = self.requests[record.request].prompt_len
        self._loads.append((record.request, prompt, local, record.tokens))

    def sampled(self, rid: str, tokens: list[int]) -> list[int]:
        """The step's sampled tokens for ``rid``, its stop token in place at ``stop_at``."""
        before = self.outputs[rid]
        self.outputs[rid] = before + len(tokens)
        stop_at = self.requests[rid].stop_at
        if stop_at is not None and before < stop_at <= before + len(tokens):
            tokens[stop_at - before - 1] = _STOP_TOKEN_IDS[self.requests[rid].stop_with]
            self._stops[rid] = stop_at
        return tokens

    def step(self) -> AppliedStep:
        applied = AppliedStep(self.oracle._current, self._rows, self._stops)
        self._stops = {}
        return applied

    # what vLLM makes of it

    def ended(self, request: Any) -> None:
        if self.oracle.api.is_errored(request):
            self.errors.add(request.request_id)
        self.ends[request.request_id] = (
            self.oracle.api.is_stopped(request),
            int(request.num_output_tokens),
            self.updates,
        )

    def applied(self, applied: AppliedStep, result: Any) -> None:
        gone = {rid for rid, end in self.ends.items() if end[2] < self.updates}
        for rid, stop_at in applied.stops.items():
            stop = StopApplied(
                stop_at, self.ends.get(rid), self.updates, rid in gone, self._stop_name(rid)
            )
            self._fact(applied.step, rid, stop)
        if self.oracle.limits.spec_decode_metrics != "none":
            self._record_spec_decode_metrics(applied, result, gone)
        if self.oracle.limits.log_stats:
            # vLLM counts a lookup when it admits: every schedule() before this output is
            # applied (with batches overlapped, the next step's admissions too).
            admissions, self._admissions = tuple(self._admissions), []
            loads, self._loads = tuple(self._loads), []
            self._record_stats(applied, result, gone, admissions, loads)
        self.updates += 1

    def _record_spec_decode_metrics(self, applied: AppliedStep, result: Any, gone: set[str]) -> None:
        """``scheduler.spec_decode_metrics``: a request's ``RequestSpecDecodeMetrics``, handed
        out with its finishing output, count its verifications: per verification one entry of
        the accepted-count histogram and its drafts (``summary``), and with ``detailed`` the
        accepted and drafted counts per verification, in order."""
        for row in applied.rows:
            if row.drafts and row.accepted is not None and row.request not in gone:
                self.verifications.setdefault(row.request, []).append((row.drafts, row.accepted))
        api = self.oracle.vllm.part(Scheduling)
        detailed = self.oracle.limits.spec_decode_metrics == "detailed"
        names: tuple[str, ...] = ("histogram", "num_draft_tokens")
        names += ("per_step_accepted", "per_step_drafted") if detailed else ()
        for rid, metrics in api.finished_spec_decode_metrics(result).items():
            steps = tuple(self.verifications.get(rid, []))
            got = {name: getattr(metrics, name) for name in names}
            self._fact(
                applied.step, rid, SpecDecodeMetrics(got, steps, self.oracle.num_spec, detailed)
            )

    def ended_run(self) -> None:
        """How every request ended, with what the scenario states of it (its stop, an
        expected rejection: ``_reject_on_encoder_cache_embed_mismatch``)."""
        ends = tuple(
            RequestEnd(
                rid,
                self.ends.get(rid),
                req.stop_at,
                self._stop_name(rid),
                bool(req.expect_rejected),
                bool(req.mm_inputs),
                rid in self.errors,
            )
            for rid, req in self.requests.items()
        )
        self._fact(self.oracle._current, "-", RunEnded(ends))

    def _stop_name(self, rid: str) -> str:
        req = self.requests[rid]
        token = _STOP_TOKEN_IDS[req.stop_with]
        return f"EOS token ({token})" if req.stop_with == "eos" else f"stop token ({token})"

    def _record_stats(
        self,
        applied: AppliedStep,
        result: Any,
        gone: set[str],
        admissions: Sequence[ScheduledRequest],
        loads: Sequence[tuple[str, int, int, int]],
    ) -> None:
        """The output's ``SchedulerStats`` and what they are held to (judged by
        ``checks.lifecycle``)."""
        oracle = self.oracle
        stats = oracle.api.scheduler_stats(result)
        null = oracle.run.null_block
        held = {
            block
            for rid in oracle.scheduler.requests
            for ids in oracle.manager.get_block_ids(rid)
            for block in ids
            if block != null
        }
        prefix: dict[str, dict[str, int]] = {}
        spec: dict[str, int] | None = None
        usage = 0.0
        if stats is not None:
            usage = float(stats.kv_cache_usage)
            for kind in ("prefix_cache_stats", "connector_prefix_cache_stats"):
                found = getattr(stats, kind, None)
                if kind == "connector_prefix_cache_stats" and found is None:
                    continue  # no KV connector
                prefix[kind] = {name: int(getattr(found, name, 0)) for name in _PREFIX_STATS}
            found_spec = stats.spec_decoding_stats
            if found_spec is not None:
                spec = {
                    name: int(getattr(found_spec, name))
                    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
                }
        self._fact(
            applied.step,
            "-",
            StepStats(
                stats is not None,
                usage,
                len(held),
                oracle.scenario.model.num_blocks - 1,
                oracle.scenario.model.enable_caching,
                tuple(
                    (row.request, row.phase, row.known_tokens, row.cached)
                    for row in admissions
                    if row.phase != "loaded"
                ),
                tuple(loads),
                prefix,
                tuple(
                    (row.request, row.drafts, row.accepted)
                    for row in applied.rows
                    if row.drafts and row.accepted is not None and row.request not in gone
                ),
                spec,
            ),
        )


_PREFIX_STATS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)


# -- streaming-input sessions (RequestSpec.stream) ---------------------------------------

# A session's chunk k (1, 2, ...) takes prompt ids from here up within the request's id range
# (kvconform.oracles.live's layout: prompts from the base, outputs from OUTPUT_OFFSET).
_CHUNK_OFFSET = 300_000
_CHUNK_STRIDE = 10_000


class _Session:
    def __init__(self, spec: RequestSpec) -> None:
        self.chunks = list(spec.stream)  # not added yet
        self.added: list[StreamChunk] = []  # added, waiting for the turn before to end
        self.tokens = spec.prompt_len  # Request.num_tokens, as kvconform counts it
        self.turn_max = spec.max_tokens
        self.turn_outputs = 0
        self.turn = 1
        self.ended_turn = False  # the turn ended; the next chunk not applied yet
        self.frontier: int | None = None  # computed tokens it resumes from
        self.kept: tuple[list[int], ...] = ()  # its tables at its last step
        self.resuming = False  # the next chunk applied, not scheduled since
        self.close_at: int | None = None  # when the stream closes, once the last chunk is in
        self.closed = False


class Sessions:
    """Streaming-input sessions (``stream``), stepped as ``AsyncLLM``'s streaming input
    submits them: each chunk a resumable request with the session's id
    (``Scheduler.add_request`` queues it, or starts the next turn at once when the session
    waits for it), then a non-resumable one that closes the session. vLLM keeps the session's
    blocks between turns: a turn ends when its outputs reach its max_tokens, and
    ``_update_request_as_session`` keeps every token but the last sampled one
    (``_handle_stopped_request`` resumes from the computed frontier). Judged at the first step
    of each next turn (check ``sanity``): it resumes with that many computed tokens, and its
    tables begin with the blocks it held at its last step.
    """

    def __init__(self, oracle: SchedulerOracle, hasher: Any) -> None:
        self.oracle = oracle
        self.hasher = hasher
        self.sessions = {
            name: _Session(req) for name, req in oracle.scenario.requests.items() if req.stream
        }
        self._ends: set[str] = set()
        self._index = {name: i for i, name in enumerate(oracle.scenario.requests)}

    def next_chunk(self) -> int | None:
        """The next schedule() call before which a chunk arrives or a stream closes."""
        times = [s.chunks[0].at for s in self.sessions.values() if s.chunks]
        times += [
            s.close_at for s in self.sessions.values() if s.close_at is not None and not s.closed
        ]
        return min(times, default=None)

    def released(self, rid: str, step: int, kind: str) -> None:
        """A release of ``rid``'s blocks: a session's only once its stream has closed, or
        as a preemption while a turn runs (it recomputes)."""
        session = self.sessions.get(rid)
        if session is None or session.closed:
            return
        self.oracle.run.lifecycle.append(
            StepFact(step, rid, SessionReleased(kind, session.turn, session.ended_turn))
        )

    def resuming(self, rid: str) -> bool:
        session = self.sessions.get(rid)
        return session is not None and session.resuming

    def add_chunks(self, step: int) -> None:
        oracle = self.oracle
        for rid, session in self.sessions.items():
            while session.chunks and session.chunks[0].at <= step:
                chunk = session.chunks.pop(0)
                number = len(oracle.scenario.requests[rid].stream) - len(session.chunks)
                first = (self._index[rid] + 1) * ID_STRIDE + _CHUNK_OFFSET
                first += _CHUNK_STRIDE * number
                request = oracle.vllm.new_request(
                    rid,
                    list(range(first, first + chunk.prompt_len)),
                    self.hasher,
                    max_tokens=chunk.max_tokens,
                    resumable=True,
                )
                oracle.scheduler.add_request(request)
                session.added.append(chunk)
                if session.ended_turn:
                    self._next_turn(session)
                if not session.chunks:
                    session.close_at = oracle.scenario.requests[rid].close_at or step
            if session.close_at is not None and session.close_at <= step and not session.closed:
                # The input stream ends: AsyncLLM closes the session with a request that is
                # not resumable (no update: the finished sentinel; vLLM aborts a session
                # waiting for input, else finishes it when its turn ends).
                session.closed = True
                oracle._current = step
                oracle.scheduler.add_request(
                    oracle.vllm.new_request(rid, [0], self.hasher, max_tokens=1)
                )

    def _next_turn(self, session: _Session) -> None:
        chunk = session.added.pop(0)
        session.tokens += chunk.prompt_len
        session.turn_max, session.turn_outputs = chunk.max_tokens, 0
        session.turn += 1
        session.ended_turn, session.resuming = False, True

    def sampled(self, rid: str, count: int) -> None:
        session = self.sessions.get(rid)
        if session is None or session.ended_turn:
            return
        # check_stop ends the turn at its max_tokens-th output and trims the rest.
        count = min(count, session.turn_max - session.turn_outputs)
        session.tokens += count
        session.turn_outputs += count
        if session.turn_outputs >= session.turn_max:
            self._ends.add(rid)

    def applied(self) -> None:
        for rid in sorted(self._ends):
            session = self.sessions[rid]
            if not session.chunks and not session.added:
                continue  # its last turn: the session finishes
            # Every token but the last sampled one is computed, and kept.
            session.tokens -= 1
            session.frontier = session.tokens
            session.ended_turn = True
            if session.added:
                self._next_turn(session)
        self._ends.clear()

    def scheduled(self, step: int, rows: Sequence[ScheduledRequest]) -> None:
        for row in rows:
            session = self.sessions.get(row.request)
            if session is None:
                continue
            if row.phase == "turn":
                session.resuming = False
                turn = SessionTurn(
                    session.turn,
                    row.computed,
                    session.frontier,
                    row.known_tokens,
                    session.tokens,
                    tuple(tuple(ids) for ids in session.kept),
                    tuple(tuple(ids) for ids in row.block_ids),
                )
                self.oracle.run.lifecycle.append(StepFact(step, row.request, turn))
            session.kept = tuple(list(ids) for ids in row.block_ids)


def run_scheduler(
    vllm: Vllm,
    scenario: Scenario,
    num_speculative_tokens: int,
    floors: Sequence[GroupInfo] | None = None,
    floor_lookahead: int = 0,
) -> SchedulerRun:
    """Build vLLM's scheduler for a ``kind: scheduler`` scenario and step it to the end.

    ``floors``: the groups (their floor rules), with ``floor_lookahead``, to tell a stall that is
    the scenario's (its pool too small) from one that is vLLM's (:class:`StallRecord`).
    """
    oracle = SchedulerOracle(vllm, scenario, num_speculative_tokens)
    oracle.floors, oracle.floor_lookahead = floors, floor_lookahead
    return oracle.step_to_end()
