"""The facade's warmup predictor: vLLM's ``_reserved_block_count``, bound as its warmup
binds it."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from functools import cached_property
from typing import Any

from kvconform.oracles.vllm.base import VllmBase
from kvconform.oracles.vllm.calls import accepts_keyword, call, quiet_logs


class PredictorPart(VllmBase):
    """The warmup predictor."""

    @cached_property
    def reserved_block_count(self) -> Callable[..., int] | None:
        """vLLM's ``_reserved_block_count``, or None where this release lacks it."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception:  # noqa: BLE001 - an unimportable warmup means "no predictor"
            return None
        return getattr(warmup, "_reserved_block_count", None)

    def block_counter(
        self, *, num_lookahead_tokens: int, max_model_len: int, dcp_world_size: int = 1
    ) -> Callable[..., int] | None:
        """``_reserved_block_count`` bound as ``_warmup_block_counter`` binds it, or None
        where this release lacks it: ``(num_tokens, spec, max_encoder_len=...) -> blocks``.

        The keywords follow the release's signature (*by signature*): 0.28-0.33 take the
        lookahead, ``max_model_len`` and ``max_encoder_len``; 0.34 adds a required
        ``vllm_config`` (its count is capped at the worker's block-table row,
        ``KVCacheSpec.max_num_blocks_per_req``) and ``dcp_world_size`` (a
        ``dcp_sharded`` block spans ``block_size x dcp_world_size`` tokens), which the
        warmup reads from ``vllm_config.parallel_config.decode_context_parallel_size``.
        Releases without the keyword count DCP-blind, as their warmup does.
        """
        fn = self.reserved_block_count
        if fn is None:
            return None
        bound: dict[str, Any] = {
            "num_lookahead_tokens": num_lookahead_tokens,
            "max_model_len": max_model_len,
        }
        if accepts_keyword(fn, "dcp_world_size"):
            bound["dcp_world_size"] = dcp_world_size
        if accepts_keyword(fn, "vllm_config"):
            bound["vllm_config"] = self.predictor_vllm_config(dcp_world_size)
        return functools.partial(fn, **bound)

    def predictor_vllm_config(self, dcp_world_size: int = 1) -> Any:
        """The ``VllmConfig`` the predictor's row cap reads: vLLM's own, without a model.

        What ``max_num_blocks_per_req`` reads of it in 0.34 is the parallel config's
        ``decode_context_parallel_size`` (attention specs; Mamba specs are counted
        before the cap, cross-attention and circular buffers return earlier). So it is a
        real ``VllmConfig`` of a real ``ParallelConfig`` whose DCP size is the scenario's,
        on the fewest tensor-parallel ranks that allow it (DCP reuses the TP ranks:
        ``tp_size`` must be divisible by ``dcp_size``), and ``DeviceConfig("cpu")``, as
        scheduler mode builds its configs (vLLM cannot infer a device on a machine
        without one; nothing the cap reads depends on it). Built once per DCP size.
        """
        return self._remembered(
            ("predictor_vllm_config", dcp_world_size),
            lambda: self._model_free_vllm_config(dcp_world_size),
        )

    def _model_free_vllm_config(self, dcp_world_size: int) -> Any:
        config = importlib.import_module("vllm.config")
        with quiet_logs():
            parallel = call(
                config.ParallelConfig,
                tensor_parallel_size=dcp_world_size,
                decode_context_parallel_size=dcp_world_size,
            )
            return call(
                config.VllmConfig,
                parallel_config=parallel,
                device_config=call(config.DeviceConfig, device="cpu"),
            )

    def predictor_missing_reason(self) -> str:
        try:
            importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception as exc:  # noqa: BLE001
            return f"vllm.v1.worker.gpu.warmup does not import ({type(exc).__name__}: {exc})"
        return f"vLLM {self.version} has no vllm.v1.worker.gpu.warmup._reserved_block_count"
