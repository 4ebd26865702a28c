"""Startup mode's part of the facade: vLLM's own startup KV-cache planning.

Only :mod:`kvconform.oracles.startup` uses it. What ``EngineCore._initialize_kv_caches``
does between the workers' KV-cache specs and the scheduler's ``KVCacheConfig``:
resolve the KV-cache layout (``resolve_kv_cache_layout``, 0.32 on), group the layers
(``get_global_kv_cache_groups``, 0.33 on; before, ``get_kv_cache_configs`` grouped
them itself), then ``get_kv_cache_configs`` with the profiled memory: it applies
``num_gpu_blocks_override``, keeps the null block back, fits ``max_model_len`` where
it is -1 (auto-fit), checks that one ``max_model_len`` request fits
(``_check_enough_kv_cache_memory``, a ``ValueError`` otherwise) and sizes the pool.

Release differences handled here: where the planning lives
(``vllm.v1.core.kv_cache_planning`` in 0.33, ``kv_cache_utils`` before), whether
the layers are grouped before ``get_kv_cache_configs`` (its
``global_kv_cache_groups`` argument), the layout resolution, and the signature of
``_pool_bytes_per_block`` (the bytes of one pool block, which turn the scenario's
memory in blocks into bytes), all by presence and by signature.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvconform.oracles.vllm.calls import call, quiet_logs
from kvconform.oracles.vllm.core import Vllm

__all__ = ["PlanResult", "PlannedGroup", "Planning"]

# Where the planning functions live, newest first.
_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")
_LAYOUTS = "vllm.v1.attention.backends.utils"


@dataclass(frozen=True)
class PlannedGroup:
    """One KV-cache group vLLM's planning formed: its spec class, block size and layers."""

    spec_class: str
    block_size: int
    layers: int

    @property
    def label(self) -> str:
        return (
            f"{self.spec_class}(block {self.block_size}, "
            f"{self.layers} layer{'s' if self.layers != 1 else ''})"
        )


@dataclass(frozen=True)
class PlanResult:
    """What vLLM's planning decided; ``refusal`` the first line of its ``ValueError``."""

    accepted: bool
    function: str
    bytes_per_block: int
    max_model_len: int
    num_blocks: int | None = None
    refusal: str = ""
    groups: tuple[PlannedGroup, ...] = ()


class Planning:
    """vLLM's startup KV-cache planning for one loaded vLLM: ``vllm.part(Planning)``."""

    def __init__(self, vllm: Vllm) -> None:
        self._vllm = vllm
        module = next(
            (m for m in map(vllm.optional_module, _MODULES) if hasattr(m, "get_kv_cache_configs")),
            None,
        )
        if module is None:
            raise vllm.missing("get_kv_cache_configs (vllm.v1.core.kv_cache_planning)")
        self._module: Any = module

    def _function(self, name: str) -> Any:
        function = getattr(self._module, name, None)
        if function is None:
            raise self._vllm.missing(f"{self._module.__name__}.{name}")
        return function

    def plan(self, vllm_config: Any, layers: dict[str, Any], available_blocks: int) -> PlanResult:
        """Plan the KV cache of a model whose layers have these specs, as the engine core does.

        ``vllm_config`` carries ``num_gpu_blocks_override`` and, for auto-fit, a
        ``ModelConfig`` built with ``max_model_len=-1``; it is changed in place (the
        layout, auto-fit's ``max_model_len``), as the engine core's is.
        ``available_blocks``: the profiled memory, in pool blocks.
        """
        with quiet_logs():
            self._resolve_layout(vllm_config, layers)
            # The engine core's hybrid KV-cache manager: a CUDA platform keeps it on for a
            # model without a KV connector or chunked local attention; vLLM's CPU platform
            # turns it off, which would unify the groups of a hybrid model.
            vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
            grouped = getattr(self._module, "get_global_kv_cache_groups", None)
            global_groups = grouped(vllm_config, [dict(layers)]) if grouped is not None else None
            probe_groups = (
                global_groups
                if global_groups is not None
                else self._function("get_kv_cache_groups")(vllm_config, copy.copy(dict(layers)))
            )
            bytes_per_block = int(
                call(
                    self._function("_pool_bytes_per_block"),
                    vllm_config=vllm_config,
                    kv_cache_groups=probe_groups,
                )
            )
            try:
                configs = call(
                    self._function("get_kv_cache_configs"),
                    vllm_config=vllm_config,
                    kv_cache_specs=[dict(layers)],
                    available_memory=[available_blocks * bytes_per_block],
                    global_kv_cache_groups=global_groups,
                )
            except ValueError as exc:
                return PlanResult(
                    False,
                    "get_kv_cache_configs",
                    bytes_per_block,
                    int(vllm_config.model_config.max_model_len),
                    refusal=_first_line(exc),
                    groups=_labels(probe_groups),
                )
        config = configs[0]
        return PlanResult(
            True,
            "get_kv_cache_configs",
            bytes_per_block,
            int(vllm_config.model_config.max_model_len),
            num_blocks=int(config.num_blocks),
            groups=_labels(config.kv_cache_groups),
        )

    def _resolve_layout(self, vllm_config: Any, layers: dict[str, Any]) -> None:
        """``resolve_kv_cache_layout`` with the layouts a worker whose backends declare
        none supports (vLLM's default preference), where the release resolves one."""
        layouts = self._vllm.optional_module(_LAYOUTS)
        resolve = getattr(layouts, "resolve_kv_cache_layout", None)
        supported = getattr(layouts, "get_supported_kv_cache_layouts", None)
        if resolve is None or supported is None:
            return
        names = [layout.name for layout in supported([])]
        resolve(vllm_config, [names], list(layers.values()))


def _labels(groups: Any) -> tuple[PlannedGroup, ...]:
    return tuple(
        PlannedGroup(
            type(g.kv_cache_spec).__name__, int(g.kv_cache_spec.block_size), len(g.layer_names)
        )
        for g in groups
    )


def _first_line(exc: BaseException) -> str:
    """vLLM's reason, without its advice ("Try increasing ...", links)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text.split(" Try ")[0].strip()
