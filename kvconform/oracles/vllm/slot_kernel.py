"""vLLM's slot-mapping kernel: process set-up, device stand-ins, and the kernel itself.

The slots party (:mod:`kvconform.oracles.slots`) runs vLLM's own ``BlockTables`` and
its Triton kernel ``_compute_slot_mappings_kernel``. With a CUDA device that is the
compiled kernel. Without one it is the same kernel under Triton's interpreter, which
has to be chosen before vLLM decorates its kernels, i.e. before vLLM is imported;
hence :func:`prepare_slot_kernel`, which :func:`~kvconform.oracles.vllm.loading.load`
calls first and the pytest plugin before any test module imports vLLM. Measured
recipe: ``docs/slots.md``.

It runs whichever checks are selected because it also decides what vLLM believes about
Triton: ``vllm.triton_utils`` sets ``HAS_TRITON`` from the active Triton drivers, which a
machine without CUDA has none of, except when ``CUDA_VISIBLE_DEVICES`` is empty. vLLM
0.28-0.32 refuse Model Runner V2 without Triton ("Model Runner V2 requires Triton") and
let ``model_runner: auto`` pick V1; 0.33 does neither on its unspecified platform.
Prepared only for the slots check, the same scheduler scenario ran V2 with ``--checks
all`` and V1 (or was refused) with the default checks.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvconform.errors import VllmUnavailable
from kvconform.oracles.vllm.calls import call

if TYPE_CHECKING:
    from kvconform.oracles.vllm.core import Vllm

__all__ = ["KernelSetup", "SlotKernel", "SlotTables", "prepare_slot_kernel", "slot_kernel_of"]


@dataclass(frozen=True)
class KernelSetup:
    """What :func:`prepare_slot_kernel` found and changed in this process."""

    interpreter: bool  # Triton's interpreter (TRITON_INTERPRET=1) rather than compiled
    settings: tuple[str, ...] = ()  # environment variables it set, as NAME=value
    problem: str | None = None  # why the kernel cannot run in this process


_KERNEL_SETUP: KernelSetup | None = None


def prepare_slot_kernel() -> KernelSetup:
    """Make this process able to run vLLM's slot-mapping kernel; call before :func:`load`.

    * With a CUDA device nothing changes: vLLM's kernel is compiled by Triton.
    * Without one, ``TRITON_INTERPRET=1`` makes Triton interpret the same kernel on
      host memory. Triton reads it when a kernel is decorated, i.e. when vLLM
      imports ``block_table.py``, so it must be set first.
    * Without one, ``CUDA_VISIBLE_DEVICES`` is set empty: vLLM's ``triton_utils``
      disables Triton (``HAS_TRITON = False``, kernels become plain functions) when
      it finds no active Triton driver, except when that variable is empty.

    Idempotent. ``VLLM_TARGET_DEVICE`` is left alone: vLLM's platform stays what it
    would be without the slots check (the other parties see the same vLLM), and
    :class:`SlotKernel` supplies the host buffers that platform would need.
    """
    global _KERNEL_SETUP
    if _KERNEL_SETUP is not None:
        return _KERNEL_SETUP
    if importlib.util.find_spec("triton") is None:
        _KERNEL_SETUP = KernelSetup(False, problem="Triton is not installed")
        return _KERNEL_SETUP
    imported = "vllm" in sys.modules
    settings: list[str] = []
    cuda = _cuda_available()
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter = True  # the caller's own choice, honoured even with CUDA
    else:
        interpreter = not cuda
        if interpreter and imported:
            _KERNEL_SETUP = KernelSetup(
                True,
                problem="vLLM was imported before kvconform could select Triton's interpreter "
                "(TRITON_INTERPRET=1) on this machine without CUDA: select the slots check "
                "before vLLM is loaded, or set TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES= "
                "in the environment",
            )
            return _KERNEL_SETUP
        if interpreter:
            os.environ["TRITON_INTERPRET"] = "1"
            settings.append("TRITON_INTERPRET=1")
    if not cuda and not imported and os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        settings.append("CUDA_VISIBLE_DEVICES=")
    _KERNEL_SETUP = KernelSetup(interpreter, tuple(settings))
    return _KERNEL_SETUP


def _cuda_available() -> bool:
    # torch does not import Triton, so asking torch leaves the choice open.
    import torch

    return bool(torch.cuda.is_available())


def _kernel_setup_now() -> KernelSetup:
    """The set-up in force when :func:`prepare_slot_kernel` was never called."""
    if _KERNEL_SETUP is not None:
        return _KERNEL_SETUP
    return KernelSetup(os.environ.get("TRITON_INTERPRET") == "1")


class SlotKernel:
    """vLLM's ``BlockTables`` and slot-mapping kernel on this process's device.

    Version differences handled here: ``BlockTables`` takes ``kernel_block_sizes``
    up to 0.32 (kvconform passes the group block sizes: one kernel block per KV
    block) and gains keywords later (passed by signature); ``UvaBuffer.uva`` is an
    attribute up to 0.29 and a method from 0.30.

    Platform stand-ins, in force only while kvconform calls into ``BlockTables``:

    * Triton's interpreter on the CPU: ``BlockTables`` keeps its row counts and its
      staged-write indices in UVA buffers, pinned host memory viewed from the device
      through a compiled op (``torch.ops._C``) that a ``.py``-only tree lacks and a
      CPU-only machine cannot pin. Here the device *is* the host, so the stand-in
      buffer's device view is the host tensor itself, unpinned; ``PIN_MEMORY`` of
      ``vllm.utils.torch_utils`` reads False for the same reason, and so does its
      ``is_pin_memory_available``, which 0.32.x's ``async_tensor_h2d`` calls instead.
    * CUDA: vLLM's own buffers are used as they are. Only if they cannot be built
      (a ``.py``-only tree under ``VLLM_TARGET_DEVICE=cpu``: no CUDA view op) the
      stand-in keeps the pinned buffer and views it through its
      ``__cuda_array_interface__``.
    """

    def __init__(self, vllm: Vllm, module: Any, interpreter: bool, setup: KernelSetup):
        self.version = vllm.version
        self._bt = module
        self._buffers: Any = importlib.import_module("vllm.v1.worker.gpu.buffer_utils")
        self._torch_utils: Any = importlib.import_module("vllm.utils.torch_utils")
        import torch

        self._torch = torch
        self.interpreter = interpreter
        self.device = torch.device("cpu" if interpreter else "cuda")
        self.stand_ins = interpreter
        self._setup = setup

    @property
    def mode(self) -> str:
        """One line for the report: which kernel ran where, and what was stood in."""
        import triton

        where = (
            "under Triton's interpreter on the CPU"
            if self.interpreter
            else f"compiled by Triton on {self._torch.cuda.get_device_name(0)}"
        )
        made = f"; kvconform set {', '.join(self._setup.settings)}" if self._setup.settings else ""
        stood = (
            "; UVA buffers stood in by host tensors (no pinned memory or CUDA view op)"
            if self.stand_ins and self.interpreter
            else "; UVA buffers viewed through __cuda_array_interface__ (no CUDA view op)"
            if self.stand_ins
            else ""
        )
        return (
            f"vLLM {self.version}'s BlockTables.compute_slot_mappings "
            f"(_compute_slot_mappings_kernel) {where} (Triton {triton.__version__}){made}{stood}"
        )

    def tables(
        self, block_sizes: Sequence[int], max_rows: int, max_tokens: int, columns: Sequence[int]
    ) -> SlotTables:
        """A ``BlockTables`` of ``max_rows`` rows of ``columns[g]`` columns per group."""
        if not self.stand_ins:
            try:
                return self._new_tables(block_sizes, max_rows, max_tokens, columns)
            except (RuntimeError, ValueError, AttributeError, NotImplementedError):
                self.stand_ins = True  # vLLM's own UVA buffers cannot be built here
        return self._new_tables(block_sizes, max_rows, max_tokens, columns)

    def _new_tables(
        self, block_sizes: Sequence[int], max_rows: int, max_tokens: int, columns: Sequence[int]
    ) -> SlotTables:
        with self.buffers():
            tables = call(
                self._bt.BlockTables,
                block_sizes=list(block_sizes),
                max_num_reqs=max_rows,
                max_num_batched_tokens=max_tokens,
                max_num_blocks_per_group=list(columns),
                device=self.device,
                kernel_block_sizes=list(block_sizes),
            )
        return SlotTables(self, tables)

    @contextlib.contextmanager
    def untraced_kernel(self) -> Iterator[None]:
        """While vLLM's code is measured (``kvconform coverage --vllm-code``), the interpreted
        kernel runs untraced and counts as entered (``code_tracing.untraced``); the rest of
        ``compute_slot_mappings`` stays measured. Nothing changes otherwise."""
        from kvconform.oracles.code_tracing import measuring, untraced

        module = self._bt
        kernel = module._compute_slot_mappings_kernel
        function = getattr(kernel, "fn", None)
        if not (self.interpreter and measuring() and hasattr(function, "__code__")):
            yield
            return

        class Launcher:
            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                def launch(*args: Any, **kwargs: Any) -> Any:
                    with untraced(function):
                        return kernel[grid](*args, **kwargs)

                return launch

        module._compute_slot_mappings_kernel = Launcher()
        try:
            yield
        finally:
            module._compute_slot_mappings_kernel = kernel

    @contextlib.contextmanager
    def buffers(self) -> Iterator[None]:
        """The device stand-ins (see the class docstring), while kvconform calls in."""
        if not self.stand_ins:
            yield
            return
        module, torch_utils = self._buffers, self._torch_utils
        missing = object()
        # vars(), not getattr(): 0.32 serves PIN_MEMORY from a module __getattr__,
        # which must serve it again once the stand-in is deleted.
        saved = {
            (owner, name): vars(owner).get(name, missing)
            for owner, name in (
                (module, "UvaBuffer"),
                (module, "is_uva_available"),
                (torch_utils, "PIN_MEMORY"),
                (torch_utils, "is_pin_memory_available"),
            )
        }
        if self.interpreter:
            view: Callable[[Any], Any] = lambda cpu: cpu  # noqa: E731 - the host is the device
            module.UvaBuffer = _host_buffer_class(module.UvaBuffer, view, pin=False)
            torch_utils.PIN_MEMORY = False
            # 0.32's async_tensor_h2d (the staged writes' upload) asks the platform
            # itself instead of reading PIN_MEMORY; vLLM's unspecified platform says
            # True on a machine without a device, and pinning then raises "Found no
            # NVIDIA driver". Both names must say what the host can do.
            torch_utils.is_pin_memory_available = lambda: False
        else:
            module.UvaBuffer = _host_buffer_class(module.UvaBuffer, _cuda_view, pin=True)
        module.is_uva_available = lambda: True
        try:
            yield
        finally:
            for (owner, name), value in saved.items():
                if value is not missing:
                    setattr(owner, name, value)
                elif name in vars(owner):
                    delattr(owner, name)


def _host_buffer_class(original: type, view: Callable[[Any], Any], pin: bool) -> type:
    """A ``UvaBuffer`` whose device view is ``view(host tensor)``, in the original's shape."""
    import torch

    view_is_method = callable(vars(original).get("uva"))

    class HostUvaBuffer:
        def __init__(self, size: Any, dtype: Any) -> None:
            self.cpu = torch.zeros(size, dtype=dtype, device="cpu", pin_memory=pin)
            self.np = self.cpu.numpy()
            self._view = view(self.cpu)
            if not view_is_method:
                self.uva = self._view

        if view_is_method:

            def uva(self, n: int | None = None) -> Any:
                return self._view if n is None else self._view[:n]

    return HostUvaBuffer


