"""The scenario model: what a YAML scenario means once it has been validated.

A :class:`Scenario` is immutable and complete. By the time one exists, every
default has been filled in, every ``matrix`` combination has become its own
scenario, every ``repeat`` has been unrolled, and every step has been resolved
into :class:`Call` objects that say exactly how many tokens were computed before
the step, how many are scheduled in it, and how many drafts are rolled back
after it. The token arithmetic happens once, in :mod:`kvconform.model.tokens`,
so the driver, the checks and the reports all read the same numbers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvconform.errors import Location
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kind_specs import EngineSpec, SchedulerSpec, StartupSpec, WarmupSpec
from kvconform.model.kinds import Kind, KindSpec, kind_of


class Action(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    SPEC = "spec"
    FINISH = "finish"
    PREEMPT = "preempt"


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group: a type from ``GROUP_TYPES`` plus its options."""

    type: str
    block_size: int
    options: Mapping[str, object] = field(default_factory=dict)
    where: Location | None = field(default=None, compare=False)
    # KVCacheGroupSpec.is_eagle_group: the group holds the drafter's layers (vLLM's
    # planner flags such groups when use_eagle_block_drop() holds).
    eagle_group: bool = False
    # The options the file states (the others hold their defaults, or vLLM's).
    stated: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def option(self, name: str) -> object:
        return self.options[name]

    @property
    def replay_tokens(self) -> int:
        """The tokens of a hit this group recomputes instead of adopting: a bounded-replay
        group's window (``SlidingWindowMLASpec.prefix_replay_tokens``, the option its type
        reads its span from); 0 for every other group."""
        reads = GROUP_TYPES[self.type].reads
        if reads is None or not self.options.get("bounded_replay"):
            return 0
        return int(self.options[reads[1]])  # type: ignore[call-overload]

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return f"{self.type}[{extra}]" if extra else self.type


@dataclass(frozen=True)
class ModelSpec:
    block_size: int
    max_model_len: int
    num_blocks: int
    groups: tuple[GroupSpec, ...]
    max_encoder_len: int = 0
    # vLLM's settings (kvconform.model.settings): what the file states, else placeholders
    # that resolve_settings replaces with vLLM's defaults for the release before a run.
    enable_caching: bool = False
    dcp_world_size: int = 1
    # vLLM's SchedulerConfig.watermark: the fraction of the pool (int(watermark *
    # num_blocks) blocks) a waiting or preempted request's admission must leave free
    # while another request runs (KVCacheManager(watermark=...)).
    watermark: float = 0.0
    # What vLLM's scheduler passes as KVCacheManager(max_in_flight_tokens=...):
    # VllmConfig.max_in_flight_tokens, concurrent batches times max_num_batched_tokens.
    # It sizes the sliding-window and chunked-local admission cap. None: vLLM's
    # fallback, max_model_len (no cap that binds).
    max_in_flight_tokens: int | None = None
    # What vLLM's engine core resolves into KVCacheConfig.prefix_cache_retention_interval
    # from CacheConfig.prefix_cache_retention_interval: None keeps sliding-window and
    # Mamba prefix-cache checkpoints densely (KVCacheConfig's own default, what kvconform
    # built before the field existed), 0 keeps only the semantic ones (CacheConfig's
    # default: sparse retention), a positive multiple of the scheduler block size adds
    # periodic ones. Under 0 a Mamba "align" group reserves a prefill checkpoint block only
    # for the chunk that reaches the prompt's end.
    prefix_cache_retention_interval: int | None = None
    # SchedulerConfig.scheduler_reserve_full_isl: a first chunk (an admission) passes
    # allocate_slots(full_sequence_must_fit=...) unless the chunk states its own.
    scheduler_reserve_full_isl: bool = True
    # KVCacheConfig.hisparse_host_num_blocks: the host pool of HiSparse's source group
    # (the hisparse_* group types); None: no HiSparse layout.
    hisparse_host_blocks: int | None = None
    # KVCacheManager(enable_kv_cache_events=...): vLLM tells external routers which blocks
    # it caches (off by default, as in vLLM); the sanity check holds the events to the pool.
    kv_cache_events: bool = False
    # KVCacheManager(log_stats=...) with a KVCacheMetricsCollector, as the scheduler builds
    # them with stats logging and ObservabilityConfig.kv_cache_metrics on: the sanity check
    # holds each step's prefix-cache stats and KV-cache usage to the trajectory.
    log_stats: bool = False
    # CacheConfig.enable_mamba_shared_prefix_checkpoint, which the scheduler passes as
    # KVCacheManager(enable_mamba_shared_prefix_checkpoint=...) (vLLM 0.31.0 on): a Mamba
    # "align" group also caches its state at a shared-prefix junction inside the prompt.
    mamba_shared_prefix_checkpoint: bool = False
    # The settings of kvconform.model.settings.SETTINGS this section states.
    stated: frozenset[str] = frozenset()

    @property
    def encoder_decoder(self) -> bool:
        """A group is sized by the request's encoder input (cross-attention)."""
        return any(GROUP_TYPES[g.type].encoder for g in self.groups)

    @property
    def attn_type(self) -> str:
        """vLLM's ``ModelConfig.attn_type`` of a model with these groups."""
        if self.encoder_decoder:
            return "encoder_decoder"
        attention = [GROUP_TYPES[g.type].attention for g in self.groups]
        if not any(attention):
            return "attention_free"
        return "decoder" if all(attention) else "hybrid"

    @property
    def scheduler_block_size(self) -> int:
        """The least common multiple of the groups' block sizes (vLLM's rule); without
        groups (no KV cache), the configured block size, as resolve_kv_cache_block_sizes."""
        from math import lcm

        return lcm(*(g.block_size for g in self.groups)) if self.groups else self.block_size

    @property
    def hash_block_size(self) -> int:
        """Prefix-cache hashes must tile every group's blocks: their gcd (without groups,
        the configured block size)."""
        from math import gcd

        return gcd(*(g.block_size for g in self.groups)) if self.groups else self.block_size


