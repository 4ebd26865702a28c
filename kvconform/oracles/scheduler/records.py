"""What the scheduler oracle records: each ``schedule()`` as the scheduler counted it, the
releases of blocks, the KV loads and aborts, and the run as a whole (:class:`SchedulerRun`),
which :mod:`kvconform.harness.drivers.scheduler` turns into observations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvconform.model.facts import Payload


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
    kind: str  # "finish", "abort", "preempt" (before 0.30.0: a request in flight), or "copy"
    # (a block copy's two ends)
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
    # What the stall shows of its cause, where kvconform names one (STALL_CAUSES in
    # kvconform.model.observations); "" otherwise.
    cause: str = ""


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
    # The pool after each schedule() (check ``sanity``, conservation family).
    census: list[StepFact] = field(default_factory=list)
    finished_at_census: int = 0  # requests finished at the last bookkeeping scan
    encoder: list[StepFact] = field(default_factory=list)
    # What each step does with the encoder, in a few words (explain's step notes).
    encoder_notes: dict[int, str] = field(default_factory=dict)
    # With multimodal inputs: the scheduler's encoder compute budget and cache size.
    encoder_budget: int | None = None
    encoder_cache_size: int | None = None
    lifecycle: list[StepFact] = field(default_factory=list)
    # Each schedule()'s queues and what it made of them (liveness and fairness families).
    queues: list[StepFact] = field(default_factory=list)
    deferred_frees: list[DeferredFreeRecord] = field(default_factory=list)
    # Both ends of the copy-on-write block copies a step hands the worker, held back from
    # the pool until that step is processed where vLLM defers frees (one entry per step, as
    # vLLM's: kind "copy", no request, ``held`` one [source, copy] pair per copy).
    retained_copies: list[DeferredFreeRecord] = field(default_factory=list)
