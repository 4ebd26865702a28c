"""vLLM's DFlash / DSpark input kernel: where those drafters write their query KV.

EAGLE-family drafters and draft models map the positions they write with
``BlockTables.compute_slot_mappings`` (:mod:`.slot_kernel`). DFlash and DSpark do
not: ``DFlashSpeculator`` (and ``DSparkSpeculator``, its subclass) builds the
drafter's inputs with ``prepare_dflash_inputs``
(``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py``), a Triton kernel that
computes, per request of the batch, the query positions ``last_valid_pos + 1 ..
last_valid_pos + num_query_per_req`` and their slots from the model runner's
*gathered* block table (``BlockTables.input_block_tables``: one row per batch
position, filled by ``gather_block_tables``). What it does with a column past the
blocks a request holds differs from ``compute_slot_mappings``, and between
releases (measured on 0.25.0 - 0.33.0, ``docs/findings.md`` #5):

* the column is clamped to the row's last column (``tl.minimum(query_pos //
  block_size, block_table_stride - 1)``) instead of running into the next row;
* a column holding 0 (the null block) gives ``PAD_SLOT_ID``, nothing written,
  from 0.28.0 on (``q_resident = is_query & (q_block_id != 0)``); before, the
  slot ``0 * block_size + offset``, a write into the null block;
* any other id is written into, whoever holds it now: ``gather_block_tables``
  copies only the columns a request holds into its batch row, so the columns past
  them keep what an earlier step gathered into that batch position.

This module runs that kernel of the loaded vLLM, with Triton's interpreter on a
machine without CUDA (the process set-up of :func:`.slot_kernel.prepare_slot_kernel`),
on rows kvconform writes itself: one batch entry per (holding, last target
position), a single scheduled token each (the query slots depend on the last valid
position and the row only), nothing rejected. Signatures differ between releases
(``temperature``/``seeds`` from 0.27, context-parallel arguments from 0.29,
``num_reqs_override`` in 0.33): everything is passed by keyword through
:func:`.calls.call`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from kvconform.errors import VllmUnavailable
from kvconform.oracles.vllm.calls import call
from kvconform.oracles.vllm.slot_kernel import _cuda_available, _kernel_setup_now

if TYPE_CHECKING:
    from kvconform.oracles.vllm.core import Vllm

__all__ = ["DflashKernel", "dflash_kernel_of"]

MODULE = "vllm.v1.worker.gpu.spec_decode.dflash.speculator"


class DflashKernel:
    """``prepare_dflash_inputs`` of the loaded vLLM, ready to map query positions."""

    def __init__(self, vllm: Vllm, module: Any, interpreter: bool) -> None:
        import torch

        self.version = vllm.version
        self._module = module
        self._torch = torch
        self._input_buffers = importlib.import_module("vllm.v1.worker.gpu.input_batch").InputBuffers
        utils = importlib.import_module("vllm.v1.attention.backends.utils")
        self.pad_slot_id = int(utils.PAD_SLOT_ID)
        self.interpreter = interpreter
        self.device = torch.device("cpu" if interpreter else "cuda")

    @property
    def mode(self) -> str:
        import triton

        where = (
            "under Triton's interpreter on the CPU"
            if self.interpreter
            else f"compiled by Triton on {self._torch.cuda.get_device_name(0)}"
        )
        return (
            f"vLLM {self.version}'s prepare_dflash_inputs (_prepare_dflash_inputs_kernel) "
            f"{where} (Triton {triton.__version__})"
        )

    def query_slots(
        self,
        rows: Sequence[Sequence[int]],
        last_positions: Sequence[int],
        num_query: int,
        block_size: int,
        max_model_len: int,
        sample_from_anchor: bool = False,
    ) -> list[list[int]]:
        """Per entry, the slots of its ``num_query`` queries (``PAD_SLOT_ID``: not written).

        Entry ``i`` has its single scheduled token at ``last_positions[i]`` and the
        gathered row ``rows[i]`` (all rows as wide as the first); its queries sit at
        ``last_positions[i] + 1 ..``.
        """
        import numpy as np  # here: the checks' registry is imported by `merge`, which has no numpy

        torch = self._torch
        n = len(rows)
        if n == 0:
            return []
        device = self.device
        width = len(rows[0])
        table = torch.tensor([list(r) for r in rows], dtype=torch.int32, device=device)
        assert table.shape == (n, width)
        steps = max(num_query, 1)
        max_tokens = n * num_query + 1
        buffers = self._input_buffers(n, max_tokens, device)
        batch = SimpleNamespace(
            num_reqs=n,
            num_scheduled_tokens=np.ones(n, dtype=np.int32),
            positions=torch.tensor(list(last_positions), dtype=torch.int64, device=device),
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=device),
            idx_mapping=torch.arange(n, dtype=torch.int32, device=device),
        )
        query_slots = torch.full((max_tokens,), -7, dtype=torch.int64, device=device)

        def zeros(size: int, dtype: Any) -> Any:
            return torch.zeros(size, dtype=dtype, device=device)

        call(
            self._module.prepare_dflash_inputs,
            input_buffers=buffers,
            query_slot_mapping=query_slots,
            context_positions=zeros(max_tokens, torch.int64),
            context_slot_mapping=zeros(max_tokens, torch.int64),
            sample_indices=zeros(n * steps, torch.int64),
            sample_pos=zeros(n * steps, torch.int64),
            sample_idx_mapping=zeros(n * steps, torch.int32),
            temperature=zeros(n, torch.float32),
            seeds=zeros(n, torch.int64),
            input_batch=batch,
            num_sampled=torch.ones(n, dtype=torch.int32, device=device),
            num_rejected=zeros(n, torch.int32),
            last_sampled=zeros(n, torch.int64),
            next_prefill_tokens=zeros(n, torch.int32),
            input_temperature=zeros(n, torch.float32),
            input_seeds=zeros(n, torch.int64),
            block_table=table,
            block_size=block_size,
            cp_rank=0,
            cp_size=1,
            cp_interleave=1,
            parallel_drafting_token_id=0,
            num_query_per_req=num_query,
            num_speculative_steps=steps,
            max_num_reqs=n,
            max_num_tokens=max_tokens,
            max_model_len=max_model_len,
            sample_from_anchor=sample_from_anchor,
        )
        slots = query_slots.cpu().tolist()
        return [slots[i * num_query : (i + 1) * num_query] for i in range(n)]


def _find(vllm: Vllm) -> DflashKernel | VllmUnavailable:
    setup = _kernel_setup_now()
    if setup.problem is not None:
        return vllm.missing("a runnable DFlash input kernel", setup.problem)
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # noqa: BLE001 - no speculator module means "cannot map"
        return vllm.missing(f"an importable {MODULE}", f"{type(exc).__name__}: {exc}")
    for name in ("prepare_dflash_inputs", "_prepare_dflash_inputs_kernel"):
        if not hasattr(module, name):
            return vllm.missing(f"{MODULE}.{name}")
    kind = type(module._prepare_dflash_inputs_kernel).__name__
    if kind == "InterpretedFunction":
        return DflashKernel(vllm, module, True)
    if kind != "JITFunction":
        return vllm.missing(
            "a Triton kernel to run", "vLLM disabled Triton: its kernels are plain functions"
        )
    if not _cuda_available():
        return vllm.missing(
            "a device for the compiled DFlash input kernel",
            "no CUDA device, and Triton's interpreter was not selected before vLLM was imported",
        )
    return DflashKernel(vllm, module, False)


def dflash_kernel_of(vllm: Vllm) -> DflashKernel:
    """vLLM's ``prepare_dflash_inputs``, ready to run; raises :class:`VllmUnavailable` if not."""
    kernel = vllm.part(_find)
    if isinstance(kernel, VllmUnavailable):
        raise kernel
    return kernel
