"""What an oracle saw vLLM do, as facts: plain data the ``sanity`` families judge.

An oracle records what vLLM answered, held, freed, zeroed, announced and handed over;
it judges nothing. Each fact is one of the payloads below, wrapped in a :class:`Fact`
that says where in the run it was recorded (the step, the scenario line, the call's
label or "end of step", and the request it concerns, "-" for the step as a whole).
The families of :mod:`kvconform.harness.checks` (``allocator``, ``zeroing``,
``handoffs``, ``kv_events``, ``lifecycle``) read them in recording order and return
failure records; nothing here asks vLLM, so a recorded run can be judged again
anywhere (:mod:`kvconform.model.recording`).

The scenario's own statements a fact is judged against (the stated hit, the stated
answer of a reset) travel with it: they are what the run was asked, not what vLLM did.
Block hashes and prefix-cache keys are kept as vLLM carries them (bytes or ints): the
judges only compare them and print their ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Union

from kvconform.model.queue_facts import HoldFacts, PendingInput, QueuedRequest, StepQueues

# (group, block id, tokens): a cached Mamba "align" boundary state (model/handoffs.py).
State = tuple[int, int, int]


class DefaultDisagreement(NamedTuple):
    """A single-type manager declares another default than its coordinator for an argument
    the coordinator forwards (``Vllm.forwarded_default_disagreements``, one line)."""

    disagreement: str


class AdmissionHit(NamedTuple):
    """The prefix-cache hit a first chunk got (``get_computed_blocks``), and the one the
    scenario states (``expect_hit``); ``decided_by``: where they differ and a setting denied
    the stated hit, that setting, its value and the value that gives the hit, as found by
    driving the scenario again with it changed (:mod:`kvconform.harness.hit_settings`)."""

    hit: int
    stated: int
    decided_by: str = ""


class HitGroup(NamedTuple):
    """One KV-cache group as :mod:`kvconform.model.prefix_hits` bounds its hits: its rule
    (``GroupType.hit_rule``: "dense", "window", or empty for none), block size and window."""

    rule: str
    block_size: int
    window: int = 0


class HitSource(NamedTuple):
    """An earlier request whose prompt a first admission's prompt begins with, and what it
    had scheduled before the admission's step: its prompt length, the tokens the two
    prompts share, the prompt tokens it had scheduled (vLLM caches a chunk's full blocks
    when it schedules it), and per group the block each column of its table held last."""

    request: str
    prompt: int
    shared: int
    scheduled: int
    columns: tuple[tuple[int, ...], ...]


class PrefixLookup(NamedTuple):
    """A first admission's prefix-cache hit (``get_computed_blocks``) beside what the
    workload had cached before it (check ``sanity``, hits family): the admitted prompt's
    length, the groups' hit rules, the retention interval, whether a drafter may drop the
    last matched block, the most tokens past a block its hash may cover (a drafter's
    lookahead hashes), the most tokens a drafter may prefill again (never cached), why no
    bound holds (empty: the rules apply), the sources and the pool's null block."""

    hit: int
    prompt: int
    groups: tuple[HitGroup, ...]
    retention: int | None
    drop: bool
    lookahead: int
    reprefill: int
    no_bound: str
    sources: tuple[HitSource, ...]
    null_block: int


class LookupEvents(NamedTuple):
    """The KV-cache events a prefix-cache lookup queued: its ``BlockStored`` events as
    (group, hashes), and how many events it queued in all; ``reused``: per group, the
    hashes the hit's blocks are cached under (None for a null column), recorded only
    where the request asks for ``kv_cache_report_mode`` "full" and got a hit."""

    hit: int
    stored: tuple[tuple[int, tuple[object, ...]], ...]
    queued: int
    reused: Mapping[int, tuple[object, ...]] | None


class ZeroingList(NamedTuple):
    """One recording group's part of the worker's zeroing list after a call
    (``take_new_block_ids``), with the tables around it and the blocks of valid KV."""

    group: int
    block_size: int
    before: tuple[int, ...]
    after: tuple[int, ...]
    listed: tuple[int, ...]
    hit: tuple[int, ...]  # the prefix hit's blocks in this group
    loaded: bool  # an asynchronous load writes the request's first valid_tokens
    valid_tokens: int


class ZeroingGroups(NamedTuple):
    """The groups whose new blocks vLLM hands the worker to zero (its managers'
    ``records_new_block_ids``), asked once when the manager is built; ``release_zeroes``:
    the release has the mechanism at all (``KVCacheConfig.needs_kv_cache_zeroing``)."""

    zeroed: tuple[int, ...]
    release_zeroes: bool