@dataclass(frozen=True)
class SpeculativeSpec:
    method: str
    num_speculative_tokens: int
    # None: take the lookahead from vLLM's VllmConfig.num_lookahead_tokens.
    num_lookahead_tokens: int | None = None
    # DSpark only: False selects the fill-in layout (one more lookahead slot).
    sample_from_anchor: bool = True
    where: Location | None = field(default=None, compare=False)
    # SpeculativeConfig.disable_lookahead_block_hashes (prefix caching: drop the
    # trailing hit block, as before 0.33, instead of hashing the drafter's lookahead).
    disable_lookahead_block_hashes: bool = False


@dataclass(frozen=True)
class Acceptance:
    """How many drafts a request accepts at each verification (scheduler scenarios).

    ``kind`` is ``all`` (every draft accepted), ``list`` (``values`` once,
    then every draft accepted),
    ``repeat`` (``values`` cycled) or ``rate`` (each draft accepted with
    probability ``rate`` until the first rejection, from a generator seeded with
    ``seed``). :mod:`kvconform.model.acceptance` turns it into numbers.
    """

    kind: str
    values: tuple[int, ...] = ()
    rate: float = 1.0
    seed: int = 0

    @property
    def label(self) -> str:
        if self.kind == "rate":
            return f"rate {self.rate} (seed {self.seed})"
        if self.kind == "all":
            return "all"
        return f"{self.kind} {list(self.values)}"


ACCEPT_ALL = Acceptance("all")


