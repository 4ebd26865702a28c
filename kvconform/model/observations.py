"""What the driver saw: one :class:`Observation` per step, request and group.

An observation is the row the checks judge and the reports print: the token
counts of the step, the floor they imply, and how many blocks (block-table
columns, null placeholders included) each party held. A party that did not take
part is ``None``: the predictor on a vLLM without ``_reserved_block_count``, the
recorded warmup on a plain trajectory.

``block_ids`` are the block-table columns the live allocator handed out (null
placeholders included); ``warmup_block_ids`` those the recorded warmup built
by hand. The slots party (:mod:`kvconform.oracles.slots`) loads them into
vLLM's own block table and records, in :class:`SlotRecording`, every written
position that landed outside the request's blocks.

``predicted_max`` is the running maximum of the prediction since the request
last (re)started: vLLM never returns blocks when drafts are rejected, so after
a rollback the live allocator is compared with the most the predictor ever
asked for, not with its latest, smaller answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from kvconform.model.facts import Fact
from kvconform.model.floors import (
    MAMBA_ALIGNED_STATE,
    FloorInput,
    FloorRule,
    StepFloor,
    cdiv,
    pool_columns,
)
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kind_specs import WarmupPass
from kvconform.model.parties import Party
from kvconform.model.queue_facts import ENCODER_HELD_BACK, QueuedRequest, StepQueues


class Observation(NamedTuple):
    """One step, request and group. ``lookahead`` is the floor's (the contract's)."""

    step: int
    line: int | None
    request: str
    label: str
    group: int
    computed: int
    scheduled: int
    lookahead: int
    floor: int
    live: int | None
    predicted: int | None
    predicted_max: int | None
    warmup: int | None = None
    block_ids: tuple[int, ...] | list[int] | None = None
    warmup_block_ids: tuple[int, ...] | list[int] | None = None
    # Of the scheduled tokens, those a prefix-cache hit supplied: computed, not written.
    cached: int = 0


# The invariants of the facts' judgements (check `sanity` names each failure by one;
# kvconform.model.facts, kvconform.harness.checks).
HIT_MISSED = "gets a prefix-cache hit other than the one derived"
HIT_LOST = "gets a shorter prefix-cache hit than the blocks cached before it guarantee"
NOT_ZEROED = "leaves a new block off the worker's zeroing list"
ZEROES_VALID_KV = "hands a block of valid KV to the worker to zero"
HANDOFF_LOST = "caches a Mamba boundary state and does not hand it to the KV connector"
HANDOFF_STALE = "hands the KV connector a block that no longer holds the state"
RETAINED_HIT = "adopts other blocks of a retained hit than those its computed tokens cover"
EVENTS_DIVERGE = "announces another prefix cache in its KV-cache events than the pool holds"
REANNOUNCED_HIT = "announces other blocks at a prefix-cache lookup than the request reuses"
RESET_ANSWER = "answers reset_prefix_cache otherwise than the blocks held give"
EVICTED_STILL_CACHED = "keeps a block in the prefix cache that the connector evicted"
DEFERRED_FREE = "returns other blocks after an in-flight finish than the request held"
STATS_DIVERGE = "counts other prefix-cache stats or usage than the trajectory adopted"
DEFAULTS_DISAGREE = "declares another default than the coordinator that forwards the argument"
# Multimodal encoder inputs (scheduler mode): what the worker's encoder cache holds.
ENCODER_OUTPUT_MISSING = "schedules placeholder tokens whose encoder output the worker lacks"
ENCODER_BUDGET_EXCEEDED = "runs more encoder embeddings in a step than its encoder budget"
ENCODER_CACHE_OVERFLOW = "keeps more encoder embeddings than its encoder cache holds"
MM_INPUT_SPLIT = "splits a multimodal input across chunks under disable_chunked_mm_input"
ENCODER_STATS_DIFFER = "reports other encoder input stats than the inputs it schedules"
REJECTION_DIFFERS = "rejects a request otherwise than its multimodal identifiers give"
CHUNKS_DIFFER = "chunks a prompt otherwise than derived"
STOP_MISSED = "ends a request elsewhere than at the output that stops it"
STATS_DISAGREE = "reports other scheduler stats than its steps give"
SESSION_KV_LOST = "resumes a streaming session without the KV it kept"
PAUSE_ADMITS = "admits a request while paused for new requests"
ABORT_ALL_KEPT = "keeps a request the engine aborted with all the others"
# A P/D decode instance with batches in flight (Scheduler.defer_block_free).
FREED_IN_FLIGHT = "returns a request's blocks while a step that may write them is in flight"
# Engine mode: what the engine generated for each request.
LEFT_UNFINISHED = "leaves requests unfinished"


# The parties that record the block ids they held, and where (the predictor holds none).
BLOCK_ID_PARTIES: tuple[str, ...] = (Party.LIVE, Party.WARMUP)


def party_block_ids(obs: Observation, party: str) -> tuple[int, ...] | list[int] | None:
    """The block ids ``party`` held at ``obs``, or None where it recorded none."""
    return obs.block_ids if party == Party.LIVE else obs.warmup_block_ids


class FreeEvent(NamedTuple):
    """A request gave its blocks back (finish or preempt).

    ``seq`` is the number of observations recorded before it, which orders
    events among observations of the same step.
    """

    seq: int
    step: int
    line: int | None
    request: str
    kind: str
    held: tuple[list[int], ...]
    free_before: int
    free_after: int
    held_after: tuple[list[int], ...]


class Denial(NamedTuple):
    """A step vLLM refused although the floor says the pool holds it (check ``capacity``).

    ``who`` is the vLLM function that refused (``allocate_slots``, or ``schedule`` for
    a request the scheduler never schedules); ``floor_need`` the blocks the floor's
    arithmetic needs for it, ``available`` the free blocks it could use (free minus
    reserved and watermark blocks). The driver stops there. ``cause``: for a request the
    scheduler never schedules, what the stall shows of its cause where kvconform names
    one (:data:`STALL_CAUSES`), which the ``capacity`` signature carries: a triaged stall
    then excuses no other.
    """

    step: int
    line: int | None
    request: str
    label: str
    who: str
    floor_need: int
    available: int
    free: int
    detail: str = ""
    cause: str = ""


# A stall whose head-of-line request has one token to compute while speculative decoding
# is on: Scheduler.schedule pads such an admission to a uniform spec-decode row of 1 + k
# tokens and, where the row passes the request's token budget, breaks out of the waiting
# loop rather than schedule it unpadded, at every call (docs/findings.md #19).
PADDED_ROW_PAST_BUDGET = "a one-token admission padded to 1 + k rows past its budget"
# A stall whose head-of-line request's next tokens begin a multimodal input longer than
# the long-prefill threshold, under disable_chunked_mm_input with more than one request
# eligible: Scheduler.schedule caps the chunk at the threshold, and the roll-back that keeps
# an input whole cuts it to nothing, at every call (docs/findings.md #22).
MM_INPUT_PAST_THRESHOLD = "a multimodal input longer than the long-prefill threshold"
# A stall whose head-of-line request's next tokens must take a multimodal input whole, under
# disable_chunked_mm_input, in one chunk longer than the request's token budget
# (min(max_num_scheduled_tokens, max_num_batched_tokens - draft slots)), with or without a
# long-prefill threshold: draft_model's draft slot, or the drafter's prefill shift the
# roll-back keeps before the input, takes what vLLM's check of the input against
# max_num_batched_tokens alone leaves (docs/findings.md #24).
MM_INPUT_PAST_BUDGET = "a multimodal input longer than the request's token budget"

# A stall whose request (the waiting one, or a running one holding the seat it waits for)
# has R prompt tokens left with 0 < R <= the drafter's prefill lookahead L (multi-module
# MTP: k) and a chunk cap below R (the long-prefill threshold in force, or the request's
# token budget): Scheduler._reserve_prefill_lookahead cuts the capped chunk, which would
# leave 0 < R - cap < L tokens, by L - (R - cap), to R - L <= 0 tokens, at every call
# (docs/findings.md #26).
PREFILL_LOOKAHEAD_PAST_CAP = "a prompt end within the prefill lookahead, past its chunk cap"

# A stall whose head-of-line request's chunk, with the whole budget free, ends short of its
# prefill's end and reaches no Mamba block boundary, under Mamba "align": the block-aligned
# split floors it to nothing, because the split lets a chunk advance sub-block only where the
# block is wider than max_num_scheduled_tokens (or the long-prefill threshold), while the
# draft slots leave the request less (docs/findings.md #28).
MAMBA_BLOCK_PAST_BUDGET = "a Mamba block past the request's token budget, within the split's limit"

# A head that does not fit, before requests whose KV loads arrived and that hold blocks in
# WAITING_FOR_REMOTE_KVS: the waiting loop breaks at the head before promoting them, every
# call. The head a load failed as a whole (recompute): #30; a head that never loaded KV (the
# priority policy's order before 0.31.0's kv_holding_waiting): #34 (docs/findings.md).
ARRIVED_LOAD_BEHIND_HEAD = "an arrived KV load held behind a head that does not fit"
ARRIVED_LOAD_BEHIND_FRESH_HEAD = (
    "an arrived KV load held behind a head without a KV load that does not fit"
)

STALL_CAUSES = (
    PADDED_ROW_PAST_BUDGET,
    MM_INPUT_PAST_THRESHOLD,
    MM_INPUT_PAST_BUDGET,
    PREFILL_LOOKAHEAD_PAST_CAP,
    MAMBA_BLOCK_PAST_BUDGET,
    ARRIVED_LOAD_BEHIND_HEAD,
    ARRIVED_LOAD_BEHIND_FRESH_HEAD,
)


def whole_input_chunk(inputs: Sequence[tuple[int, int]], computed: int, shift: int) -> int:
    """The tokens of the one chunk a request at ``computed`` must be scheduled next under
    ``disable_chunked_mm_input`` to get past the input (``(offset, length)``, in prompt
    order) it is held at; 0 where no input holds it.

    Read from ``Scheduler._try_schedule_encoder_inputs``: a chunk that ends inside an
    input is rolled back to ``max(0, start_pos - (num_computed_tokens +
    shift_computed_tokens))`` (``shift``: the drafter's prefill lookahead,
    ``Scheduler.num_prefill_lookahead``), where the chunk starts before the input, and to
    nothing where it starts on or inside it (0.33.0 on). From ``shift`` tokens before the
    input on, both are 0: the request's next chunk must reach the input's end. Before that
    the roll-back leaves a chunk that makes progress, and an input ahead of it holds
    nothing yet.
    """
    for offset, length in inputs:
        if offset - shift <= computed < offset + length:
            return offset + length - computed
    return 0


def request_token_budget(queues: StepQueues) -> int:
    """The most tokens ``Scheduler.schedule`` gives one request in a call with nothing
    else scheduled: ``min(max_num_scheduled_tokens, max_num_batched_tokens - draft
    slots)`` (``request_token_budget``; docs/findings.md #19, #24)."""
    return min(queues.token_budget, queues.input_budget - queues.draft_slots)


def input_chunk(request: QueuedRequest, queues: StepQueues) -> int:
    """The one chunk (tokens) a request held at its pending input must be scheduled next
    under ``disable_chunked_mm_input`` (:func:`whole_input_chunk`, with the recorded
    prefill shift); 0 where the input may be chunked or none is recorded."""
    pending = request.encoder_input
    if pending is None or not queues.whole_inputs:
        return 0
    return whole_input_chunk(
        [(pending.offset, pending.length)], request.computed, queues.prefill_shift
    )


def input_never_fits(request: QueuedRequest, queues: StepQueues) -> int:
    """The one chunk (tokens) a running request held at its pending input must be
    scheduled under ``disable_chunked_mm_input`` (:func:`whole_input_chunk`, with the
    recorded prefill shift) where that chunk is longer than the request's token budget,
    so that no call can ever take the input (:data:`MM_INPUT_PAST_BUDGET`,
    docs/findings.md #24); 0 otherwise."""
    chunk = input_chunk(request, queues)
    return chunk if chunk > request_token_budget(queues) else 0


def capped_at_input(request: QueuedRequest, queues: StepQueues) -> bool:
    """The request is held at an input whose one chunk fits its token budget but passes
    the long-prefill threshold the call applies (docs/findings.md #22's shape)."""
    if request.held_back != ENCODER_HELD_BACK or not queues.chunk_cap:
        return False
    chunk = input_chunk(request, queues)
    return queues.chunk_cap < chunk <= request_token_budget(queues)


def held_at_input_in_empty_call(request: QueuedRequest, queues: StepQueues) -> bool:
    """Whether a request recorded as held back by :data:`ENCODER_HELD_BACK` may be passed
    over by a ``schedule()`` call that scheduled nothing at all.

    ``_try_schedule_encoder_inputs`` (vLLM 0.34.0) cuts a request's tokens to the input's
    start, or to 0, where ``EncoderCacheManager.can_allocate`` refuses the input: its
    embeddings past the call's encoder budget (``max_num_encoder_input_tokens`` less what
    earlier inputs of the call took) or past the cache's free and reclaimable slots
    (``num_freeable_slots``); and, under ``disable_chunked_mm_input``, where the chunk
    the token budget leaves ends inside the input. In a call that scheduled nothing no
    other request took the encoder budget or the token budget, so only the cache can be
    the contract's reason: room held by live requests' items (another's, or the request's
    own earlier one: counted as an excuse, a miss rather than a false alarm). An input
    already cached needs no room; one whose embeddings pass the whole encoder budget, or
    whose one chunk passes the request's own token budget, can never be taken: a stall
    with a named cause (docs/findings.md #24), not an excuse. Under the long-prefill
    threshold (``StepQueues.chunk_cap``, applied only while another request is eligible)
    a chunk longer than the cap is held back too, while another eligible request is not
    capped at an input as well. Without a recorded input
    (an encoder-cache connector, an encoder-decoder model) or encoder budget (no encoder
    cache) the excuse stands.
    """
    pending = request.encoder_input
    if request.held_back != ENCODER_HELD_BACK or pending is None or queues.encoder_budget <= 0:
        return bool(request.held_back)
    if input_never_fits(request, queues):
        return False
    if capped_at_input(request, queues):
        # The long-prefill threshold, applied while another request is eligible, caps
        # the one chunk the input needs: a configured cap vLLM lifts once the request is
        # alone (scenarios/scheduler/sched-encoder-whole-inputs.yaml, overlapped: b's
        # next token in flight, a capped at its image). It holds the request back only
        # while some other eligible request is not capped at an input too: where every
        # one is, none can ever leave and lift it (#22 with the inputs after some text:
        # every request runs its text and stops, running). Where the others are waiting
        # and can never be admitted, the stall is #22's, judged by check capacity there.
        return any(
            not capped_at_input(other, queues)
            for other in queues.running + queues.waiting
            if other.request != request.request
        )
    if pending.cached or pending.embeds > queues.encoder_budget:
        return False
    return pending.embeds > queues.encoder_room


class KvLoad(NamedTuple):
    """A KV connector's asynchronous load into a request's blocks (scheduler mode).

    ``blocks``: per group, the blocks the connector writes the remote KV into, from
    the ``schedule()`` that began the load (``started``) through the one whose output
    reported it received (``done``; None: not reported during the run). Until then no
    other request may hold one of them: the worker's transfer still writes there.
    ``aborted``: the ``schedule()`` call the client's abort of the request came before.
    """

    request: str
    line: int | None
    started: int
    blocks: tuple[tuple[int, ...], ...]
    done: int | None = None
    aborted: int | None = None


@dataclass(frozen=True)
class StartupRecord:
    """What vLLM's startup KV-cache planning decided for a ``kind: startup`` scenario.

    ``accepted``: ``get_kv_cache_configs`` (the engine core's planning) returned a
    configuration; otherwise ``refusal`` is the first line of vLLM's ``ValueError``.
    ``num_blocks``: the pool vLLM chose (``KVCacheConfig.num_blocks``, the null block
    included), None when it refused. ``max_model_len``: after planning (auto-fit may
    have lowered it from ``original_max_model_len``). ``available_blocks`` is the
    memory handed to the planner in pool blocks (``bytes_per_block`` each), the
    override the engine's ``num_gpu_blocks_override``. ``vllm_groups``: the groups
    vLLM's planner formed from the scenario's layers, as labels. ``expect`` and
    ``expect_max_model_len`` are the scenario's own statements (None: not stated),
    ``line`` where the startup section is.
    """

    accepted: bool
    function: str
    max_model_len: int
    original_max_model_len: int
    available_blocks: int
    bytes_per_block: int
    num_blocks: int | None = None
    refusal: str = ""
    override: int | None = None
    auto_fit: bool = False
    vllm_groups: tuple[str, ...] = ()
    expect: str | None = None
    expect_max_model_len: int | None = None
    line: int | None = None

    @property
    def pool(self) -> int:
        """The pool the planner had to fit: the one it chose, else the override or the memory's."""
        if self.num_blocks is not None:
            return self.num_blocks
        return self.override if self.override is not None else self.available_blocks


class RefusedCall(NamedTuple):
    """A call the scenario says ``allocate_slots`` must refuse, and what it did.

    ``granted``: vLLM returned blocks instead of ``None``; the driver stops there,
    since the allocator no longer holds what the scenario's later steps assume.
    """

    step: int
    line: int | None
    request: str
    label: str
    granted: bool
    free_blocks: int  # free blocks in the pool before the call


class SlotEscape(NamedTuple):
    """One written position whose slot is not in a block its request holds.

    ``observation`` indexes :attr:`Trajectory.observations` (the step, request,
    group and holding it came from); ``block`` is what vLLM's kernel read from
    kvconform's poisoned row, ``fresh_block`` what it read from the same row as
    vLLM's ``BlockTables`` leaves it (zero-filled past the held columns).
    ``kernel`` names vLLM's function that mapped the position:
    ``compute_slot_mappings``, or ``prepare_dflash_inputs`` for DFlash and DSpark
    drafters, whose ``fresh_slot`` is negative (``PAD_SLOT_ID``) where the kernel
    writes nothing.
    """

    observation: int
    party: str
    role: str  # "target" (a scheduled position) or "drafter" (a lookahead position)
    position: int
    column: int
    slot: int
    block: int
    fresh_slot: int | None
    fresh_block: int | None
    kernel: str = "compute_slot_mappings"


@dataclass
class SlotRecording:
    """What the slots party saw: every escape, and what it could not map."""

    mode: str = ""
    skipped: str | None = None
    poison: int = -1  # written into every column past a request's held blocks
    guard: int = -1  # written into the last column of every row
    groups_mapped: tuple[int, ...] = ()
    groups_skipped: Mapping[int, str] = field(default_factory=dict)
    kernel_calls: int = 0
    steps: int = 0
    rows: int = 0
    positions: int = 0
    seconds: float = 0.0
    escapes: list[SlotEscape] = field(default_factory=list)


@dataclass(frozen=True)
class GroupInfo:
    index: int
    type: str
    block_size: int
    label: str
    holds_null: bool
    # The group's fixed inputs to its floor rule (FloorInput minus the step's counts).
    floor_args: Mapping[str, Any] = field(default_factory=dict)
    # Windowed attention: (kind, size) for model.floors.first_position_read, the span
    # of positions a step reads whose blocks must be real; None for other groups.
    read_span: tuple[str, int] | None = None
    # SWA bounded replay (DeepSeek V4.1): the tokens of a prefix-cache hit the scheduler
    # recomputes into this group instead of adopting them (its window,
    # SlidingWindowMLASpec.prefix_replay_tokens); 0 for a group that adopts a hit as is.
    replay_tokens: int = 0
    # The SingleTypeKVCacheManager subclass vLLM dispatches this group's spec to, and its
    # file in the vLLM tree, asked of the loaded vLLM (Vllm.manager_class); the root
    # causes name it. None where the driver did not build the spec.
    manager: str | None = None
    manager_file: str | None = None

    @cached_property
    def _floor_parts(self) -> tuple[FloorInput, tuple[Any, ...], tuple[Any, ...]]:
        """The fixed inputs, once: a template, and its fields around the step's counts.

        Floors are evaluated per step and group, and keyword unpacking there cost
        more than the floor rule itself (docs/benchmarks.md). Computed on first
        use: the drivers build and replace GroupInfos per scenario.
        """
        template = FloorInput(
            0, 0, 0, **{"block_size": self.block_size, "max_model_len": 0, **self.floor_args}
        )
        cut = FloorInput._fields.index("encoder_len")
        return template, tuple(template[3:cut]), tuple(template[cut + 1 :])

    def floor_input(
        self, computed: int, scheduled: int, lookahead: int, encoder_len: int
    ) -> FloorInput:
        _, before_encoder, after_encoder = self._floor_parts
        return FloorInput._make(
            (computed, scheduled, lookahead) + before_encoder + (encoder_len,) + after_encoder
        )

    @cached_property
    def floor_rule(self) -> FloorRule:
        """The floor rule of this group's type, for its layout (Mamba "align")."""
        return GROUP_TYPES[self.type].floor_for(self.floor_args)

    def step_floor(self) -> StepFloor:
        """This group's floor rule as (computed, scheduled, lookahead, encoder_len) -> blocks."""
        return self.floor_rule.for_group(self._floor_parts[0])

    def pool_blocks(self, computed: int, scheduled: int, lookahead: int, encoder_len: int) -> int:
        """The most device-pool blocks this group's table may rightly hold after a call, by
        the scenario's arithmetic alone: the columns up to computed + scheduled + lookahead
        (:func:`~kvconform.model.floors.pool_columns`, which bounds what vLLM's managers
        ask for), of which a window keeps only those its reads and writes span (the
        window, the call's tokens and lookahead, one block it starts inside and one an
        EAGLE drafter's extra token of window may keep), and a Mamba "align" table only
        the previous and the running state, the speculative and the checkpoint columns
        (what ``MambaSpec.max_memory_usage_bytes`` sizes the pool for in align mode); none
        for a group with a pool of its own (HiSparse's host).

        A pool that holds this for every request holding blocks must serve the call:
        a refusal there is vLLM's to answer for (``capacity``), whatever its tables hold.
        """
        if GROUP_TYPES[self.type].own_pool:
            return 0
        args = self.floor_args
        span = self.block_size * int(args.get("dcp_world_size", 1))
        extra = int(args.get("num_speculative_blocks", 0))
        cap = int(args.get("max_model_len", 0)) or computed + scheduled + lookahead
        tokens = min(computed + scheduled + lookahead, cap)
        columns = pool_columns(self.floor_rule, tokens, encoder_len, span, extra)
        if self.floor_rule.family == MAMBA_ALIGNED_STATE.family:
            checkpoint = int(args.get("num_prefill_checkpoint_blocks", 0))
            return min(columns, 2 + extra + checkpoint)
        if self.read_span is not None:
            _, size = self.read_span
            return min(columns, cdiv(size + scheduled + lookahead, span) + 2)
        return columns

    def shared_blocks(self, prefix_len: int) -> int:
        """The most blocks of a ``prefix_len``-token shared prefix two requests' tables may
        share in this group: its full blocks, in a group that indexes tokens (a Mamba
        state, an encoder's or a ring's blocks, a pool of its own: none)."""
        if GROUP_TYPES[self.type].own_pool or not self.floor_rule.counts_token_columns:
            return 0
        span = self.block_size * int(self.floor_args.get("dcp_world_size", 1))
        return prefix_len // span if span else 0


@dataclass
class Trajectory:
    """Everything the driver recorded for one scenario."""

    groups: tuple[GroupInfo, ...]
    lookahead: int  # what the parties reserve with (vLLM's, or the scenario's override)
    lookahead_source: str
    max_model_len: int = 0
    # What the drafter writes, by kvconform's own table (or the override): the floor's
    # lookahead. It differs from `lookahead` exactly when the lookahead check fails.
    floor_lookahead: int | None = None
    encoder_lens: Mapping[str, int] = field(default_factory=dict)
    method: str | None = None
    num_speculative_tokens: int = 0
    sample_from_anchor: bool = True
    # SpeculativeConfig.disable_lookahead_block_hashes: the EAGLE trailing-block drop
    # on prefix hits instead of lookahead block hashes.
    disable_lookahead_block_hashes: bool = False
    vllm_lookahead: int | None = None
    expected_lookahead: int | None = None
    observations: list[Observation] = field(default_factory=list)
    events: list[FreeEvent] = field(default_factory=list)
    null_block: int = 0
    num_blocks: int = 0
    exclusive_blocks: bool = True
    all_finished: bool = False
    final_free_blocks: int | None = None
    # Recorded up to an exception that stopped the driver (vLLM crashed, or kvconform's
    # own code): the steps before it, for the reports; no check judges it, for the
    # end-of-run invariants would misfire on a run cut short (kvconform/harness/runner.py).
    partial: bool = False
    parties: tuple[str, ...] = (Party.LIVE, Party.PREDICTED)
    notes: list[str] = field(default_factory=list)
    # Per step, what a driver that does not decide the steps saw decided (scheduler
    # mode: admissions, preemptions, batches in flight); shown beside the holdings.
    step_notes: dict[int, str] = field(default_factory=dict)
    slots: SlotRecording | None = None
    # Scheduler mode: observation index -> the lowest position its step's attention
    # reads in that group, where vLLM bounds it (SWA bounded replay: a replayed hit has
    # no sliding-window KV below Request.replay_start, and the kernel reads none).
    read_bounds: dict[int, int] = field(default_factory=dict)
    # Scheduler mode: the observations of requests that began loading their KV
    # asynchronously in that step (a KV connector's remote prefill): no lookahead.
    async_loads: set[int] = field(default_factory=set)
    # Scheduler mode: the KV connector's asynchronous loads, with the blocks they write
    # into and the steps they ran (check `sanity`).
    kv_loads: list[KvLoad] = field(default_factory=list)
    # Startup mode: what vLLM's startup KV-cache planning decided (check `startup`).
    startup: StartupRecord | None = None
    # Scheduler mode: the observations of the prefill chunks vLLM's scheduler chose
    # (steps that compute known tokens and verify no drafts): where a Mamba "align"
    # chunk starts and ends is the scheduler's decision (check `sanity`). A trajectory's
    # chunks are its scenario's.
    prefill_rows: set[int] = field(default_factory=set)
    # Scheduler mode: how many earlier steps may still be in flight when vLLM schedules a
    # step (0: synchronous; async scheduling 1; overlapped, its batches in flight): their
    # tokens are computed but not processed (Request.num_in_flight_tokens).
    steps_in_flight: int = 0
    # Trajectory mode: observation index -> the tokens of earlier steps still in flight
    # at its call (a step's ``in_flight``), where the scenario states any.
    in_flight_tokens: dict[int, int] = field(default_factory=dict)
    # Steps vLLM refused although the floor fits them (check `capacity`); the driver
    # stops at the first.
    denials: list[Denial] = field(default_factory=list)
    # Trajectory mode: the calls the scenario marks `refused`, in order.
    refusals: list[RefusedCall] = field(default_factory=list)
    # Warmup mode: the passes warmup_kernels made (the batch each prefill step entered),
    # the passes the scenario derives by hand (None: not checked) and where it says so.
    warmup_passes: list[WarmupPass] = field(default_factory=list)
    expected_warmup_passes: tuple[WarmupPass, ...] | None = None
    expected_warmup_passes_at: str = ""
    # Warmup mode, the elastic-EP re-warm: BlockTables writes every KV to the null
    # block, so the block ids the warmup hands out are never written.
    warmup_writes_redirected: bool = False
    # Warmup mode, a runner that grows its KV cache on demand (0.34's extensible KV
    # cache): step index -> blocks committed (backed by memory) when the step ran. A
    # block id at or past it is unbacked memory on a GPU (check `sanity`).
    warmup_committed_blocks: dict[int, int] = field(default_factory=dict)
    # What the oracles saw vLLM do (the live KVCacheManager, vLLM's scheduler) and the
    # scenario's statements it is held to, in recording order, for the sanity families to
    # judge (kvconform.model.facts).
    facts: list[Fact] = field(default_factory=list)
    # Scheduler mode: each request's line in the scenario (a fact of a request the
    # judgement names, as a table's owner, is reported at its request's line).
    request_lines: dict[str, int | None] = field(default_factory=dict)
