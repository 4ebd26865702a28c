"""What each kind of scenario asks of vLLM besides its model and requests: the per-kind specs.

A :class:`~kvconform.model.scenario.Scenario` carries exactly one of these
(``Scenario.spec``), the one its kind's registry entry names
(:data:`kvconform.model.kinds.KINDS`): :class:`TrajectorySpec`, :class:`WarmupSpec`,
:class:`SchedulerSpec`, :class:`EngineSpec` or :class:`StartupSpec`. Each is read from
its kind's own YAML section by the kind's loader (:mod:`kvconform.harness.loader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from kvconform.errors import Location
from kvconform.model.tiny_model import TinyModel


@dataclass(frozen=True)
class TrajectorySpec:
    """What a ``kind: trajectory`` scenario states besides its model: its requests and
    steps, which :class:`~kvconform.model.scenario.Scenario` carries (every kind but
    warmup and startup has requests; only this one states steps). Nothing else: its
    driver builds vLLM's ``KVCacheManager`` from the model section alone."""


WARMUP_SAMPLING = ("random", "greedy", "none")


@dataclass(frozen=True)
class WarmupPass:
    """One pass of ``warmup_kernels``: the batch its prefill step enters, and its sampling.

    ``sampling`` is ``greedy`` when every request of the batch samples greedily
    (vLLM's ``SamplingType.GREEDY``, temperature 0), ``random`` when none does,
    ``none`` for the pooling requests of a pooling model (no sampling parameters).
    """

    def applies_to(self, version: str) -> bool:
        """Whether a vLLM of ``version`` is expected to make this pass."""
        if self.vllm is None:
            return True
        try:
            return SpecifierSet(self.vllm).contains(Version(version), prereleases=True)
        except InvalidVersion:
            return True  # an unparsable (local) build: the newest behaviour

    requests: int
    sampling: str
    # A version specifier: the pass is expected only of the vLLM releases it matches
    # (the greedy pass arrived in 0.33.0). Not part of what a recorded pass is compared on.
    vllm: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.requests} request{'' if self.requests == 1 else 's'}, {self.sampling}"


@dataclass(frozen=True)
class WarmupSpec:
    """What a ``kind: warmup`` scenario asks of vLLM's real warmup."""

    entry_points: tuple[str, ...] = ("warmup_kernels", "run_mixed_prefill_decode_warmup")
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 512
    mixed_num_tokens: int = 64
    # A pooling (embedding) model; with model.groups [] one without KV cache.
    pooling: bool = False
    # The elastic-EP re-warm: every KV write goes to the null block, no pool cap.
    redirect_writes_to_null_block: bool = False
    # The passes warmup_kernels must make, derived by hand from the limits (None: not
    # checked), and where the scenario says so, for the failure's message.
    expect_passes: tuple[WarmupPass, ...] | None = None
    expect_passes_at: Location | None = field(default=None, compare=False)


SCHEDULER_MODES = ("sync", "async", "overlapped")
SPEC_DECODE_METRICS = ("none", "summary", "detailed")
SCHEDULER_POLICIES = ("fcfs", "priority")
# A KV connector every request of a scheduler scenario goes through (``scheduler.kv_connector``;
# remote_prefill requests bring vLLM's NixlConnector instead): decode_bench is vLLM's
# DecodeBenchConnector (kv_both), which fills every new request's prompt but its last token
# synchronously, in the step that admits it.
SCHEDULER_CONNECTORS = ("decode_bench",)
# KVTransferConfig.kv_load_failure_policy: what vLLM does with a request whose KV load failed.
KV_LOAD_FAILURE_POLICIES = ("fail", "recompute")
# What stops a request at its stop_at-th output token (RequestSpec.stop_with): a token of
# SamplingParams.stop_token_ids, or its EOS token (ignore_eos off).
STOP_TOKENS = ("stop_token", "eos")
MODEL_RUNNERS = ("auto", "v2", "v1")


@dataclass(frozen=True)
class PrefixReset:
    """``Scheduler.reset_prefix_cache`` before the ``at``-th schedule() call; ``running``:
    preempt the running requests first (``reset_running_requests``); ``succeeds``: what vLLM
    must answer, derived from the scenario."""

    at: int
    running: bool
    succeeds: bool
    line: int | None = None
    # reset_connector: the KV connector's cache too (Scheduler.reset_connector_cache), as
    # EngineCore's cache-clearing cascade after a weight update asks.
    connector: bool = False


@dataclass(frozen=True)
class SchedulerPause:
    """The engine pauses the scheduler for new requests before the ``at``-th schedule() call
    and resumes it before the ``resume_at``-th (``EngineCore.pause_scheduler(mode="wait")``:
    ``PauseState.PAUSED_NEW``, the engine keeps stepping; ``resume_scheduler``)."""

    at: int
    resume_at: int
    line: int | None = None
    # "wait" (the default) or "abort": pause_scheduler(mode="abort") first aborts every
    # request (Scheduler.finish_requests(None, FINISHED_ABORTED)).
    mode: str = "wait"


