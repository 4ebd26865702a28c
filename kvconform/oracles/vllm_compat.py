"""The one module that imports vLLM and knows how its releases differ.

Everything kvconform asks of vLLM goes through a :class:`Vllm` object returned
by :func:`load`: build a ``KVCacheSpec`` for a scenario group, build a
``KVCacheManager``, make a ``Request``, call ``allocate_slots``, ask
``_reserved_block_count`` and ``VllmConfig.num_lookahead_tokens``, enumerate the
spec types and speculative methods the installed vLLM declares. No other module
imports vLLM, and no other module branches on its version.

How releases differ (measured on the PyPI wheels 0.25.0 - 0.33.0; see
``docs/vllm-versions.md``) is handled here in three ways, in this order of
preference:

1. *By signature*: keyword arguments a release does not accept are dropped
   (``KVCacheManager`` gains and reorders keywords between releases;
   ``allocate_slots`` gains ``skip_zeroing_group_ids`` in 0.32), so every call
   passes everything by keyword and lets the signature decide.
2. *By presence*: a name that a release lacks (``_reserved_block_count`` before
   0.28, ``CircularBufferSpec`` before 0.29, ``KpoolTailSpec`` after 0.31)
   raises :class:`~kvconform.errors.VllmUnavailable` naming the version and the
   missing name, or, where the name is optional to a run (the predictor, the
   lookahead property), is reported as unavailable rather than faked.
3. *By shape*: results whose shape changed (``get_computed_blocks`` returns two
   or three values) are read positionally.

``load(src=DIR)`` puts another vLLM Python tree ahead of the installed one; the
installed package directory is appended to ``vllm.__path__`` so that compiled
extension modules, which a ``.py``-only tree lacks, still resolve.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvconform.errors import VllmUnavailable
from kvconform.oracles.group_types import GROUP_TYPES
from kvconform.paths import cache_dir

MINIMUM_SUPPORTED = "0.28.0"

# Every spec class a scenario group is built from gets these attributes where
# the class has such a field; their values do not influence block counts.
_NEUTRAL_SPEC_FIELDS: dict[str, Any] = {
    "num_kv_heads": 1,
    "head_size": 8,
    "page_size": 64,
}


@dataclass(frozen=True)
class VllmSource:
    """Where the vLLM Python tree in use came from."""

    kind: str  # "installed" | "src" | "release"
    path: str
    release: str | None = None

    def describe(self) -> str:
        if self.kind == "release":
            return f"PyPI release {self.release} (Python tree cached at {self.path})"
        if self.kind == "src":
            return f"Python tree at {self.path}, ahead of the installed vLLM"
        return f"installed package at {self.path}"


def _quiet_imports() -> None:
    # vLLM and torch log at import time (missing compiled extensions on CPU,
    # deprecations); a harness run wants its own output, not theirs.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir("vllm")))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in ("torch", "vllm"):
        logging.getLogger(name).setLevel(logging.ERROR)


def tree_version(tree: str | Path) -> str | None:
    """The version a vLLM Python tree declares, read without importing it."""
    root = Path(tree)
    for dist_info in sorted(root.glob("vllm-*.dist-info")):
        match = re.match(r"vllm-(.+)\.dist-info", dist_info.name)
        if match:
            return match.group(1)
    version_file = root / "vllm" / "_version.py"
    if version_file.exists():
        match = re.search(
            r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)", version_file.read_text()
        )
        if match:
            return match.group(1)
    return None


def installed_version() -> str | None:
    """The installed vLLM's version, without importing it."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("vllm")
    except PackageNotFoundError:
        return None