@dataclass(frozen=True)
class MmInput:
    """A multimodal input of a scheduler request: its placeholder tokens in the prompt.

    vLLM's ``MultiModalFeatureSpec`` with ``PlaceholderRange(offset, length)``: the encoder
    turns the item into ``length`` embeddings that replace the prompt tokens from ``offset``.
    ``identifier`` is its mm hash; two inputs with one identifier are one item (the encoder
    cache and the prefix cache's block hashes share it).
    """

    offset: int
    length: int
    identifier: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class RequestSpec:
    name: str
    prompt_len: int
    encoder_len: int = 0
    # Prefix sharing for prefix-caching scenarios: the first prefix_len prompt
    # tokens are those of request prefix_from.
    prefix_from: str | None = None
    prefix_len: int = 0
    where: Location | None = field(default=None, compare=False)
    # Scheduler scenarios only: when the request reaches the scheduler (the
    # number of schedule() calls before it), how many tokens it may generate,
    # and how many of its drafts the fabricated model output accepts.
    arrival: int = 0
    max_tokens: int = 16
    acceptance: Acceptance = ACCEPT_ALL
    # Scheduler scenarios only: 0 computes the prompt here; N >= 1 says its KV was
    # prefilled on a remote instance (P/D) and loads asynchronously through vLLM's
    # NixlConnector, the transfer reported received in the N-th step's output.
    remote_prefill: int = 0
    # Scheduler scenarios only: the prefix-cache hit (tokens) the request must adopt at
    # its first admission, derived by hand from the scenario; None: not judged.
    expect_hit: int | None = None
    # Scheduler scenarios only: the client aborts the request before the abort_at-th
    # schedule() call (the engine core calls Scheduler.finish_requests with
    # FINISHED_ABORTED between steps); None: never aborted.
    abort_at: int | None = None
    # Scheduler scenarios only, with remote_prefill: the KV load fails, as the worker
    # reports it with the transfer: "request" (failed_recving, the whole load) or the index
    # of the one block of the request's table it leaves unwritten (invalid_block_ids).
    load_failure: str | int | None = None
    # Scheduler scenarios only, with remote_prefill: the computed tokens the request is
    # first scheduled with once its KV load is done (after a failed load under
    # kv_load_failure_policy recompute: the valid prefix it keeps), derived by hand;
    # None: not judged.
    expect_loaded: int | None = None
    # Scheduler scenarios only: Request.priority, under scheduler.policy: priority.
    priority: int = 0
    # Scheduler scenarios only: the prompt's multimodal inputs, by offset (vLLM's mm_features).
    mm_inputs: tuple[MmInput, ...] = ()
    # Scheduler scenarios only: the chunks (tokens) vLLM must prefill the prompt in from the
    # first admission, derived by hand; None: not judged.
    expect_chunks: tuple[int, ...] | None = None
    # Scheduler scenarios only: the stop_at-th output token the fabricated model samples
    # is one that stops the request (check_stop): a stop token of its sampling parameters
    # (stop_with "stop_token") or its EOS token (stop_with "eos", ignore_eos off); None:
    # it runs to max_tokens or max_model_len.
    stop_at: int | None = None
    stop_with: str = "stop_token"
    # Scheduler scenarios only: a streaming-input session (a resumable request, as
    # AsyncLLM's streaming input submits it): the later input chunks, each a turn of its
    # own; prompt_len and max_tokens are the first turn's. Empty: an ordinary request.
    stream: tuple[StreamChunk, ...] = ()
    # With stream: the schedule() call before which the input stream closes (AsyncLLM's
    # final, non-resumable request); None: right after the last chunk.
    close_at: int | None = None
    # Scheduler scenarios only: one of mm_inputs reuses an identifier with another length
    # than the encoder cache holds for it; vLLM (0.31 on) rejects the request, finishing it
    # with an error (FINISHED_ERROR) instead of computing those placeholders.
    expect_rejected: bool = False
    # Trajectory scenarios only: the request's sampling parameters carry
    # extra_args={"kv_cache_report_mode": "full"}: with KV-cache events on, vLLM announces
    # the prefix-cache blocks the request reuses again at its admission.
    kv_cache_report_full: bool = False
    # Trajectory scenarios only: SamplingParams.skip_reading_prefix_cache (what a request
    # asking for prompt logprobs gets): vLLM neither looks its prefix up nor counts it in
    # the prefix-cache stats, and still caches the blocks it computes.
    skip_reading_prefix_cache: bool = False


@dataclass(frozen=True)
class StreamChunk:
    """One later input chunk of a streaming-input session (``RequestSpec.stream``)."""

    at: int  # added (Scheduler.add_request, the session's id) before the at-th schedule()
    prompt_len: int  # the chunk's new tokens
    max_tokens: int  # outputs of its turn
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ChunkOptions:
    """What a ``prefill`` action says besides its count.

    The first four are arguments vLLM's scheduler passes to ``allocate_slots`` when
    it admits a request from the waiting queue (``connector`` makes the scheduler's
    connector lookup derive ``external``); ``expect_hit`` states what vLLM does
    (the local prefix-cache hit the chunk gets), which the ``sanity`` check asserts.
    ``in_flight`` belongs to a later chunk: the request's tokens scheduled in earlier
    steps whose output the asynchronous scheduler has not applied yet
    (``Request.num_in_flight_tokens``).
    """

    external: int = 0
    load_async: bool = False
    # None: the scenario's scheduler_reserve_full_isl setting (vLLM's default unless stated).
    full_sequence_must_fit: bool | None = None
    reserved_blocks: int = 0
    expect_hit: int | None = None
    in_flight: int = 0
    # The tokens a KV connector that takes divergent local hybrid hits holds for the
    # request (None: no such connector): the scheduler's connector lookup decides the
    # local hit and the external tokens (``external`` is then derived, not stated).
    connector: int | None = None

    @property
    def admission_only(self) -> bool:
        """Whether an option is set that only an admission (a first chunk) can have."""
        return bool(
            self.external
            or self.load_async
            or self.full_sequence_must_fit is not None
            or self.reserved_blocks
            or self.expect_hit is not None
            or self.connector is not None
        )


