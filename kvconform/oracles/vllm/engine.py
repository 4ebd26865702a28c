"""The engine part of the vLLM compatibility layer: where a release keeps what engine mode hooks.

Engine mode (:mod:`kvconform.oracles.engine`) runs ``vllm.LLM`` in-process and
watches three of its methods. This module is the only place that knows where
they live and how the objects they receive are shaped, per release (measured on
the 0.25.0 and 0.26.0 wheels on an H200, and read in 0.27-0.33):

* ``vllm.v1.worker.gpu_worker.Worker.execute_model(scheduler_output)``: every
  step the worker executes, the warmup's hand-built ones included, since the V2
  warmup is handed the worker's bound ``execute_model``;
* ``vllm.v1.worker.gpu_worker.warmup_kernels``: the V2 warmup, wrapped to label
  the steps it issues;
* ``vllm.v1.worker.gpu.block_table.BlockTables.compute_slot_mappings``: the V2
  runner's and the drafter's slot mappings (the V1 runner has none of these);

and where the lookahead the engine reserves with lives: ``VllmConfig.
num_lookahead_tokens`` from 0.28, the scheduler's ``num_lookahead_tokens``
attribute (set per method in ``Scheduler.__init__``) before.

Engine mode's other uses of vLLM and torch (is there a CUDA device, build the
``LLM``, sampling parameters, what the running engine configured) are here too.
:func:`cuda_available` imports torch only; :func:`registered_architectures` and
:func:`drafter_architecture` ask the loaded vLLM what it would build, on any
machine, before a run; everything else is for the engine child, which needs a
CUDA build of vLLM.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HookPoint:
    """One attribute engine mode replaces for the run: ``owner.name``."""

    owner: Any  # a class (the method is replaced on it) or a module
    name: str


def hook_points() -> dict[str, HookPoint | None]:
    """The release's hook points by role; None where the release has none (V2 parts)."""
    worker = importlib.import_module("vllm.v1.worker.gpu_worker")
    points: dict[str, HookPoint | None] = {
        "execute_model": HookPoint(worker.Worker, "execute_model"),
        "warmup_kernels": (
            HookPoint(worker, "warmup_kernels") if hasattr(worker, "warmup_kernels") else None
        ),
        "slot_mappings": None,
    }
    try:
        block_table = importlib.import_module("vllm.v1.worker.gpu.block_table")
    except ImportError:
        return points
    if hasattr(block_table.BlockTables, "compute_slot_mappings"):
        points["slot_mappings"] = HookPoint(block_table.BlockTables, "compute_slot_mappings")
    return points


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's part in one SchedulerOutput, as the worker receives it."""

    request: str
    new: bool
    resumed: bool
    computed: int
    scheduled: int
    drafts: int
    new_block_ids: tuple[list[int], ...] | None  # None: no block added this step
    prompt_token_ids: list[int] | None = None


def scheduled_requests(output: Any) -> Iterator[ScheduledRequest]:
    """The requests of a SchedulerOutput, new ones first, in the order vLLM lists them."""
    drafts = getattr(output, "scheduled_spec_decode_tokens", None) or {}
    counts = output.num_scheduled_tokens
    for new in output.scheduled_new_reqs:
        yield ScheduledRequest(
            new.req_id,
            True,
            False,
            new.num_computed_tokens,
            counts[new.req_id],
            len(drafts.get(new.req_id, ())),
            tuple(list(ids) for ids in new.block_ids),
            list(new.prompt_token_ids) if new.prompt_token_ids is not None else None,
        )
    cached = output.scheduled_cached_reqs
    resumed_ids = getattr(cached, "resumed_req_ids", None)  # a set from 0.25 on
    resumed_flags = getattr(cached, "resumed_from_preemption", None)  # a list before
    for i, name in enumerate(cached.req_ids):
        if resumed_ids is not None:
            resumed = name in resumed_ids
        else:
            resumed = bool(resumed_flags[i]) if resumed_flags is not None else False
        blocks = cached.new_block_ids[i]
        yield ScheduledRequest(
            name,
            False,
            resumed,
            cached.num_computed_tokens[i],
            counts[name],
            len(drafts.get(name, ())),
            tuple(list(ids) for ids in blocks) if blocks is not None else None,
        )


def finished_requests(output: Any) -> set[str]:
    return set(getattr(output, "finished_req_ids", ()) or ())