class RetainedHit(NamedTuple):
    """A group that retains a longer prefix hit (HiSparse's host source): the hit's
    blocks, the tokens the request has computed (hit and connector), its table after."""

    group: int
    block_size: int
    hit: tuple[int, ...]
    tokens: int
    table: tuple[int, ...]


class InFlightPop(NamedTuple):
    """A request finished with its last step in flight: the blocks its tables held, those
    ``pop_blocks_for_free`` gave, and its tables after (null blocks left out of the first two)."""

    held: tuple[int, ...]
    popped: tuple[int, ...]
    after: tuple[tuple[int, ...], ...]


class DeferredReturn(NamedTuple):
    """Blocks popped at an in-flight finish went back to the pool: how many were popped
    (null blocks included), the distinct real ones, those a live request holds, and how
    many the free count grew by."""

    blocks: int
    popped: tuple[int, ...]
    held_by_live: tuple[int, ...]
    returned: int


class ResetAnswer(NamedTuple):
    """``reset_prefix_cache``'s answer, the scenario's stated one, the blocks the pools
    still cache after a reset that succeeded, and the free blocks of the pool."""

    stated: bool
    answer: bool
    still_cached: int
    free: int
    num_blocks: int


class Eviction(NamedTuple):
    """``evict_blocks`` of the blocks a connector reported invalid, and those still
    cached after it."""

    chosen: tuple[int, ...]
    kept: tuple[int, ...]


class PrefixStats(NamedTuple):
    """A step's ``make_prefix_cache_stats`` and ``usage`` (vLLM's), what its admissions
    looked up (requests, queries, hits of new then of preempted requests), whether a reset
    succeeded since the stats were last taken, and the blocks the live tables hold."""

    stats: Mapping[str, object]
    admitted: tuple[int, ...]
    reset: bool
    held: int
    num_blocks: int


class PoolCensus(NamedTuple):
    """The device pool after a step (check ``sanity``, conservation and bookkeeping
    families): its free-queue length and
    size (the null block included), each live request's tables (the device pool's
    groups), the blocks popped at an in-flight finish that still wait to go back, the
    reference count of every block those hold, and which of them hold cached KV (a
    block hash: full, read-only)."""

    free: int
    pool: int
    tables: Mapping[str, tuple[tuple[int, ...], ...]]
    deferred: tuple[int, ...]
    refs: Mapping[int, int]
    hashed: frozenset[int]
    # The requests that are live (arrived, not finished nor aborted, by the oracle's own
    # account), and the request ids each per-request structure of vLLM's KV-cache
    # managers holds ("group 1 MambaManager._checkpoints": ids), read after a request
    # ended since the last census (else empty): check ``sanity``, bookkeeping family.
    live: frozenset[str] = frozenset()
    bookkeeping: Mapping[str, frozenset[str]] = {}


class StepEvents(NamedTuple):
    """A step's KV-cache events (kind, group, hashes; a lookup's re-announcements left
    out) and what the pools cache at its end, (group, hash) -> blocks."""

    events: tuple[tuple[str, int, tuple[object, ...]], ...]
    cached: Mapping[tuple[int, object], int]


class StepHandoffs(NamedTuple):
    """A step's hand-offs of Mamba "align" boundary states to a KV connector
    (``take_boundary_state_offloads``): the states cached when it began and at its end,
    those offered (per request), the cache keys of the offered blocks, the live tables of
    the hand-off groups, the blocks freed in the step."""

    groups: tuple[int, ...]
    before: frozenset[State]
    after: frozenset[State]
    offers: Mapping[str, tuple[State, ...]]
    offered_keys: tuple[object, ...]
    tables: Mapping[str, tuple[tuple[int, ...], ...]]
    freed: frozenset[int]


class FinalizedTails(NamedTuple):
    """A finishing request's ``finalize_partial_tail_offloads``: the states it hands
    over, its tables and computed tokens, the boundary states cached in its tables and
    the cache key of each of their blocks."""

    given: tuple[State, ...]
    table: tuple[tuple[int, ...], ...]
    computed: int
    cached: tuple[State, ...]
    keys: Mapping[int, object]
    given_keys: tuple[object, ...]


# -- scheduler mode: what vLLM's Scheduler did, and the scenario's statements it is held to --