def _cuda_view(cpu: Any) -> Any:
    """A CUDA tensor over pinned host memory (UVA), without vLLM's compiled view op."""
    import torch

    class Interface:
        __cuda_array_interface__ = {
            "shape": tuple(cpu.shape),
            "typestr": cpu.numpy().dtype.str,
            "data": (cpu.data_ptr(), False),
            "strides": None,
            "version": 3,
        }

    return torch.as_tensor(Interface(), device="cuda")


class SlotTables:
    """One ``BlockTables``: rows written through vLLM's staged writer, mapped by its kernel."""

    def __init__(self, kernel: SlotKernel, tables: Any) -> None:
        self._kernel = kernel
        self._tables = tables

    def write_rows(
        self,
        rows: Sequence[tuple[tuple[int, ...], ...]],
        indices: Sequence[int] | None = None,
    ) -> None:
        """Fill rows ``indices`` (default ``0..len(rows)-1``) through vLLM's staged
        writer: one id tuple per group, written over the row from column 0."""
        where = range(len(rows)) if indices is None else indices
        with self._kernel.buffers():
            for index, row in zip(where, rows, strict=True):
                self._tables.append_block_ids(index, tuple(list(ids) for ids in row), True)
            self._tables.apply_staged_writes()

    def gather(self, idx_mapping: Sequence[int], num_reqs_padded: int) -> list[list[list[int]]]:
        """vLLM's ``gather_block_tables``: per group, the forward pass's rows in batch order.

        The tables it fills (``input_block_tables``) persist across calls, as in the
        model runner: a batch row keeps, past the columns its request holds, what an
        earlier call gathered into it.
        """
        torch = self._kernel._torch
        mapping = torch.tensor(list(idx_mapping), dtype=torch.int32, device=self._kernel.device)
        with self._kernel.buffers():
            out = call(
                self._tables.gather_block_tables,
                idx_mapping=mapping,
                num_reqs_padded=num_reqs_padded,
            )
        return [table[:num_reqs_padded].cpu().tolist() for table in out]

    def map(
        self, rows: Sequence[int], query_start_loc: Sequence[int], positions: Sequence[int]
    ) -> Any:
        """Slot ids, ``[groups, len(positions)]`` (numpy int64), from one kernel launch."""
        # The kernel writes one slot per position into a buffer of
        # max_num_batched_tokens and bounds nothing: a larger batch corrupts memory.
        if len(positions) > self._tables.max_num_batched_tokens or len(rows) > len(
            self._tables.block_tables[0].gpu
        ):
            raise ValueError(
                f"{len(rows)} rows and {len(positions)} positions exceed the table's "
                f"{len(self._tables.block_tables[0].gpu)} rows and "
                f"{self._tables.max_num_batched_tokens} tokens"
            )
        torch = self._kernel._torch
        device = self._kernel.device
        idx_mapping = torch.tensor(list(rows), dtype=torch.int64, device=device)
        starts = torch.tensor(list(query_start_loc), dtype=torch.int32, device=device)
        where = torch.tensor(list(positions), dtype=torch.int64, device=device)
        with self._kernel.buffers(), self._kernel.untraced_kernel():
            slots = self._tables.compute_slot_mappings(idx_mapping, starts, where, len(positions))
        return slots.cpu().numpy().copy()


