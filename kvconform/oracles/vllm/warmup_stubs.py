"""The warmup party's part of the facade: vLLM's warmup entry points and the stub runner.

vLLM's warmup (``vllm/v1/worker/gpu/warmup.py``) takes a ``GPUModelRunner`` but
reads only a handful of its attributes; vLLM's own warmup test passes a stub with
just those. Which attributes differ per release, so there is one stub per release
family (:data:`STUB_FAMILIES`), each naming what its family reads (measured by
running each release's warmup with a stub that records every attribute access).
A warmup that reads an attribute its stub lacks raises
:class:`~kvconform.errors.VllmUnavailable` naming the version and the attribute.

Only :mod:`kvconform.oracles.warmup` uses it, as ``vllm.part(Warmup)``.
"""

from __future__ import annotations

import contextlib
import importlib
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvconform.errors import VllmUnavailable
from kvconform.oracles.vllm.core import Vllm

__all__ = [
    "STUB_FAMILIES",
    "RunnerSettings",
    "StubExtensibleKVCache",
    "StubModelRunner",
    "StubNamespace",
    "Warmup",
    "stub_family",
]


class Warmup:
    """vLLM's warmup entry points and this release's stub runner, for one loaded vLLM."""

    def __init__(self, vllm: Vllm) -> None:
        self._vllm = vllm

    def warmup_entry_point(self, name: str) -> Callable[..., Any]:
        """``warmup_kernels`` or ``run_mixed_prefill_decode_warmup`` of this vLLM."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception as exc:  # noqa: BLE001 - an unimportable warmup cannot be exercised
            raise self._vllm.missing(
                "an importable vllm.v1.worker.gpu.warmup", f"{type(exc).__name__}: {exc}"
            ) from None
        fn = getattr(warmup, name, None)
        if fn is None:
            raise self._vllm.not_offered(f"vllm.v1.worker.gpu.warmup.{name}")
        return typing.cast(Callable[..., Any], fn)

    def stub_model_runner(self, settings: RunnerSettings) -> StubModelRunner:
        """The stub model runner of this vLLM's release family (see ``STUB_FAMILIES``)."""
        stub_class = stub_family(self._vllm.version)
        if stub_class is None:
            oldest = STUB_FAMILIES[0][0]
            raise self._vllm.missing(
                "a warmup kvconform can drive",
                f"kvconform's stub model runners start at vLLM {oldest}",
            )
        if settings.redirect_writes_to_null_block and not stub_class.REDIRECTS_WRITES:
            raise self._vllm.not_offered(
                "a warmup that redirects KV writes to the null block",
                "BlockTables.redirect_writes_to_null_block (the elastic-EP re-warm) arrived "
                "in vLLM 0.32.0",
            )
        return stub_class(settings)

    def stub_shortfall(self, runner: StubModelRunner) -> VllmUnavailable | None:
        """The error to raise when the warmup read an attribute the stub lacks."""
        if not runner.stub_misses:
            return None
        attribute = runner.stub_misses[0]
        return VllmUnavailable(
            self._vllm.version,
            "a model runner kvconform can stub",
            f"its warmup reads {attribute}, which {type(runner).__name__} (kvconform's stub "
            f"for vLLM {runner.FAMILY}) does not provide; add it in "
            "kvconform/oracles/vllm/warmup_stubs.py",
        )

    @contextlib.contextmanager
    def without_final_synchronize(self) -> Iterator[list[int]]:
        """``torch.accelerator.synchronize`` as a no-op where there is no CUDA device.

        Without CUDA, ``warmup_kernels`` emits every ``SchedulerOutput`` and then
        fails in its final synchronize; the list yielded counts the calls skipped
        (none with CUDA, where nothing is replaced).
        """
        import torch

        skipped: list[int] = []
        if torch.cuda.is_available():
            yield skipped
            return
        accelerator = torch.accelerator
        original = accelerator.synchronize

        def skip(*args: Any, **kwargs: Any) -> None:
            skipped.append(1)

        accelerator.synchronize = skip
        try:
            yield skipped
        finally:
            accelerator.synchronize = original