class StatedAdmission(NamedTuple):
    """A request's first admission (``what`` "hit": the prefix-cache hit it adopted,
    ``expect_hit``) or its first step after its KV load (``what`` "loaded": the tokens
    computed, ``expect_loaded``), and the scenario's stated value."""

    what: str
    got: int
    stated: int


class SchedulerReset(NamedTuple):
    """``Scheduler.reset_prefix_cache`` between steps: whether it succeeded, whether the
    scenario states it succeeds, before which step, and how it was asked."""

    succeeded: bool
    succeeds: bool
    before_step: int
    running: bool
    connector: bool


class PrefillChunks(NamedTuple):
    """The prompt chunks vLLM's scheduler chose for a request from its first admission
    (until its prompt is computed or it is first preempted), and the stated ones."""

    chunks: tuple[int, ...]
    stated: tuple[int, ...]


class StepZeroingList(NamedTuple):
    """A ``schedule()`` call's zeroing list (``new_block_ids_to_zero``) with every
    request's tables after it, the requests it judges (scheduled or beginning a load),
    those beginning an asynchronous load, and per admitted request the tokens valid before
    the step (computed, less what a synchronous load writes in it; for a request beginning
    an asynchronous load, computed with what the load writes)."""

    groups: tuple[int, ...]
    block_sizes: tuple[int, ...]
    tables: Mapping[str, tuple[tuple[int, ...], ...]]
    judged: frozenset[str]
    loading: frozenset[str]
    valid_end: Mapping[str, int]
    listed: frozenset[int]
    # Requests whose blocks vLLM freed since the last list (a preemption, a KV load failed
    # as a whole): a block at the same column as then is not known to be kept.
    freed: frozenset[str] = frozenset()
    # The destinations of the step's copy-on-write block copies: the worker zeroes the list,
    # then runs the copies, so such a block gets its KV after the zeroing either way.
    copied: frozenset[int] = frozenset()


class MmInput(NamedTuple):
    """A multimodal input of the scenario: its identifier, placeholder span and length."""

    identifier: str
    offset: int
    end: int
    length: int


class EncoderStep(NamedTuple):
    """A step's encoder work as the worker runs it: the outputs it frees
    (``free_encoder_mm_hashes``), the inputs it runs (``scheduled_encoder_inputs``:
    request, input index), the rows it computes (request, computed, scheduled), the
    scheduler's encoder budget and cache size, ``disable_chunked_mm_input``, and the
    scenario's multimodal inputs of the requests named."""

    freed: tuple[str, ...]
    run: tuple[tuple[str, int], ...]
    rows: tuple[tuple[str, int, int], ...]
    budget: int
    cache_size: int
    no_split: bool
    inputs: Mapping[str, tuple[MmInput, ...]]


class EncoderInputStats(NamedTuple):
    """``scheduled_encoder_input_stats`` of a step's output (inputs, embeddings; None:
    none reported) and the inputs the step schedules (identifier, length)."""

    reported: tuple[int, int] | None
    scheduled: tuple[tuple[str, int], ...]


class DeferredRelease(NamedTuple):
    """Blocks went back to the pool at a request's finish, abort or preemption under a
    scheduler that defers frees (a KV consumer, batches in flight): the free count
    around it, the last step that scheduled the request and the last step processed."""

    kind: str
    before: int
    after: int
    last_busy: int | None
    processed: int


class HeldAfterAbortAll(NamedTuple):
    """The scheduler still holds the fact's request after the engine aborted every
    request (``finish_requests(None)``); a request whose KV load is in flight is not
    recorded."""


class PausedAdmission(NamedTuple):
    """A request admitted (``phase`` new or resumed) while the engine paused the
    scheduler for new requests."""

    phase: str


class PublishedEvents(NamedTuple):
    """The KV-cache events published with a step's output (``update_from_output``) and
    what the pools cache then, (group, hash) -> blocks."""

    events: tuple[tuple[str, int, tuple[object, ...]], ...]
    cached: Mapping[tuple[int, object], int]


# (stopped, outputs, the update that ended it) of a finished request; None: unfinished.
End = tuple[bool, int, int] | None


class StopApplied(NamedTuple):
    """An output that samples a request's stop token (``stop_at``), and how the request
    ended when it was applied (``updates``: the outputs applied before it; ``gone``: it
    had ended at an earlier one); ``stop_name`` names the token."""

    stop_at: int
    end: End
    updates: int
    gone: bool
    stop_name: str


class SpecDecodeMetrics(NamedTuple):
    """A finishing request's ``RequestSpecDecodeMetrics`` (the fields judged), its
    verifications so far (drafts, accepted), ``num_speculative_tokens`` and whether the
    metrics are ``detailed``."""

    got: Mapping[str, object]
    verifications: tuple[tuple[int, int], ...]
    num_speculative_tokens: int
    detailed: bool


