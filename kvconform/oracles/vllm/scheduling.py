"""Scheduler mode's part of the facade: vLLM's configs, its ``Scheduler`` and model outputs.

Only :mod:`kvconform.oracles.scheduler` uses it. It builds what an engine would hand
its scheduler (a ``ModelConfig`` from a local config-only folder, a full
``SpeculativeConfig``, the ``VllmConfig`` with the pool size the engine would set
after profiling), the scheduler class the config picks, and the model-runner
outputs the scheduler reads back. Release differences handled here: the V2 model
runner switch, ``resolve_kv_cache_block_sizes``, ``max_concurrent_batches``,
0.33's ``skip_drafts`` and dynamic draft counts.

Remote prefill (P/D disaggregation, a decode instance): the configuration carries
vLLM's own ``NixlConnector`` as a ``kv_consumer``; its scheduler side runs without
a worker, as in vLLM's own connector unit tests (``tests/v1/kv_connector/unit``):
a request whose ``kv_transfer_params`` say ``do_remote_prefill`` gets its prompt's
KV loaded asynchronously (``WAITING_FOR_REMOTE_KVS``), and the fabricated model
output reports the transfer received (``KVConnectorOutput.finished_recving``).
A scenario may instead name a connector every request goes through
(``scheduler.kv_connector``): ``decode_bench``, vLLM's ``DecodeBenchConnector``, loads a
new request's prompt synchronously and tells the worker so in the output's
``kv_connector_metadata``; it needs no worker's answer.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from functools import cached_property
from types import SimpleNamespace
from typing import Any

from kvconform.model.scenario import ModelSpec, SchedulerSpec
from kvconform.oracles.vllm.calls import accepts_keyword, call, quiet_logs
from kvconform.oracles.vllm.core import Vllm

__all__ = ["Scheduling"]

# The KV connector of remote-prefill scenarios: vLLM's NIXL connector (pull mode), whose
# scheduler side reports a remote prefill's prompt as external tokens loaded asynchronously.
_CONNECTOR = "NixlConnector"
# The connectors a scheduler scenario may name (scheduler.kv_connector), by vLLM's name.
_SYNC_CONNECTORS = {"decode_bench": "DecodeBenchConnector"}


class Scheduling:
    """vLLM's scheduling classes for one loaded vLLM: ``vllm.part(Scheduling)``."""

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
        with quiet_logs(), self.in_process_model_inspection():
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
        return config

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

    def finished_spec_decode_metrics(self, engine_core_outputs: Any) -> dict[str, Any]:
        """The ``RequestSpecDecodeMetrics`` of the requests an ``update_from_output`` finished
        (``EngineCoreOutput.spec_decode_metrics``, set at the finish only), by request id."""
        found = {}
        for outputs in (engine_core_outputs or {}).values():
            for output in getattr(outputs, "outputs", ()) or ():
                metrics = getattr(output, "spec_decode_metrics", None)
                if metrics is not None:
                    found[output.request_id] = metrics
        return found

    def observe_published_events(self, scheduler: Any) -> list[Any]:
        """The KV-cache events the scheduler publishes (``update_from_output`` hands each
        step's batch to its ``kv_event_publisher``), appended to the list returned as they
        are published. The publisher's ``publish`` is wrapped on the instance to see the
        batch; the wrapper hands it on unchanged."""
        published: list[Any] = []
        publisher = getattr(scheduler, "kv_event_publisher", None)
        if publisher is None:
            raise self._vllm.not_offered("Scheduler.kv_event_publisher")
        publish = publisher.publish

        def observed(batch: Any) -> Any:
            published.extend(batch.events)
            return publish(batch)

        publisher.publish = observed
        return published

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
        name = "VLLM_USE_V2_MODEL_RUNNER"
        before = os.environ.get(name)
        if choice == "auto":
            os.environ.pop(name, None)
        else:
            os.environ[name] = "1" if choice == "v2" else "0"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before

    def model_runner_name(self, vllm_config: Any) -> str:
        """``V1`` or ``V2``: the model runner a built config is for (``V1`` before it existed)."""
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

    def scheduled_drafts(self, scheduler_output: Any) -> dict[str, list[int]]:
        return dict(scheduler_output.scheduled_spec_decode_tokens or {})

    def skips_drafts(self, scheduler_output: Any) -> bool:
        """Whether the model runner proposes no drafts after this step (0.33's ``skip_drafts``)."""
        return bool(getattr(scheduler_output, "skip_drafts", False))

    def drafts_per_step(self, scheduler_output: Any, num_speculative_tokens: int) -> int:
        """How many drafts the drafter proposes after this step (dynamic speculation aware)."""
        return int(getattr(scheduler_output, "num_spec_tokens_to_schedule", 0) or 0) or (
            num_speculative_tokens
        )

    def model_runner_output(
        self,
        req_ids: list[str],
        sampled: list[list[int]],
        finished_recving: set[str] | None = None,
        failed_recving: set[str] | None = None,
        invalid_block_ids: set[int] | None = None,
    ) -> Any:
        """What the runner returns; ``finished_recving``: KV transfers it received this step;
        ``failed_recving``: those of them that failed as a whole; ``invalid_block_ids``: blocks
        a transfer left unwritten (what the worker's connector reports)."""
        connector_output = (
            call(
                self._scheduling.KVConnectorOutput,
                finished_recving=set(finished_recving),
                failed_recving=set(failed_recving or ()),
                invalid_block_ids=set(invalid_block_ids or ()),
            )
            if finished_recving
            else None
        )
        return call(
            self._scheduling.ModelRunnerOutput,
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )

    def remote_prefill_params(self, request_id: str, prompt_len: int, block_size: int) -> dict:
        """``kv_transfer_params`` of a request prefilled on a remote instance.

        The fields the router hands a decode instance, as vLLM's connector unit
        tests build them (``create_request(do_remote_prefill=True)``): the remote
        engine, its request and the blocks holding the prompt's KV there.
        """
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": "kvconform-prefill",
            "remote_request_id": f"prefill-{request_id}",
            "remote_block_ids": list(range(-(-prompt_len // block_size))),
            "remote_host": "localhost",
            "remote_port": 1234,
            "tp_size": 1,
        }

    def reports_failed_loads(self) -> bool:
        """Whether the worker can report a whole KV load failed (``failed_recving``, 0.30 on)."""
        import dataclasses

        output = self._scheduling.KVConnectorOutput
        fields = (
            {f.name for f in dataclasses.fields(output)}
            if dataclasses.is_dataclass(output)
            else set()
        )
        return "failed_recving" in fields

    def reset_prefix_cache(self, scheduler: Any, running: bool, connector: bool = False) -> bool:
        """``Scheduler.reset_prefix_cache``: what an RLHF weight update or the admin endpoint
        calls; with ``running`` it preempts the running requests first; with ``connector`` it
        resets the KV connector's cache too (``reset_connector_cache``)."""
        extra = {"reset_connector": True} if connector else {}
        return bool(scheduler.reset_prefix_cache(reset_running_requests=running, **extra))

    def is_loading_remote_kv(self, request: Any) -> bool:
        """Whether a request waits for its asynchronous KV load (``WAITING_FOR_REMOTE_KVS``)."""
        return bool(request.status == self._scheduling.RequestStatus.WAITING_FOR_REMOTE_KVS)

    def abort(self, scheduler: Any, request_id: str) -> None:
        """The client aborts a request: what ``EngineCore.abort_requests`` asks the scheduler.

        ``Scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)``: vLLM frees the
        request's blocks, or, for a request whose KV a connector still loads
        (``WAITING_FOR_REMOTE_KVS``), keeps them until the load reports done.
        """
        finish = getattr(scheduler, "finish_requests", None)
        if finish is None:
            raise self._vllm.missing("Scheduler.finish_requests")
        with quiet_logs():
            finish([request_id], self._scheduling.RequestStatus.FINISHED_ABORTED)

    def observe_deferred_frees(
        self,
        scheduler: Any,
        popped: Callable[[Any, tuple[list[int], ...]], None],
        drained: Callable[[list[tuple[list[int], int, int]]], None],
    ) -> bool:
        """With overlapping batches and a ``kv_consumer`` connector vLLM defers the blocks
        of a request freed while a step that may write them is in flight
        (``Scheduler.defer_block_free``): ``KVCacheManager.pop_blocks_for_free`` takes them
        out of the request's table and ``_drain_deferred_frees`` returns them to the pool
        once that step's output is processed. ``popped(request, table)`` follows each pop,
        with the request's table (per group) before it; ``drained(returned)`` each drain,
        with what it returned: (block ids, free blocks before, after), one per deferred
        entry. False: this scheduler defers nothing (nothing observed)."""
        if not getattr(scheduler, "defer_block_free", False):
            return False
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        pop, drain = manager.pop_blocks_for_free, scheduler._drain_deferred_frees

        def recording_pop(request: Any) -> Any:
            table = tuple(list(ids) for ids in manager.get_block_ids(request.request_id))
            blocks = pop(request)
            popped(request, table)
            return blocks

        def recording_drain() -> None:
            free_blocks = pool.free_blocks
            returned: list[tuple[list[int], int, int]] = []

            def recording_free_blocks(blocks: Any) -> None:
                blocks = list(blocks)
                before = pool.get_num_free_blocks()
                free_blocks(blocks)
                returned.append(([b.block_id for b in blocks], before, pool.get_num_free_blocks()))

            pool.free_blocks = recording_free_blocks
            try:
                drain()
            finally:
                pool.free_blocks = free_blocks
            if returned:
                drained(returned)

        manager.pop_blocks_for_free = recording_pop
        scheduler._drain_deferred_frees = recording_drain
        return True

    def is_aborted(self, request: Any) -> bool:
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_ABORTED)

    def status_name(self, request: Any) -> str:
        status = request.status
        return str(getattr(status, "name", status))

    def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any:
        return call(self._scheduling.DraftTokenIds, req_ids=req_ids, draft_token_ids=drafts)

    # -- multimodal encoder inputs ---------------------------------------------------

    def mm_features(self, inputs: list[tuple[int, int, str]]) -> list[Any]:
        """A request's ``mm_features`` for ``(offset, length, identifier)`` placeholder ranges.

        As vLLM's own scheduler tests build them (``tests/v1/core/utils.py``,
        ``create_requests(mm_positions=...)``): a ``MultiModalFeatureSpec`` of modality
        ``image`` per input, its data ``MultiModalKwargsItem.dummy()`` (the scheduler never
        reads it), its ``PlaceholderRange`` and identifier (the mm hash).
        """
        module = self._vllm.optional_module("vllm.multimodal.inputs")
        names = ("MultiModalFeatureSpec", "MultiModalKwargsItem", "PlaceholderRange")
        missing = [n for n in names if not hasattr(module, n)]
        if module is None or missing:
            raise self._vllm.not_offered(f"vllm.multimodal.inputs.{(missing or names)[0]}")
        item = module.MultiModalKwargsItem
        return [
            call(
                module.MultiModalFeatureSpec,
                data=item.dummy(),
                modality="image",
                identifier=identifier,
                mm_position=call(module.PlaceholderRange, offset=offset, length=length),
            )
            for offset, length, identifier in inputs
        ]

    def install_encoder_budget(
        self,
        scheduler: Any,
        largest_input: int,
        max_num_encoder_input_tokens: int | None,
        encoder_cache_size: int | None,
    ) -> tuple[int, int]:
        """Give a scheduler built for the text-only tiny model an encoder budget and cache.

        A multimodal model's scheduler gets them from ``MultiModalBudget``, which asks the
        model's processor for the most tokens an item takes and hands that to
        ``compute_mm_encoder_budget(scheduler_config, ...)``; the processor needs the model's
        tokenizer and image processor, which a config-only model has not. So, as vLLM's own
        scheduler tests do on a text model (``scheduler.max_num_encoder_input_tokens = ...``,
        ``scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=...)``), the two
        are set on the built scheduler, from vLLM's own ``compute_mm_encoder_budget`` with the
        scenario's largest input as the most tokens per item. The starting values are the
        config's (``max_num_batched_tokens``, set in ``SchedulerConfig.__post_init__``), or
        what the scenario states in their place. Returns (compute budget, cache size).
        """
        utils = self._vllm.optional_module("vllm.v1.core.encoder_cache_manager")
        compute = getattr(utils, "compute_mm_encoder_budget", None)
        if compute is None:
            raise self._vllm.not_offered(
                "vllm.v1.core.encoder_cache_manager.compute_mm_encoder_budget"
            )
        config = scheduler.scheduler_config
        if max_num_encoder_input_tokens is not None:
            config.max_num_encoder_input_tokens = max_num_encoder_input_tokens
        if encoder_cache_size is not None:
            config.encoder_cache_size = encoder_cache_size
        with quiet_logs():
            budget, cache_size = compute(config, {"image": largest_input})
        create_manager = getattr(type(scheduler.encoder_cache_manager), "create_manager", None)
        if create_manager is None:
            raise self._vllm.not_offered("EncoderCacheManager.create_manager")
        scheduler.max_num_encoder_input_tokens = budget
        scheduler.encoder_cache_manager = call(
            create_manager,
            cache_size=cache_size,
            vllm_config=scheduler.vllm_config,
        )
        return int(budget), int(cache_size)

    def scheduled_encoder_inputs(self, scheduler_output: Any) -> dict[str, list[int]]:
        """The encoder inputs a step runs, by request (their indexes in ``mm_features``)."""
        return {
            rid: list(ids)
            for rid, ids in (
                getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}
            ).items()
        }

    def encoder_input_stats(self, scheduler_output: Any) -> tuple[int, int] | None:
        """The step's ``scheduled_encoder_input_stats`` (``log_iteration_details``): the
        encoder inputs it schedules and their embeddings; None where it carries none."""
        stats = getattr(scheduler_output, "scheduled_encoder_input_stats", None)
        if stats is None:
            return None
        return int(stats.num_inputs), int(stats.output_tokens)

    def freed_encoder_outputs(self, scheduler_output: Any) -> list[str]:
        """The mm hashes whose encoder outputs the worker drops before the step runs."""
        return list(getattr(scheduler_output, "free_encoder_mm_hashes", None) or ())

    # -- stopping and stats (stop_at, scheduler.log_stats) ---------------------------------

    def is_stopped(self, request: Any) -> bool:
        """Whether a request finished on a stop token or its EOS (``FINISHED_STOPPED``)."""
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_STOPPED)

    def is_errored(self, request: Any) -> bool:
        """Whether a request finished with an error (``FINISHED_ERROR``: vLLM rejected it)."""
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_ERROR)

    def scheduler_stats(self, engine_core_outputs: Any) -> Any | None:
        """The ``SchedulerStats`` an ``update_from_output`` returned (to one front-end only)."""
        for outputs in (engine_core_outputs or {}).values():
            stats = getattr(outputs, "scheduler_stats", None)
            if stats is not None:
                return stats
        return None

    def pause_new_requests(self, scheduler: Any, paused: bool) -> None:
        """``EngineCore.pause_scheduler(mode="wait")`` (``PauseState.PAUSED_NEW``: what runs
        keeps running, nothing new is admitted) or ``resume_scheduler`` (``UNPAUSED``)."""
        interface = self._vllm.optional_module("vllm.v1.core.sched.interface")
        states = getattr(interface, "PauseState", None) if interface is not None else None
        if states is None or not hasattr(scheduler, "set_pause_state"):
            raise self._vllm.not_offered("vllm.v1.core.sched.interface.PauseState")
        with quiet_logs():
            scheduler.set_pause_state(states.PAUSED_NEW if paused else states.UNPAUSED)

    def abort_all(self, scheduler: Any) -> None:
        """``EngineCore.pause_scheduler(mode="abort")``'s first move: every request aborted
        (``Scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)``)."""
        with quiet_logs():
            scheduler.finish_requests(None, self._scheduling.RequestStatus.FINISHED_ABORTED)