@dataclass(frozen=True)
class RunnerSettings:
    """What a stub model runner is built from: a warmup scenario, resolved against vLLM."""

    kv_cache_config: Any
    num_speculative_tokens: int
    num_lookahead_tokens: int
    speculative_config: Any | None
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_encoder_len: int
    is_encoder_decoder: bool
    vocab_size: int = 1024
    # A pooling model (an embedding model serving the "embed" task): the warmup
    # prefills one batch with pooling parameters and decodes nothing.
    is_pooling_model: bool = False
    # The elastic-EP re-warm (vllm/v1/worker/gpu/eplb_utils.py, preserve_serving_state):
    # BlockTables redirects every KV write to the null block, and the warmup does not
    # cap its batch by the pool.
    redirect_writes_to_null_block: bool = False
    # vLLM's ParallelConfig of the scenario's DCP size (Vllm.predictor_vllm_config):
    # 0.34's warmup reads vllm_config.parallel_config.decode_context_parallel_size.
    parallel_config: Any | None = None
    # A model whose attention is MLA (ModelConfig.use_mla): 0.34's KV-cache sizing warmup
    # then also runs a prefill over cached context (run_context_prefill_warmup).
    use_mla: bool = False
    # The scheduler's block size (CacheConfig.block_size): MLA's chunked-context
    # workspace is aligned to it.
    block_size: int = 16


class StubNamespace:
    """An attribute holder that remembers every attribute asked of it and not held.

    A warmup that reads something kvconform's stub lacks then fails with the
    dotted name of what it read (``GPUModelRunner.model_config.get_pooling_task``)
    instead of a bare ``AttributeError`` from deep inside vLLM.
    """

    _stub_path: str
    stub_misses: list[str]

    def __init__(self, path: str, misses: list[str], **attributes: Any) -> None:
        object.__setattr__(self, "_stub_path", path)
        object.__setattr__(self, "stub_misses", misses)
        self.__dict__.update(attributes)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes the stub does not hold.
        if name.startswith("__"):
            raise AttributeError(name)
        self.stub_misses.append(f"{self._stub_path}.{name}")
        raise AttributeError(f"kvconform's stub {self._stub_path} has no attribute {name!r}")


class StubModelRunner(StubNamespace):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.25.x-0.26.x's warmup reads.

    Like the stub runner of vLLM's own warmup test, it holds no model: only the
    KV-cache config, the speculative step counts and the scheduler limits
    (``num_speculative_steps``, ``decode_query_len``, ``kv_cache_config``,
    ``model_state.max_encoder_len``, ``is_encoder_decoder``, ``scheduler_config``,
    ``is_pooling_model``, ``kv_connector.set_disabled``, ``is_last_pp_rank``,
    ``model_config.get_vocab_size``, ``max_num_reqs``).
    """

    FAMILY = "0.25.x-0.26.x"
    # Whether this family's warmup reads BlockTables.redirect_writes_to_null_block.
    REDIRECTS_WRITES = False

    def __init__(self, settings: RunnerSettings) -> None:
        misses: list[str] = []
        super().__init__("GPUModelRunner", misses, **self._attributes(settings, misses))

    def _part(self, name: str, misses: list[str], **attributes: Any) -> StubNamespace:
        return StubNamespace(f"GPUModelRunner.{name}", misses, **attributes)

    def committed_blocks(self) -> int | None:
        """Blocks of the KV cache backed by memory now, where the runner grows its cache
        on demand (0.34's extensible KV cache); None: every block, from the start."""
        return None

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {
            "num_speculative_steps": s.num_speculative_tokens,
            # One bonus token per step: ModelState.num_new_sampled_tokens_per_step is 1.
            "decode_query_len": s.num_speculative_tokens + 1,
            "kv_cache_config": s.kv_cache_config,
            "model_state": self._part("model_state", misses, max_encoder_len=s.max_encoder_len),
            "is_encoder_decoder": s.is_encoder_decoder,
            "scheduler_config": self._part(
                "scheduler_config",
                misses,
                max_num_seqs=s.max_num_seqs,
                max_num_batched_tokens=s.max_num_batched_tokens,
            ),
            "is_pooling_model": s.is_pooling_model,
            "kv_connector": self._part("kv_connector", misses, set_disabled=lambda disabled: None),
            "is_last_pp_rank": True,
            "model_config": self._part("model_config", misses, **self._model_config_attributes(s)),
            "max_num_reqs": s.max_num_seqs,
            **self._pooling_attributes(s),
        }

    def _model_config_attributes(self, s: RunnerSettings) -> dict[str, Any]:
        attributes: dict[str, Any] = {"get_vocab_size": lambda: s.vocab_size}
        if s.is_pooling_model:
            # An embedding model without a pooler config: PoolingParams.verify then
            # only sets its defaults.
            attributes["get_pooling_task"] = lambda supported_tasks: "embed"
            attributes["pooler_config"] = None
        return attributes

    def _pooling_attributes(self, s: RunnerSettings) -> dict[str, Any]:
        return {"get_supported_tasks": lambda: ("embed",)} if s.is_pooling_model else {}


class StubModelRunner027(StubModelRunner):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.27.x's warmup reads:
    those of 0.25-0.26 plus ``kv_block_zeroer`` (None: no zeroing kernel to warm)."""

    FAMILY = "0.27.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {**super()._attributes(s, misses), "kv_block_zeroer": None}


class StubModelRunner028(StubModelRunner027):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.28.x's warmup reads:
    those of 0.27 plus ``is_encoder_only``, ``max_model_len`` and
    ``vllm_config.num_lookahead_tokens`` (read by ``_warmup_block_counter``)."""

    FAMILY = "0.28.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {
            **super()._attributes(s, misses),
            "is_encoder_only": False,
            "max_model_len": s.max_model_len,
            "vllm_config": self._part(
                "vllm_config", misses, num_lookahead_tokens=s.num_lookahead_tokens
            ),
        }


