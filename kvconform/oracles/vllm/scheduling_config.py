"""Scheduler mode's configuration: what an engine would hand its scheduler, built on the
loaded vLLM (:class:`SchedulingConfigs`, the base of
:class:`~kvconform.oracles.vllm.scheduling.Scheduling`).

A ``ModelConfig`` from a local config-only folder, a full ``SpeculativeConfig``, the
``VllmConfig`` with the pool size the engine would set after profiling (from the
scenario's ``ModelSpec`` and ``SchedulerSpec``), and the scheduler class the config picks.
Release differences handled here: the V2 model runner switch,
``resolve_kv_cache_block_sizes``, ``max_concurrent_batches``. A remote prefill's
configuration carries vLLM's own ``NixlConnector`` as a ``kv_consumer``; a scenario's
``scheduler.kv_connector`` names a connector every request goes through.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from functools import cached_property
from types import SimpleNamespace
from typing import Any

from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.scenario import ModelSpec, SchedulerSpec
from kvconform.oracles.vllm.base import environment_variable
from kvconform.oracles.vllm.calls import accepts_keyword, call, quiet_logs
from kvconform.oracles.vllm.core import Vllm
from kvconform.oracles.vllm.engine import offers_runner

__all__ = ["SchedulingConfigs"]

# The KV connector of remote-prefill scenarios: vLLM's NIXL connector (pull mode), whose
# scheduler side reports a remote prefill's prompt as external tokens loaded asynchronously.
_CONNECTOR = "NixlConnector"
# The connectors a scheduler scenario may name (scheduler.kv_connector), by vLLM's name.
_SYNC_CONNECTORS = {"decode_bench": "DecodeBenchConnector"}


class SchedulingConfigs:
    """vLLM's configuration and scheduler classes for one loaded vLLM."""

    def __init__(self, vllm: Vllm) -> None:
        self._vllm = vllm

    @contextlib.contextmanager
    def in_process_model_inspection(self) -> Iterator[None]:
        """vLLM's model-architecture inspection in this process, on a machine without CUDA.

        A ``ModelConfig`` or ``SpeculativeConfig`` asks vLLM's model registry what
        its architecture supports; on a cold vLLM cache (``modelinfos/`` under
        ``VLLM_CACHE_ROOT``: a fresh CI container) the registry inspects the model
        class in a fresh Python process (``registry._run_in_subprocess``, "to avoid
        initializing CUDA"), which imports torch and vLLM again: seconds per
        architecture. Where there is no CUDA to initialise, kvconform runs the same
        inspection in this process, where torch and vLLM are already imported; the
        registry still writes the result to its own cache in its own format. With
        CUDA, or a release without that function, vLLM's own way is left alone.
        """
        import torch

        registry = self._vllm.optional_module("vllm.model_executor.models.registry")
        if registry is None or torch.cuda.is_available():
            yield
            return
        original = getattr(registry, "_run_in_subprocess", None)
        if original is None:
            yield
            return
        registry._run_in_subprocess = lambda fn: fn()
        try:
            yield
        finally:
            registry._run_in_subprocess = original

    @contextlib.contextmanager
    def _gpu_engine_configuration(self) -> Iterator[None]:
        """``VllmConfig`` as an engine on a GPU builds it, where vLLM picked its CPU platform.

        On a GPU host kvconform runs a ``.py``-only vLLM tree under
        ``VLLM_TARGET_DEVICE=cpu`` (docs/gpu.md), so vLLM picks its CPU platform, whose
        ``check_and_update_config`` configures vLLM for a CPU worker: it turns asynchronous
        scheduling off ("async scheduling is not required on CPU", every release from
        0.28.0) and, for MLA, chunked prefill. The scheduler would then run another
        configuration than the scenario states, and an asynchronous scenario's chunks
        differ from a development machine's, where vLLM picks no platform (its
        ``UnspecifiedPlatform`` keeps the base class's hooks, which change nothing). The
        scheduler is the same bookkeeping on every device, so while the configuration is
        built the CPU platform's two configuration hooks are the base class's.
        """
        platforms = self._vllm.optional_module("vllm.platforms")
        interface = self._vllm.optional_module("vllm.platforms.interface")
        platform = getattr(platforms, "current_platform", None)
        base = getattr(interface, "Platform", None)
        if platform is None or base is None or not platform.is_cpu():
            yield
            return
        cls = type(platform)
        hooks = [
            name
            for name in ("check_and_update_config", "apply_config_platform_defaults")
            if name in cls.__dict__ and name in base.__dict__
        ]
        saved = {name: cls.__dict__[name] for name in hooks}
        for name in hooks:
            setattr(cls, name, base.__dict__[name])
        try:
            yield
        finally:
            for name, hook in saved.items():
                setattr(cls, name, hook)

    @cached_property
    def _scheduling(self) -> SimpleNamespace:
        """vLLM's configuration, scheduler and output classes (scheduler mode only)."""
        names = {
            "vllm.config": (
                "ModelConfig",
                "SpeculativeConfig",
                "SchedulerConfig",
                "CacheConfig",
                "ParallelConfig",
                "DeviceConfig",
                "KVTransferConfig",
                "VllmConfig",
            ),
            "vllm.v1.outputs": ("ModelRunnerOutput", "DraftTokenIds", "KVConnectorOutput"),
            "vllm.v1.request": ("RequestStatus",),
            "vllm.v1.structured_output": ("StructuredOutputManager",),
        }
        found: dict[str, Any] = {}
        logging.disable(logging.WARNING)
        try:
            for module_name, attrs in names.items():
                try:
                    module = importlib.import_module(module_name)
                except Exception as exc:  # noqa: BLE001 - unimportable means "cannot exercise"
                    raise self._vllm.missing(module_name, f"{type(exc).__name__}: {exc}") from None
                for attr in attrs:
                    if not hasattr(module, attr):
                        raise self._vllm.missing(f"{module_name}.{attr}")
                    found[attr] = getattr(module, attr)
        finally:
            logging.disable(logging.NOTSET)
        return SimpleNamespace(**found)

    def model_config(self, model_dir: str, max_model_len: int) -> Any:
        """A ``ModelConfig`` for a local config-only model folder: no weights, no tokenizer."""
        # skip_tokenizer_init: the structured-output manager would otherwise load one.
        with quiet_logs(), self.in_process_model_inspection():
            return call(
                self._scheduling.ModelConfig,
                model=model_dir,
                skip_tokenizer_init=True,
                max_model_len=max_model_len,
                dtype="float16",
                seed=0,
            )

    def model_speculative_config(
        self, target: Any, method: str, num_speculative_tokens: int, **options: Any
    ) -> Any:
        """A full ``SpeculativeConfig`` for a target ``ModelConfig`` (scheduler mode)."""
        parallel = self._scheduling.ParallelConfig()
        with quiet_logs(), self.in_process_model_inspection():
            return call(
                self._scheduling.SpeculativeConfig,
                method=method,
                num_speculative_tokens=num_speculative_tokens,
                target_model_config=target,
                target_parallel_config=parallel,
                **options,
            )

    def scheduler_vllm_config(
        self,
        model_config: Any,
        speculative_config: Any | None,
        model: ModelSpec,
        limits: SchedulerSpec,
        *,
        num_blocks: int | None,
        remote_prefill: bool = False,
        num_gpu_blocks_override: int | None = None,
        mamba_cache_mode: str | None = None,
    ) -> Any:
        """The ``VllmConfig`` an engine with this model and these scheduler limits would hand
        its scheduler.

        From ``model``: the scheduler block size, prefix caching and its retention interval,
        ``scheduler_reserve_full_isl`` and ``kv_cache_events`` (``KVEventsConfig(
        enable_kv_cache_events=True)`` with vLLM's ``null`` publisher, the engine's
        ``--kv-events-config``; the batches it publishes are observed by
        :meth:`observe_published_events`). From ``limits`` (the scenario's ``scheduler``
        section): the ``SchedulerConfig``'s sequence and token limits, chunked prefill and
        its long-prefill threshold (``long_prefill_token_threshold_adaptive``: its floor at a
        fair share of the token budget, 0.31 on), async scheduling (the mode), the policy,
        ``disable_chunked_mm_input`` (a chunk never ends inside a multimodal input),
        ``prefill_schedule_interval`` (the prefill cadence; stated only when above 1);
        ``kv_connector``, a connector every request goes through (``decode_bench``: vLLM's
        ``DecodeBenchConnector`` as ``kv_both``, which loads synchronously);
        ``kv_load_failure_policy``, the remote prefills' ``KVTransferConfig`` policy for a
        failed KV load (None: vLLM's default); ``log_iteration_details``
        (``ObservabilityConfig.enable_logging_iteration_details``, the engine's
        ``--enable-logging-iteration-details``) and ``spec_decode_metrics``
        (``ObservabilityConfig.per_request_spec_decode_metrics``).

        ``remote_prefill``: a decode instance of a P/D deployment, with vLLM's
        ``NixlConnector`` as its ``kv_consumer`` KV connector. ``num_blocks``: the pool
        the engine sets once it has planned its KV cache; None: the configuration
        before that (startup mode hands it to the planning), with the engine's
        ``num_gpu_blocks_override``.
        ``mamba_cache_mode``: the mode of the scenario's Mamba groups, which a hybrid
        model's config hook (``MambaModelConfig.verify_and_update_config``) would set
        with the Mamba block size (the scheduler block size: the groups share one page).
        """
        api = self._scheduling
        adaptive: dict[str, bool | int] = {}
        if limits.long_prefill_token_threshold_adaptive:
            if not accepts_keyword(api.SchedulerConfig, "long_prefill_token_threshold_adaptive"):
                raise self._vllm.not_offered(
                    "SchedulerConfig.long_prefill_token_threshold_adaptive"
                )
            adaptive["long_prefill_token_threshold_adaptive"] = True
        if limits.prefill_schedule_interval > 1:
            if not accepts_keyword(api.SchedulerConfig, "prefill_schedule_interval"):
                raise self._vllm.not_offered("SchedulerConfig.prefill_schedule_interval")
            adaptive["prefill_schedule_interval"] = limits.prefill_schedule_interval
        load_policy = (
            {"kv_load_failure_policy": limits.kv_load_failure_policy}
            if limits.kv_load_failure_policy
            else {}
        )
        scheduler = call(
            api.SchedulerConfig,
            max_model_len=model_config.max_model_len,
            is_encoder_decoder=False,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            enable_chunked_prefill=limits.enable_chunked_prefill,
            long_prefill_token_threshold=limits.long_prefill_token_threshold,
            async_scheduling=limits.async_scheduling,
            scheduler_reserve_full_isl=model.scheduler_reserve_full_isl,
            policy=limits.policy,
            disable_chunked_mm_input=limits.disable_chunked_mm_input,
            **adaptive,
        )
        mamba = (
            {"mamba_cache_mode": mamba_cache_mode, "mamba_block_size": model.scheduler_block_size}
            if mamba_cache_mode is not None
            else {}
        )
        cache = call(
            api.CacheConfig,
            block_size=model.scheduler_block_size,
            enable_prefix_caching=model.enable_caching,
            prefix_cache_retention_interval=model.prefix_cache_retention_interval,
            num_gpu_blocks_override=num_gpu_blocks_override,
            **mamba,
        )
        parallel = (
            speculative_config.target_parallel_config
            if speculative_config is not None
            and getattr(speculative_config, "target_parallel_config", None) is not None
            else api.ParallelConfig()
        )
        with quiet_logs(), self.in_process_model_inspection(), self._gpu_engine_configuration():
            config = call(
                api.VllmConfig,
                model_config=model_config,
                cache_config=cache,
                parallel_config=parallel,
                scheduler_config=scheduler,
                speculative_config=speculative_config,
                kv_transfer_config=(
                    call(
                        api.KVTransferConfig,
                        kv_connector=_CONNECTOR,
                        kv_role="kv_consumer",
                        **load_policy,
                    )
                    if remote_prefill
                    else call(
                        api.KVTransferConfig,
                        kv_connector=_SYNC_CONNECTORS[limits.kv_connector],
                        kv_role="kv_both",
                    )
                    if limits.kv_connector is not None
                    else None
                ),
                # Without it vLLM fails to infer a device on a machine without one.
                device_config=call(api.DeviceConfig, device="cpu"),
                **self._observability(limits.log_iteration_details, limits.spec_decode_metrics),
                **self._kv_events(model.kv_cache_events),
            )
        if num_blocks is not None:
            # What the engine sets once it has planned the KV cache: the pool size.
            config.cache_config.num_gpu_blocks = num_blocks
        if self._chunked_local_without_hybrid_manager(model, config.speculative_config):
            raise self._vllm.not_offered(
                "the hybrid KV-cache manager for chunked local attention with "
                f"{config.speculative_config.method}",
                "VllmConfig turns it off for chunked local attention with a drafter that "
                "reads the target's hidden states (the scheduler would then run the "
                "chunked layers as full attention)",
            )
        return config

    @staticmethod
    def _chunked_local_without_hybrid_manager(model: ModelSpec, speculative: Any) -> bool:
        """Whether vLLM would run this model's chunked local attention without the hybrid
        KV-cache manager: ``VllmConfig`` disables it for a model with an
        ``attention_chunk_size`` when the drafter uses the target's hidden states (EAGLE and
        its kin; ``ChunkedLocalAttentionManager.find_longest_cache_hit`` asserts the pair
        away). kvconform's scheduler model states no chunk size, so vLLM does not apply
        the rule itself."""
        if speculative is None:
            return False
        if not any(
            GROUP_TYPES[group.type].vllm_class == "ChunkedLocalAttentionSpec"
            for group in model.groups
        ):
            return False
        uses = getattr(speculative, "uses_target_hidden_states", None)
        if uses is None:
            use_eagle = getattr(speculative, "use_eagle", None)
            uses = use_eagle() if callable(use_eagle) else False
        return bool(uses)

    def _kv_events(self, kv_cache_events: bool) -> dict[str, Any]:
        """``VllmConfig``'s ``kv_events_config`` with the events on (none otherwise: vLLM's
        default, off)."""
        if not kv_cache_events:
            return {}
        module = self._vllm.optional_module("vllm.config")
        config_cls = getattr(module, "KVEventsConfig", None)
        if config_cls is None:
            raise self._vllm.not_offered("vllm.config.KVEventsConfig")
        return {"kv_events_config": call(config_cls, enable_kv_cache_events=True, publisher="null")}

    def _observability(
        self, log_iteration_details: bool, spec_decode_metrics: str = "none"
    ) -> dict[str, Any]:
        """``VllmConfig``'s ``observability_config`` for ``log_iteration_details`` and the
        per-request speculative-decoding metrics (none when neither is asked: vLLM's
        default)."""
        options: dict[str, Any] = {}
        if log_iteration_details:
            options["enable_logging_iteration_details"] = True
        if spec_decode_metrics != "none":
            options["per_request_spec_decode_metrics"] = spec_decode_metrics
        if not options:
            return {}
        module = self._vllm.optional_module("vllm.config")
        config_cls = getattr(module, "ObservabilityConfig", None)
        fields = getattr(config_cls, "__dataclass_fields__", {})
        missing = [name for name in options if name not in fields]
        if config_cls is None or missing:
            raise self._vllm.not_offered(f"ObservabilityConfig.{(missing or list(options))[0]}")
        return {"observability_config": call(config_cls, **options)}

    def new_scheduler(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        block_size: int,
        hash_block_size: int,
        log_stats: bool = False,
    ) -> Any:
        """vLLM's scheduler class for this configuration (``Scheduler`` or ``AsyncScheduler``);
        ``log_stats``: as the engine core builds it when stats are logged (its
        ``update_from_output`` returns ``SchedulerStats``)."""
        scheduler_config = vllm_config.scheduler_config
        if not hasattr(scheduler_config, "get_scheduler_cls"):
            raise self._vllm.not_offered("SchedulerConfig.get_scheduler_cls")
        cls = scheduler_config.get_scheduler_cls()
        with quiet_logs():
            return call(
                cls,
                vllm_config=vllm_config,
                kv_cache_config=kv_cache_config,
                structured_output_manager=self._scheduling.StructuredOutputManager(vllm_config),
                block_size=block_size,
                hash_block_size=hash_block_size,
                log_stats=log_stats,
            )

    @contextlib.contextmanager
    def model_runner(self, choice: str) -> Iterator[None]:
        """Build configs and schedulers for model runner ``v1``, ``v2`` or vLLM's ``auto`` choice.

        vLLM reads ``VLLM_USE_V2_MODEL_RUNNER`` while a config or a scheduler is
        built (the scheduler keeps the answer). ``auto`` is what vLLM picks on
        this machine: on a machine without a usable Triton some releases pick V1
        where a GPU host would run V2, and refuse ``v2`` outright.
        """
        if choice == "v1" and not offers_runner("v1"):
            # The scheduler of such a release has no V1 behaviour left to configure.
            raise self._vllm.not_offered(
                "the V1 GPU model runner", "removed in 0.34.0 (vllm/v1/worker/gpu_model_runner.py)"
            )
        value = None if choice == "auto" else ("1" if choice == "v2" else "0")
        with environment_variable("VLLM_USE_V2_MODEL_RUNNER", value):
            yield

    def model_runner_name(self, vllm_config: Any) -> str:
        """``V1`` or ``V2``: the model runner a built config is for (``V1`` before V2
        existed; ``V2`` once the release removed V1 and, with it, the config's flag)."""
        if not offers_runner("v1"):
            return "V2"
        return "V2" if getattr(vllm_config, "use_v2_model_runner", False) else "V1"

    def kv_block_sizes(self, kv_cache_config: Any, vllm_config: Any) -> tuple[int, int]:
        """(scheduler block size, hash block size), as the engine core resolves them."""
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        resolve = getattr(utils, "resolve_kv_cache_block_sizes", None)
        if resolve is None:
            raise self._vllm.not_offered("vllm.v1.core.kv_cache_utils.resolve_kv_cache_block_sizes")
        scheduler_block_size, hash_block_size = resolve(kv_cache_config, vllm_config)
        return int(scheduler_block_size), int(hash_block_size)

    def lookahead_of(self, holder: Any, name: str = "num_lookahead_tokens") -> int | None:
        """An integer attribute a scheduler or config has in some releases only."""
        value = getattr(holder, name, None)
        return int(value) if value is not None else None

    def max_concurrent_batches(self, vllm_config: Any) -> int:
        """Batches the engine keeps in flight (its batch queue size); 2 for async scheduling."""
        value = getattr(vllm_config, "max_concurrent_batches", None)
        if value is None:
            return 2 if vllm_config.scheduler_config.async_scheduling else 1
        return int(value)