@dataclass(frozen=True)
class SchedulerSpec:
    """What a ``kind: scheduler`` scenario asks of vLLM's real scheduler.

    ``mode``: ``sync`` is ``Scheduler`` (``async_scheduling`` off), stepped
    schedule -> output -> drafts; ``async`` is ``AsyncScheduler`` stepped in
    lockstep; ``overlapped`` is ``AsyncScheduler`` with step N+1 scheduled
    before step N's output is applied, as vLLM's engine does by default.
    """

    mode: str = "overlapped"
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 256
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # MTP only: the target's MTP modules (more than one makes it multi-module).
    num_nextn_predict_layers: int = 1
    max_steps: int = 2000
    # auto | v2 | v1: the model runner vLLM's configuration is built for (auto:
    # vLLM's own choice on this machine).
    model_runner: str = "auto"
    # Scheduler.reset_prefix_cache calls, each before a schedule() call, with what vLLM must
    # answer (the reset succeeds only when no request holds blocks, or preempting them).
    resets: tuple[PrefixReset, ...] = ()
    # SchedulerConfig.policy: fcfs, or priority (Request.priority; lower runs first and is
    # preempted last).
    policy: str = "fcfs"
    # SCHEDULER_CONNECTORS: a KV connector that loads synchronously; None: none.
    kv_connector: str | None = None
    # Multimodal encoder inputs (requests' mm_inputs): SchedulerConfig.disable_chunked_mm_input,
    # and the encoder compute budget and cache size vLLM starts from (None: vLLM's own,
    # max_num_batched_tokens); compute_mm_encoder_budget raises both to the largest input.
    disable_chunked_mm_input: bool = False
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    # The scheduler built with log_stats (as the engine core builds it when stats are
    # logged): each update_from_output returns SchedulerStats, which check sanity holds
    # to what the recorded steps give.
    # ObservabilityConfig.per_request_spec_decode_metrics (the engine's
    # --per-request-spec-decode-metrics): "none" (vLLM's default), "summary" or "detailed";
    # each finished request's RequestSpecDecodeMetrics are judged against its verifications.
    spec_decode_metrics: str = "none"
    log_stats: bool = False
    # With log_stats: ObservabilityConfig.enable_logging_iteration_details, which makes each
    # SchedulerOutput carry the encoder inputs it schedules (scheduled_encoder_input_stats),
    # held by check sanity to the inputs and their lengths.
    log_iteration_details: bool = False
    # SchedulerConfig.long_prefill_token_threshold_adaptive (0.31 on): the threshold is
    # floored at max_num_batched_tokens over the running and waiting requests.
    long_prefill_token_threshold_adaptive: bool = False
    # SchedulerConfig.prefill_schedule_interval: prefill (admissions and running chunks) only
    # once every N executed steps while a request decodes; 1 (vLLM's default) every step.
    # vLLM 0.33 on applies it in an engine without data parallelism (local cadence).
    prefill_schedule_interval: int = 1
    # Pauses for new requests (EngineCore.pause_scheduler "wait"), in call order.
    pauses: tuple[SchedulerPause, ...] = ()
    # KVTransferConfig.kv_load_failure_policy of the remote prefills' NixlConnector
    # (KV_LOAD_FAILURE_POLICIES): "fail" fails a request whose load failed, "recompute"
    # keeps its valid prefix and computes the rest locally; None: vLLM's default (fail).
    kv_load_failure_policy: str | None = None
    # The settings of kvconform.model.settings.SETTINGS this section states; the others
    # (chunked prefill, the mode's async scheduling) resolve to vLLM's defaults.
    stated: frozenset[str] = frozenset()
    where: Location | None = field(default=None, compare=False)

    @property
    def async_scheduling(self) -> bool:
        return self.mode != "sync"

    @property
    def overlapped(self) -> bool:
        return self.mode == "overlapped"


ENGINE_RUNNERS = ("v2", "v1")


@dataclass(frozen=True)
class EngineRequest:
    """One request an engine scenario submits (``Scenario.requests`` has its name and sizes)."""

    name: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival: int = 0  # engine steps before it is added
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None


@dataclass(frozen=True)
class EngineSpec:
    """What a ``kind: engine`` scenario asks of vLLM's real engine (``vllm.LLM``).

    ``None`` leaves an option to vLLM's default. The block size, ``max_model_len``
    and prefix caching come from the scenario's ``model`` section.
    """

    target: TinyModel
    draft: TinyModel | None
    requests: tuple[EngineRequest, ...]
    model_runner: str = "v2"
    max_num_seqs: int = 4
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    async_scheduling: bool | None = None
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.2
    num_gpu_blocks: int | None = None
    where: Location | None = field(default=None, compare=False)

    @property
    def stated(self) -> frozenset[str]:
        """The settings this section states (None leaves them to vLLM's engine)."""
        return frozenset(
            name
            for name in ("enable_chunked_prefill", "async_scheduling")
            if getattr(self, name) is not None
        )


STARTUP_OUTCOMES = ("accept", "refuse")


@dataclass(frozen=True)
class StartupSpec:
    """What a ``kind: startup`` scenario hands vLLM's startup KV-cache planning.

    ``available_blocks``: the KV-cache memory the engine's profiler reports, in pool
    blocks (vLLM's own bytes per block of the groups it forms from the scenario's
    layers); ``num_gpu_blocks_override``: the engine's
    ``--num-gpu-blocks-override``; ``auto_fit``: ``--max-model-len -1`` (vLLM fits
    max_model_len to the memory, from the model's own length, ``model.max_model_len``).
    ``expect`` / ``expect_max_model_len``: what vLLM must decide, derived by hand
    (None: not stated).
    """

    available_blocks: int
    num_gpu_blocks_override: int | None = None
    auto_fit: bool = False
    expect: str | None = None
    expect_max_model_len: int | None = None
    where: Location | None = field(default=None, compare=False)