class StubModelRunner029(StubModelRunner027):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.29.x's warmup reads:
    those of 0.28 with ``is_encoder_only`` replaced by ``vllm_config.is_mm_encoder_only``."""

    FAMILY = "0.29.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {
            **super()._attributes(s, misses),
            "max_model_len": s.max_model_len,
            "vllm_config": self._part(
                "vllm_config",
                misses,
                num_lookahead_tokens=s.num_lookahead_tokens,
                is_mm_encoder_only=False,
            ),
        }


class StubModelRunner030(StubModelRunner029):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.30.x-0.31.x's warmup reads:
    those of 0.29 plus ``adaptive_verification`` and ``rejection_sampler`` (None: the
    warmup exercises fixed draft counts)."""

    FAMILY = "0.30.x-0.31.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {
            **super()._attributes(s, misses),
            "adaptive_verification": None,
            "rejection_sampler": None,
        }


class StubModelRunner032(StubModelRunner030):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.32.x's warmup reads:
    those of 0.30 plus ``block_tables`` (None: writes are not redirected to the null
    block, so the warmup caps its requests by the pool; for the elastic-EP re-warm, one
    whose ``redirect_writes_to_null_block`` is set)."""

    FAMILY = "0.32.x"
    REDIRECTS_WRITES = True

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        block_tables = None
        if s.redirect_writes_to_null_block:
            block_tables = self._part("block_tables", misses, redirect_writes_to_null_block=True)
        return {**super()._attributes(s, misses), "block_tables": block_tables}


class StubModelRunner033(StubModelRunner032):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.33.x's warmup reads:
    those of 0.32 plus ``speculative_config``, read after the main pass; when it is
    set, the warmup runs a second, greedy pass."""

    FAMILY = "0.33.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {**super()._attributes(s, misses), "speculative_config": s.speculative_config}


class StubExtensibleKVCache(StubNamespace):
    """Stands in for 0.34's ``ExtensibleKVCache`` (``vllm/v1/worker/extensible_kv_cache.py``)
    as far as the warmup uses it: a capacity of ``kv_cache_config.num_blocks`` blocks of
    which a prefix is committed (backed by memory), grown by the warmup's
    ``ensure_kv_cache_blocks`` before it hands blocks out.

    ``commit`` keeps vLLM's arithmetic (capped at the capacity, grow-only unless
    ``shrink``) and records every call; no memory is mapped. ``warmup_committable_blocks``
    is what the worker agrees across ranks from free memory
    (``ExtensibleKVCache.committable_blocks``, never above the capacity); with no device
    memory to measure, the stub takes the capacity, as a device with room for it would.
    Initially the minimum is committed (``allocate`` at KV-cache initialisation): the null
    block, under the layer-outermost layouts (block-outermost ones commit one more).
    """

    capacity_blocks: int
    num_committed_blocks: int
    commits: list[int]

    def __init__(self, capacity: int, misses: list[str]) -> None:
        super().__init__(
            "GPUModelRunner.extensible_kv_cache",
            misses,
            capacity_blocks=capacity,
            warmup_committable_blocks=capacity,
            min_committed_blocks=1,
            num_committed_blocks=1,
            commits=[],
            # What the sizing warmup measures (run_kv_cache_sizing_warmup): no memory here.
            reserved_headroom_bytes=0,
            torch_reserve_growth_bytes=0,
        )

    def record_transient_peak(self) -> dict[str, Any]:
        """The allocator statistics vLLM reads after a sizing step: none, with no memory
        mapped (torch gives an empty mapping for a device without statistics too)."""
        return {}

    def commit(self, num_blocks: int, defragment: bool = False, shrink: bool = False) -> None:
        self.commits.append(num_blocks)
        num_blocks = min(num_blocks, self.capacity_blocks)
        if shrink and num_blocks < self.num_committed_blocks:
            self.num_committed_blocks = 0  # remapped: the contents are discarded
        self.num_committed_blocks = max(self.num_committed_blocks, num_blocks)