def load(
    src: str | Path | None = None, release: str | None = None, slot_kernel: bool = False
) -> Vllm:
    """Import vLLM (optionally a tree at ``src``) and wrap it.

    ``slot_kernel``: the slots check will run, so first prepare the process for
    vLLM's slot-mapping kernel (:func:`prepare_slot_kernel`). Raises
    :class:`VllmUnavailable` when vLLM cannot be imported.
    """
    if slot_kernel:
        prepare_slot_kernel()
    _quiet_imports()
    installed = importlib.util.find_spec("vllm")
    installed_dir = (
        str(Path(installed.origin).parent) if installed is not None and installed.origin else None
    )
    if src is not None:
        src = str(Path(src).resolve())
        if not (Path(src) / "vllm" / "__init__.py").exists():
            raise VllmUnavailable(
                str(tree_version(src) or "?"), "a vllm/ package", f"{src} has no vllm/__init__.py"
            )
        loaded = sys.modules.get("vllm")
        if loaded is not None and not str(loaded.__file__).startswith(src):
            raise VllmUnavailable(
                str(tree_version(src)), "a fresh process", "another vLLM is already imported"
            )
        if src not in sys.path:
            sys.path.insert(0, src)
        importlib.invalidate_caches()
        source = VllmSource("release" if release else "src", src, release)
    else:
        source = VllmSource("installed", installed_dir or "?")
    version = (tree_version(src) if src else installed_version()) or "unknown"
    logging.disable(logging.WARNING)  # torch and vLLM log deprecations while importing
    try:
        vllm = importlib.import_module("vllm")
        if src is not None and installed_dir and installed_dir not in vllm.__path__:
            # Compiled extensions live only in the installed package.
            vllm.__path__.append(installed_dir)
        modules = {
            name: importlib.import_module(name)
            for name in (
                "vllm.v1.core.kv_cache_manager",
                "vllm.v1.kv_cache_interface",
                "vllm.v1.request",
            )
        }
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot exercise"
        raise VllmUnavailable(
            version, "an importable vllm", f"{type(exc).__name__}: {exc}"
        ) from None
    finally:
        logging.disable(logging.NOTSET)
    if src is None:
        version = getattr(vllm, "__version__", version)
    loaded_vllm = Vllm(version, source, str(Path(str(vllm.__file__)).parent), modules)
    logging.disable(logging.WARNING)
    try:
        # Import the predictor's module now, so that its cost (it pulls in the
        # GPU model runner) is paid once at start-up, not inside the first scenario.
        _ = loaded_vllm.reserved_block_count
    finally:
        logging.disable(logging.NOTSET)
    return loaded_vllm


# -- the slot-mapping kernel: process set-up and device stand-ins -----------------------
#
# The slots party (kvconform.oracles.slots) runs vLLM's own BlockTables and its Triton
# kernel _compute_slot_mappings_kernel. With a CUDA device that is the compiled kernel.
# Without one it is the same kernel under Triton's interpreter, which has to be chosen
# before vLLM decorates its kernels, i.e. before vLLM is imported; hence
# prepare_slot_kernel(), which the command line and the pytest plugin call before
# load() when the slots check is selected. Measured recipe: shared/SLOT_ORACLE.md.


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
      ``vllm.utils.torch_utils`` reads False for the same reason.
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
            tables = _call(
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
    def buffers(self) -> Iterator[None]:
        """The device stand-ins (see the class docstring), while kvconform calls in."""
        if not self.stand_ins:
            yield
            return
        module, torch_utils = self._buffers, self._torch_utils
        missing = object()
        saved = {
            (owner, name): getattr(owner, name, missing)
            for owner, name in (
                (module, "UvaBuffer"),
                (module, "is_uva_available"),
                (torch_utils, "PIN_MEMORY"),
            )
        }
        if self.interpreter:
            view: Callable[[Any], Any] = lambda cpu: cpu  # noqa: E731 - the host is the device
            module.UvaBuffer = _host_buffer_class(module.UvaBuffer, view, pin=False)
            torch_utils.PIN_MEMORY = False
        else:
            module.UvaBuffer = _host_buffer_class(module.UvaBuffer, _cuda_view, pin=True)
        module.is_uva_available = lambda: True
        try:
            yield
        finally:
            for (owner, name), value in saved.items():
                if value is missing:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)


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

    def write_rows(self, rows: Sequence[tuple[tuple[int, ...], ...]]) -> None:
        """Fill rows ``0..len(rows)-1`` through vLLM's staged writer: one id tuple per group."""
        with self._kernel.buffers():
            for index, row in enumerate(rows):
                self._tables.append_block_ids(index, tuple(list(ids) for ids in row), True)
            self._tables.apply_staged_writes()

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
        with self._kernel.buffers():
            slots = self._tables.compute_slot_mappings(idx_mapping, starts, where, len(positions))
        return slots.cpu().numpy().copy()