def engine_core(llm: Any) -> Any | None:
    """The in-process EngineCore of an ``LLM`` (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    client = getattr(llm.llm_engine, "engine_core", None)
    return getattr(client, "engine_core", None)


def engine_worker(llm: Any) -> Any | None:
    """The in-process engine's GPU worker (``UniProcExecutor.driver_worker.worker``)."""
    executor = getattr(engine_core(llm), "model_executor", None)
    wrapper = getattr(executor, "driver_worker", None)
    return getattr(wrapper, "worker", None)


def engine_lookahead(llm: Any) -> tuple[int | None, str]:
    """What the engine reserves with, and where that was read."""
    config = llm.llm_engine.vllm_config
    value = getattr(type(config), "num_lookahead_tokens", None)
    if value is not None:
        return int(config.num_lookahead_tokens), "the engine's VllmConfig.num_lookahead_tokens"
    core = engine_core(llm)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is not None and hasattr(scheduler, "num_lookahead_tokens"):
        return int(scheduler.num_lookahead_tokens), (
            "the engine's Scheduler.num_lookahead_tokens (this release's VllmConfig has no "
            "num_lookahead_tokens)"
        )
    return None, "not found in this release's engine"


def pool_state(llm: Any) -> tuple[int | None, int | None]:
    """(free blocks, blocks in the pool) of the engine scheduler's KV block pool."""
    core = engine_core(llm)
    manager = getattr(getattr(core, "scheduler", None), "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None)
    if pool is None:
        return None, None
    return int(pool.get_num_free_blocks()), int(pool.num_gpu_blocks)


def kv_groups(llm: Any, worker: Any = None) -> list[dict[str, Any]]:
    """The engine's KV-cache groups, in order: spec class name, block size, attention backend.

    Read from the scheduler's ``KVCacheConfig`` (what its ``KVCacheManager`` allocates
    with); the backend is that of the group's layers in the worker's forward context
    (``compilation_config.static_forward_context``), None where it cannot be read.
    """
    core = engine_core(llm)
    config = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
    groups = []
    for group in getattr(config, "kv_cache_groups", ()) or ():
        spec = group.kv_cache_spec
        groups.append(
            {
                "spec": type(spec).__name__,
                "block_size": int(spec.block_size),
                "backend": _attention_backend(worker, getattr(group, "layer_names", ())),
            }
        )
    return groups


def _attention_backend(worker: Any, layer_names: Any) -> str | None:
    vllm_config = getattr(worker, "vllm_config", None)
    compilation = getattr(vllm_config, "compilation_config", None)
    context = getattr(compilation, "static_forward_context", None) or {}
    names = set()
    for name in layer_names:
        backend = getattr(context.get(name), "attn_backend", None)
        if backend is not None:
            get_name = getattr(backend, "get_name", None)
            names.add(str(get_name()) if callable(get_name) else backend.__name__)
    return ", ".join(sorted(names)) or None


# The modules of the two GPU model runners' classes (vllm/v1/worker/gpu/model_runner.py
# and vllm/v1/worker/gpu_model_runner.py, the same in 0.25-0.33).
_RUNNER_MODULES = {"vllm.v1.worker.gpu.model_runner": "v2", "vllm.v1.worker.gpu_model_runner": "v1"}


def offers_runner(kind: str) -> bool:
    """Whether the release ships the GPU model runner ``kind`` (``v2`` or ``v1``): 0.34.0
    removed the V1 runner (``vllm/v1/worker/gpu_model_runner.py``), and its platform check
    refuses ``VLLM_USE_V2_MODEL_RUNNER=0`` at start-up."""
    module = next(name for name, runner in _RUNNER_MODULES.items() if runner == kind)
    return importlib.util.find_spec(module) is not None


def model_runner_kind(worker: Any) -> str | None:
    """Which GPU model runner the worker built (``v2`` or ``v1``), None where unknown."""
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        return None
    for cls in type(runner).__mro__:
        kind = _RUNNER_MODULES.get(cls.__module__)
        if kind is not None and cls.__name__ == "GPUModelRunner":
            return kind
    return None


def engine_config(llm: Any, worker: Any = None) -> dict[str, Any]:
    """What the running engine was configured with, as vLLM resolved it.

    The worker's ``VllmConfig`` where the worker is known (the one the platform's
    ``update_block_size_for_backend`` and the model runner saw), else the engine's:
    the cache block size and whether vLLM took it as the user's
    (``CacheConfig.user_specified_block_size``, None before the field), prefix
    caching, ``max_model_len``, the model runner, the speculative method and its
    number of tokens, the scheduler options an engine scenario may state, and the
    platform class.
    """
    config = getattr(worker, "vllm_config", None) or llm.llm_engine.vllm_config
    cache, scheduler = config.cache_config, config.scheduler_config
    speculative = config.speculative_config
    from vllm.platforms import current_platform

    def optional(owner: Any, name: str) -> Any:
        value = getattr(owner, name, None)
        return value if value is None or isinstance(value, (bool, str)) else int(value)

    return {
        "block_size": int(cache.block_size),
        "user_specified_block_size": getattr(cache, "user_specified_block_size", None),
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "max_model_len": int(config.model_config.max_model_len),
        "model_runner": model_runner_kind(worker),
        "method": getattr(speculative, "method", None),
        "num_speculative_tokens": optional(speculative, "num_speculative_tokens"),
        "max_num_seqs": optional(scheduler, "max_num_seqs"),
        "max_num_batched_tokens": optional(scheduler, "max_num_batched_tokens"),
        "enable_chunked_prefill": optional(scheduler, "enable_chunked_prefill"),
        "async_scheduling": optional(scheduler, "async_scheduling"),
        "scheduler_reserve_full_isl": optional(scheduler, "scheduler_reserve_full_isl"),
        "platform": type(current_platform).__name__,
    }


def block_table_geometry(tables: Any) -> tuple[list[int], list[int]]:
    """Per group: the block size the slot kernel divides by, and kernel blocks per KV block."""
    sizes = [int(s) for s in tables.block_sizes_tensor.tolist()]
    per = list(getattr(tables, "blocks_per_kv_block", [1] * len(sizes)))
    return sizes, [int(p) for p in per]


def request_index(worker: Any) -> dict[int, str]:
    """The V2 runner's request-state row -> request id, as it is right now."""
    states = getattr(getattr(worker, "model_runner", None), "req_states", None)
    return dict(getattr(states, "index_to_req_id", {}) or {})


def registered_architectures() -> frozenset[str]:
    """The model architectures the loaded vLLM's registry offers, speculative drafters included.

    ``ModelRegistry.get_supported_archs()`` (vllm/model_executor/models/registry.py):
    what ``SpeculativeConfig.update_arch_`` and the target's ``ModelConfig`` look
    architectures up in.
    """
    registry = importlib.import_module("vllm.model_executor.models.registry")
    return frozenset(registry.ModelRegistry.get_supported_archs())


def drafter_architecture(method: str, architecture: str, model_type: str) -> str:
    """What vLLM's ``EAGLEConfig`` makes of a draft of ``architecture`` for ``method``.

    ``SpeculativeConfig.__post_init__`` wraps the config of an EAGLE-family draft in
    ``EAGLEConfig`` (vllm/transformers_utils/configs/eagle.py), which renames its
    architectures; asked here of the loaded release with a bare config of the draft's
    model type, so that a release naming drafters otherwise is heard, not assumed.
    """
    import transformers

    eagle = importlib.import_module("vllm.transformers_utils.configs.eagle")
    config = transformers.AutoConfig.for_model(model_type, architectures=[architecture])
    # As SpeculativeConfig builds it (the model type is EAGLEConfig's own).
    wrapped = eagle.EAGLEConfig(config, method=method, model_type=eagle.EAGLEConfig.model_type)
    return str(wrapped.architectures[0])


def is_capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def cuda_available() -> bool | None:
    """Whether torch sees a CUDA device; None where torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return bool(torch.cuda.is_available())


def runtime() -> tuple[str, str]:
    """(vLLM's version, the GPU's name) in the engine child."""
    import torch
    import vllm

    return str(vllm.__version__), torch.cuda.get_device_name(0)


def new_llm(arguments: dict[str, Any]) -> Any:
    """``vllm.LLM(**arguments)``: the engine, its warmup run as part of it."""
    import vllm

    return vllm.LLM(**arguments)


def sampling_params(max_tokens: int, temperature: float, seed: int | None) -> Any:
    """Exactly ``max_tokens`` tokens (the end-of-sequence token ignored)."""
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=temperature, seed=seed
    )