class StubModelRunner034(StubModelRunner033):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.34.x's warmup reads: those
    of 0.33 plus ``vllm_config.parallel_config`` (its ``decode_context_parallel_size``,
    which ``_warmup_block_counter`` binds), ``max_num_tokens`` (the scheduler's
    ``max_num_batched_tokens``, as ``GPUModelRunner.__init__`` sets it; the request cap
    ``_cap_num_warmup_reqs``), ``extensible_kv_cache`` (the warmup counts its committable
    blocks and commits what it hands out: :class:`StubExtensibleKVCache`; the runner
    builds one by default on CUDA, ``CacheConfig.enable_extensible_kv_cache``) and
    ``speculator`` (None without speculative decoding, as the runner holds it; with it,
    ``reset_state`` after the pass and no ``acceptance_estimator``); for
    ``run_kv_cache_sizing_warmup`` also ``device``, ``model_config.max_logprobs`` (20,
    ``ModelConfig``'s default), ``model_config.use_mla`` and, for MLA's chunked-context
    workspace, ``vllm_config``'s scheduler, model and cache configs (the runner's own)."""

    FAMILY = "0.34.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        import torch

        attributes = super()._attributes(s, misses)
        model_config = attributes["model_config"]
        # ModelConfig's default max_logprobs (20): the sizing warmup requests prompt
        # logprobs on one full-length prompt.
        model_config.max_logprobs = 20
        model_config.use_mla = s.use_mla
        model_config.max_model_len = s.max_model_len
        # GPUModelRunner's configs are its VllmConfig's: the same objects.
        vllm_config = attributes["vllm_config"]
        vllm_config.parallel_config = s.parallel_config
        vllm_config.scheduler_config = attributes["scheduler_config"]
        vllm_config.model_config = model_config
        vllm_config.cache_config = self._part("cache_config", misses, block_size=s.block_size)
        speculator = None
        if s.speculative_config is not None:
            speculator = self._part(
                "speculator", misses, reset_state=lambda: None, acceptance_estimator=None
            )
        return {
            **attributes,
            # The sizing warmup reads the device's memory statistics; the stub maps no
            # memory, so they are the host's (empty) unless a GPU is there.
            "device": torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"),
            "max_num_tokens": s.max_num_batched_tokens,
            "extensible_kv_cache": StubExtensibleKVCache(s.kv_cache_config.num_blocks, misses),
            "speculator": speculator,
        }

    def committed_blocks(self) -> int | None:
        cache: StubExtensibleKVCache = self.extensible_kv_cache
        return cache.num_committed_blocks


# (first release, stub) in release order; a release uses the last family not newer than it.
STUB_FAMILIES: tuple[tuple[str, type[StubModelRunner]], ...] = (
    ("0.25.0", StubModelRunner),
    ("0.27.0", StubModelRunner027),
    ("0.28.0", StubModelRunner028),
    ("0.29.0", StubModelRunner029),
    ("0.30.0", StubModelRunner030),
    ("0.32.0", StubModelRunner032),
    ("0.33.0", StubModelRunner033),
    ("0.34.0", StubModelRunner034),
)


def stub_family(version: str) -> type[StubModelRunner] | None:
    """The stub for a vLLM version; the newest for a version that does not parse."""
    from packaging.version import InvalidVersion, Version

    try:
        # A development build of 0.34 (0.34.0.dev12+g...) behaves like 0.34.
        release = Version(Version(version).base_version)
    except InvalidVersion:
        return STUB_FAMILIES[-1][1]
    chosen = None
    for first, stub in STUB_FAMILIES:
        if release >= Version(first):
            chosen = stub
    return chosen