def _find_slot_kernel(vllm: Vllm) -> SlotKernel | VllmUnavailable:
    """vLLM's slot-mapping kernel in this process, or why it cannot run."""
    setup = _kernel_setup_now()
    if setup.problem is not None:
        return vllm.missing("a runnable slot-mapping kernel", setup.problem)
    try:
        module = importlib.import_module("vllm.v1.worker.gpu.block_table")
    except Exception as exc:  # noqa: BLE001 - no block table means "cannot map slots"
        return vllm.missing(
            "an importable vllm.v1.worker.gpu.block_table", f"{type(exc).__name__}: {exc}"
        )
    for name in ("BlockTables", "_compute_slot_mappings_kernel"):
        if not hasattr(module, name):
            return vllm.missing(f"vllm.v1.worker.gpu.block_table.{name}")
    kind = type(module._compute_slot_mappings_kernel).__name__
    if kind == "InterpretedFunction":
        return SlotKernel(vllm, module, True, setup)
    if kind != "JITFunction":
        triton_utils = vllm.optional_module("vllm.triton_utils")
        return vllm.missing(
            "a Triton kernel to run",
            "vLLM disabled Triton (vllm.triton_utils.HAS_TRITON is "
            f"{getattr(triton_utils, 'HAS_TRITON', '?')}): its kernels are plain functions",
        )
    if not _cuda_available():
        return vllm.missing(
            "a device for the compiled slot-mapping kernel",
            "no CUDA device, and Triton's interpreter was not selected before vLLM was "
            "imported (kvconform selects it when the slots check is chosen before loading)",
        )
    return SlotKernel(vllm, module, False, setup)


def slot_kernel_of(vllm: Vllm) -> SlotKernel:
    """vLLM's slot-mapping kernel, ready to run; raises :class:`VllmUnavailable` if not."""
    kernel = vllm.part(_find_slot_kernel)
    if isinstance(kernel, VllmUnavailable):
        raise kernel
    return kernel