class Vllm:
    """The loaded vLLM, reduced to what kvconform asks of it."""

    def __init__(self, version: str, source: VllmSource, location: str, modules: dict[str, Any]):
        self.version = version
        self.source = source
        self.location = location
        self._kvm = modules["vllm.v1.core.kv_cache_manager"]
        self._iface = modules["vllm.v1.kv_cache_interface"]
        self._request = modules["vllm.v1.request"]

    def __repr__(self) -> str:
        return f"<vLLM {self.version} from {self.source.describe()}>"

    def runtime(self) -> tuple[str, str]:
        """(torch version, device) of this process: the device warmup would run on."""
        import torch

        if torch.cuda.is_available():
            return torch.__version__, f"cuda: {torch.cuda.get_device_name(0)}"
        return torch.__version__, "cpu"

    @cached_property
    def _slot_kernel(self) -> SlotKernel | VllmUnavailable:
        setup = _kernel_setup_now()
        if setup.problem is not None:
            return self._missing("a runnable slot-mapping kernel", setup.problem)
        try:
            module = importlib.import_module("vllm.v1.worker.gpu.block_table")
        except Exception as exc:  # noqa: BLE001 - no block table means "cannot map slots"
            return self._missing(
                "an importable vllm.v1.worker.gpu.block_table", f"{type(exc).__name__}: {exc}"
            )
        for name in ("BlockTables", "_compute_slot_mappings_kernel"):
            if not hasattr(module, name):
                return self._missing(f"vllm.v1.worker.gpu.block_table.{name}")
        kind = type(module._compute_slot_mappings_kernel).__name__
        if kind == "InterpretedFunction":
            return SlotKernel(self, module, True, setup)
        if kind != "JITFunction":
            triton_utils = self._optional_module("vllm.triton_utils")
            return self._missing(
                "a Triton kernel to run",
                "vLLM disabled Triton (vllm.triton_utils.HAS_TRITON is "
                f"{getattr(triton_utils, 'HAS_TRITON', '?')}): its kernels are plain functions",
            )
        if not _cuda_available():
            return self._missing(
                "a device for the compiled slot-mapping kernel",
                "no CUDA device, and Triton's interpreter was not selected before vLLM was "
                "imported (kvconform selects it when the slots check is chosen before loading)",
            )
        return SlotKernel(self, module, False, setup)

    def slot_kernel(self) -> SlotKernel:
        """vLLM's slot-mapping kernel, ready to run; raises :class:`VllmUnavailable` if not."""
        kernel = self._slot_kernel
        if isinstance(kernel, VllmUnavailable):
            raise kernel
        return kernel

    def _missing(self, name: str, detail: str = "") -> VllmUnavailable:
        return VllmUnavailable(self.version, name, detail)

    def _optional_module(self, name: str) -> Any | None:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    # -- spec types -------------------------------------------------------------------

    def spec_class(self, name: str) -> type:
        cls = getattr(self._iface, name, None)
        if cls is None:
            raise self._missing(f"vllm.v1.kv_cache_interface.{name}")
        return typing.cast(type, cls)

    def offered_spec_classes(self) -> list[str]:
        """Names of every KVCacheSpec subclass vLLM's kv_cache_interface defines."""
        base = self._iface.KVCacheSpec
        return sorted(
            name
            for name, obj in vars(self._iface).items()
            if isinstance(obj, type)
            and issubclass(obj, base)
            and obj.__module__ == self._iface.__name__
        )

    def build_spec(self, type_name: str, block_size: int, options: dict[str, object]) -> Any:
        """A vLLM KVCacheSpec for a scenario group: its options plus neutral sizes."""
        import torch

        cls = self.spec_class(GROUP_TYPES[type_name].vllm_class)
        field_names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {"block_size": block_size}
        neutral = dict(_NEUTRAL_SPEC_FIELDS, dtype=torch.float16)
        neutral.update(shapes=((4,),), dtypes=(torch.float16,))
        for name, value in neutral.items():
            if name in field_names:
                kwargs[name] = value
        for name, value in options.items():
            if value is None:
                continue
            if name not in field_names:
                raise self._missing(f"{cls.__name__}.{name}")
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            raise self._missing(
                f"a {cls.__name__} that kvconform can build", f"{type(exc).__name__}: {exc}"
            ) from None

    def dcp_sharded(self, spec: Any) -> bool:
        return bool(getattr(spec, "dcp_sharded", False))

    # -- the allocator ----------------------------------------------------------------

    def kv_cache_config(self, num_blocks: int, specs: Sequence[Any]) -> Any:
        iface = self._iface
        groups = [iface.KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
        return _call(
            iface.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )

    def new_manager(self, kv_cache_config: Any, **kwargs: Any) -> Any:
        return _call(self._kvm.KVCacheManager, kv_cache_config=kv_cache_config, **kwargs)

    def new_request(
        self, request_id: str, prompt_token_ids: list[int], block_hasher: Callable[..., Any] | None
    ) -> Any:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1 << 20)
        return _call(
            self._request.Request,
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            pooling_params=None,
            block_hasher=block_hasher,
        )

    def block_hasher(self, hash_block_size: int) -> Callable[..., Any]:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        hashing = self._optional_module("vllm.utils.hashing")
        hash_fn = getattr(hashing, "sha256", None) if hashing else None
        if hash_fn is None:
            hash_fn = getattr(importlib.import_module("vllm.utils"), "sha256", None)
        if hash_fn is None or not hasattr(utils, "get_request_block_hasher"):
            raise self._missing("a request block hasher (get_request_block_hasher, sha256)")
        utils.init_none_hash(hash_fn)
        return typing.cast(
            Callable[..., Any], utils.get_request_block_hasher(hash_block_size, hash_fn)
        )

    def running_status(self) -> Any:
        return self._request.RequestStatus.RUNNING

    def waiting_status(self) -> Any:
        return self._request.RequestStatus.WAITING

    def preempted_status(self) -> Any:
        return self._request.RequestStatus.PREEMPTED

    def allocate_slots(self, manager: Any, request: Any, num_new_tokens: int, **kwargs: Any) -> Any:
        return _call(
            manager.allocate_slots, request=request, num_new_tokens=num_new_tokens, **kwargs
        )

    def computed_blocks(
        self, manager: Any, request: Any, max_cache_hit_length: int
    ) -> tuple[Any, int]:
        """The prefix-cache hit for a waiting request: (blocks, tokens)."""
        result = _call(
            manager.get_computed_blocks, request=request, max_cache_hit_length=max_cache_hit_length
        )
        return result[0], result[1]

    def cache_blocks(self, manager: Any, request: Any, num_computed_tokens: int) -> None:
        if hasattr(manager, "cache_blocks"):
            _call(manager.cache_blocks, request=request, num_computed_tokens=num_computed_tokens)

    def null_block_id(self, manager: Any) -> int:
        return int(manager.block_pool.null_block.block_id)

    def free_block_count(self, manager: Any) -> int:
        return int(manager.block_pool.get_num_free_blocks())

    # -- the warmup predictor ---------------------------------------------------------

    @cached_property
    def reserved_block_count(self) -> Callable[..., int] | None:
        """vLLM's ``_reserved_block_count``, or None where this release lacks it."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception:  # noqa: BLE001 - an unimportable warmup means "no predictor"
            return None
        return getattr(warmup, "_reserved_block_count", None)

    def predictor_missing_reason(self) -> str:
        try:
            importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception as exc:  # noqa: BLE001
            return f"vllm.v1.worker.gpu.warmup does not import ({type(exc).__name__}: {exc})"
        return f"vLLM {self.version} has no vllm.v1.worker.gpu.warmup._reserved_block_count"

    # -- speculative methods ----------------------------------------------------------

    @cached_property
    def _speculative(self) -> Any:
        return importlib.import_module("vllm.config.speculative")

    def declared_methods(self) -> tuple[str, ...]:
        """Every method name in vLLM's ``SpeculativeMethod`` literal, in order."""
        literal = getattr(self._speculative, "SpeculativeMethod", None)
        if literal is None:
            raise self._missing("vllm.config.speculative.SpeculativeMethod")
        return tuple(dict.fromkeys(_flatten_literal(literal)))

    def method_aliases(self) -> dict[str, str]:
        """Method names vLLM's SpeculativeConfig rewrites to another (MTP variants)."""
        mtp = getattr(self._speculative, "MTPModelTypes", None)
        if mtp is None:
            return {}
        return {name: "mtp" for name in _flatten_literal(mtp) if name != "mtp"}

    def canonical_method(self, method: str) -> str:
        return self.method_aliases().get(method, method)

    def lookahead(
        self, method: str | None, num_speculative_tokens: int, sample_from_anchor: bool = True
    ) -> int | None:
        """``VllmConfig.num_lookahead_tokens`` for a method, or None if this vLLM lacks it.

        Built the way vLLM's own test builds it: no model is loaded; the
        property runs on a small holder of a ``SpeculativeConfig`` made with
        ``object.__new__`` (and, for DSpark, the draft config attribute it reads).
        """
        config = importlib.import_module("vllm.config")
        prop = getattr(config.VllmConfig, "num_lookahead_tokens", None)
        if not isinstance(prop, property) or prop.fget is None:
            return None
        holder = SimpleNamespace(speculative_config=None, num_speculative_tokens=0)
        if method is not None:
            spec = object.__new__(self._speculative.SpeculativeConfig)
            object.__setattr__(spec, "method", self.canonical_method(method))
            object.__setattr__(spec, "num_speculative_tokens", num_speculative_tokens)
            hf_config = SimpleNamespace(sample_from_anchor=sample_from_anchor)
            object.__setattr__(spec, "draft_model_config", SimpleNamespace(hf_config=hf_config))
            holder = SimpleNamespace(
                speculative_config=spec, num_speculative_tokens=num_speculative_tokens
            )
        return int(prop.fget(holder))


def _flatten_literal(literal: Any) -> list[str]:
    names: list[str] = []
    for arg in typing.get_args(literal):
        if isinstance(arg, str):
            names.append(arg)
        else:
            names.extend(_flatten_literal(arg))
    return names


def _call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts."""
    accepted = _accepted_keywords(fn)
    if accepted is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return fn(**kwargs)


_SIGNATURES: dict[Any, frozenset[str] | None] = {}


def _accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    key = getattr(fn, "__func__", fn)
    if key not in _SIGNATURES:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            _SIGNATURES[key] = None
        else:
            if any(p.kind is p.VAR_KEYWORD for p in params):
                _SIGNATURES[key] = None
            else:
                _SIGNATURES[key] = frozenset(
                    p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                )
    return _SIGNATURES[key]