NO_CHUNK_OPTIONS = ChunkOptions()


@dataclass(frozen=True)
class Call:
    """One request's part in one step, resolved into token counts."""

    request: str
    action: Action
    computed: int  # tokens computed before the step
    scheduled: int  # tokens scheduled in the step (0 for finish / preempt)
    rejected: int = 0  # drafts rolled back after the step
    sampled: int = 0  # output tokens appended after the step
    first_chunk: bool = False  # the request (re-)enters from the waiting queue
    label: str = ""
    # The scenario says allocate_slots must refuse this call (return None): the pool
    # cannot hold what it needs. A refused call changes none of the request's counts.
    refused: bool = False
    # What the prefill action says besides its count (first chunks: the arguments the
    # scheduler passes at admission; later chunks: the tokens in flight).
    options: ChunkOptions = NO_CHUNK_OPTIONS
    # A finish while the request's last step is still in flight (finish: in_flight): the
    # scheduler pops the blocks and returns them to the pool once that step's output is
    # applied (Scheduler._free_request_blocks, _drain_deferred_frees).
    deferred_free: bool = False

    @property
    def allocates(self) -> bool:
        return self.scheduled > 0


# Keys of a trajectory step that name what the engine does between steps, not a request.
STEP_OPERATIONS = ("reset_prefix_cache", "evict_cached")


@dataclass(frozen=True)
class Step:
    index: int
    calls: tuple[Call, ...]
    line: int | None = None
    # What the engine does between the last step and this one, before its calls:
    # KVCacheManager.reset_prefix_cache, with the answer the scenario states (None: no
    # reset), and KVCacheManager.evict_blocks of the blocks a KV connector reported
    # invalid, as (request, column of its group-0 table) pairs.
    reset_prefix_cache: bool | None = None
    evict_cached: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: what every kind has, and its kind's own spec (``spec``)."""

    id: str
    name: str
    file: str
    description: str
    tags: tuple[str, ...]
    # The kind's own sections, read by its loader: the registry entry whose spec type
    # this is is the scenario's kind (kvconform.model.kinds.KINDS).
    spec: KindSpec
    model: ModelSpec
    speculative: SpeculativeSpec | None
    requests: Mapping[str, RequestSpec]
    steps: tuple[Step, ...]
    params: tuple[tuple[str, object], ...] = ()
    line: int | None = None
    # The vLLM releases whose behaviour the scenario states (a version specifier, e.g.
    # ">=0.33.0"); on any other release its verdict is unsupported. None: every release.
    vllm_releases: str | None = None

    @property
    def kind(self) -> Kind:
        return kind_of(self.spec)

    # The spec, typed, for code that reads one kind's (None for a scenario of another kind).
    @property
    def warmup(self) -> WarmupSpec | None:
        return self.spec if isinstance(self.spec, WarmupSpec) else None

    @property
    def scheduler(self) -> SchedulerSpec | None:
        return self.spec if isinstance(self.spec, SchedulerSpec) else None

    @property
    def engine(self) -> EngineSpec | None:
        return self.spec if isinstance(self.spec, EngineSpec) else None

    @property
    def startup(self) -> StartupSpec | None:
        return self.spec if isinstance(self.spec, StartupSpec) else None

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", MappingProxyType(dict(self.requests)))

    @property
    def where(self) -> Location:
        return Location(self.file, self.line)

    def encoder_lens(self) -> dict[str, int]:
        """Per request, the encoder tokens its first chunk brings (0 without cross-attention)."""
        model = self.model
        if not model.encoder_decoder:
            return {name: 0 for name in self.requests}
        return {
            name: req.encoder_len or model.max_encoder_len for name, req in self.requests.items()
        }