class RequestEnd(NamedTuple):
    """How a request ended (None: unfinished), with what the scenario states of it."""

    request: str
    end: End
    stop_at: int | None
    stop_name: str
    expect_rejected: bool
    has_mm_inputs: bool
    errored: bool


class RunEnded(NamedTuple):
    """Every request's end, once the scheduler has run out of work."""

    requests: tuple[RequestEnd, ...]


class StepStats(NamedTuple):
    """``SchedulerStats`` of a step's output (``present``: returned at all), and what it
    is held to: the blocks the requests hold of the pool (with those vLLM holds back for
    finished ones while a step that may write them is in flight), the admissions since the last
    output (request, phase, tokens, hit) and the asynchronous loads (request, prompt, local
    hit, tokens with the loaded ones), the prefix-cache stats it reports (per kind), the
    step's verifications (request, drafts, accepted) and its ``spec_decoding_stats``; the
    prefix-cache resets since the last output and the ``reset`` flags it reports."""

    present: bool
    kv_cache_usage: float
    held: int
    pool: int
    enable_caching: bool
    admissions: tuple[tuple[str, str, int, int], ...]
    loads: tuple[tuple[str, int, int, int], ...]
    prefix: Mapping[str, Mapping[str, int]]
    verified: tuple[tuple[str, int, int | None], ...]
    spec: Mapping[str, int] | None
    # The ``reset_prefix_cache`` calls since the last output, each (its answer, whether it
    # reset the connector's cache too), and the ``reset`` flag of each prefix-cache stats
    # kind the output reports.
    resets: tuple[tuple[bool, bool], ...] = ()
    reset: Mapping[str, bool] = {}
    # Per admission whose connector lookup saw another local hit than the one it adopted:
    # that hit (SWA bounded replay drops a hit no longer than its window after the
    # connector was asked past it; connector_prefix_cache_stats counts the queries then).
    connector_local: Mapping[str, int] = {}


class SessionReleased(NamedTuple):
    """A streaming session's blocks went back to the pool before its input stream closed
    (``kind`` finish, abort or preempt; ``ended_turn``: its turn had ended)."""

    kind: str
    turn: int
    ended_turn: bool


class SessionTurn(NamedTuple):
    """A streaming session's next turn, first scheduled: the computed tokens and sequence
    it resumes with, those its turns so far leave, its tables now and at its last step."""

    turn: int
    computed: int
    frontier: int | None
    known_tokens: int
    tokens: int
    kept: tuple[tuple[int, ...], ...]
    now: tuple[tuple[int, ...], ...]


class EngineOutput(NamedTuple):
    """What vLLM's engine generated for a request of an engine scenario (None: the engine
    never finished it), and the ``max_tokens`` the scenario asks of it."""

    generated: int | None
    max_tokens: int


Payload = Union[  # noqa: UP007 (a runtime union: the recording's codec reads it)
    DefaultDisagreement,
    AdmissionHit,
    LookupEvents,
    ZeroingList,
    ZeroingGroups,
    RetainedHit,
    InFlightPop,
    DeferredReturn,
    ResetAnswer,
    Eviction,
    PrefixStats,
    PoolCensus,
    StepEvents,
    StepHandoffs,
    FinalizedTails,
    StatedAdmission,
    SchedulerReset,
    PrefillChunks,
    StepZeroingList,
    EncoderStep,
    EncoderInputStats,
    DeferredRelease,
    HeldAfterAbortAll,
    PausedAdmission,
    PublishedEvents,
    StopApplied,
    SpecDecodeMetrics,
    RunEnded,
    StepStats,
    SessionReleased,
    SessionTurn,
    EngineOutput,
    StepQueues,
    PrefixLookup,
]

PAYLOADS: tuple[type, ...] = Payload.__args__  # type: ignore[attr-defined]
# Records a payload holds (the recording's codec reads them back too).
PARTS: tuple[type, ...] = (
    MmInput,
    RequestEnd,
    QueuedRequest,
    HoldFacts,
    PendingInput,
    HitGroup,
    HitSource,
)


class Fact(NamedTuple):
    """One fact and where it was recorded: ``label`` is the call's (``prefill 80``), or
    ``manager built``, ``before the step``, ``end of step``, ``after the last step``."""

    step: int
    line: int | None
    request: str
    label: str
    what: Payload
