"""The one module that imports vLLM and knows how its releases differ.

Everything kvconform asks of vLLM goes through a :class:`Vllm` object returned
by :func:`load`: build a ``KVCacheSpec`` for a scenario group, build a
``KVCacheManager``, make a ``Request``, call ``allocate_slots``, ask
``_reserved_block_count`` and ``VllmConfig.num_lookahead_tokens``, enumerate the
spec types and speculative methods the installed vLLM declares, find the warmup
entry points and build the stub model runner they read. No other module branches
on vLLM's version (``oracles/warmup.py`` runs vLLM's warmup for its own party but asks
this module for everything that differs between releases).

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
4. *By release family*, where nothing else can tell: the model-runner attributes
   vLLM's warmup reads (``warmup_kernels`` takes a ``GPUModelRunner``; kvconform
   passes a stub, as vLLM's own warmup test does) differ between releases, and
   an absent attribute only shows when the warmup reads it. ``STUB_FAMILIES``
   maps each release family to its stub; a warmup that reads an attribute its
   stub lacks raises :class:`VllmUnavailable` naming the version and the
   attribute.

``load(src=DIR)`` puts another vLLM Python tree ahead of the installed one; the
installed package directory is appended to ``vllm.__path__`` so that compiled
extension modules, which a ``.py``-only tree lacks, still resolve.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
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


def _quiet_imports(version: str) -> None:
    # vLLM and torch log at import time (missing compiled extensions on CPU,
    # deprecations); a harness run wants its own output, not theirs.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # One cache per release: vLLM's model-info cache (architecture inspection,
    # seconds per architecture when cold) is written in a release's own format,
    # which another release fails to read and then re-inspects every time.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir("vllm", _release_of(version))))


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Silence vLLM's advice while it builds configurations for a harness run."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _release_of(version: str) -> str:
    """``0.33.1`` for ``0.33.1.dev12+gabc``: commits of one release share a cache."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).base_version
    except InvalidVersion:
        return version
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
        # Subprocesses vLLM starts (it inspects model architectures in one) must
        # import the same tree, not the installed package.
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if src not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([src, *filter(None, paths)])
        importlib.invalidate_caches()
        source = VllmSource("release" if release else "src", src, release)
    else:
        source = VllmSource("installed", installed_dir or "?")
    version = (tree_version(src) if src else installed_version()) or "unknown"
    _quiet_imports(version)
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
    # The import leaves some 840,000 objects tracked by the cyclic collector, and
    # every full collection that the scenarios' allocations trigger (vLLM builds a
    # block pool per scenario) rescans them all: a third of a corpus pass when
    # profiled. None of them becomes garbage, so take them out of its sight, as
    # vLLM's engine does after start-up (vllm.utils.gc_utils.freeze_gc_heap). Unlike
    # vLLM, no collection first: it takes 0.8 s here, and the import leaves few
    # unreachable objects (measured: 23 objects, kept for the life of the process).
    gc.freeze()
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
        # Answers that depend only on the loaded vLLM and the arguments (the
        # method tables, the speculative config's properties): every scenario asks
        # them again, and building a SpeculativeConfig each time cost more than
        # a short scenario's allocator calls (docs/benchmarks.md).
        self._memo: dict[tuple[Any, ...], Any] = {}

    def _remembered(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

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

    def mamba_cache_modes(self) -> tuple[str, ...]:
        """The Mamba cache modes this vLLM's config accepts (``MambaCacheMode``).

        0.32 dropped "all" from the config's literal while ``MambaSpec`` still
        takes it; a mode the config refuses is one no deployment runs.
        """
        cache = self._optional_module("vllm.config.cache")
        literal = getattr(cache, "MambaCacheMode", None) if cache else None
        return tuple(_flatten_literal(literal)) if literal is not None else ("none", "align")

    def dcp_sharded(self, spec: Any) -> bool:
        """Whether the manager multiplies this group's block size by the DCP world size.

        From 0.31 a spec says so itself (``dcp_sharded``: attention yes, Mamba
        no). Releases without the field (0.28-0.30) multiply every group's
        block size when ``dcp_world_size > 1`` (``SingleTypeKVCacheManager.__init__``).
        """
        return bool(getattr(spec, "dcp_sharded", True))

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
        self,
        request_id: str,
        prompt_token_ids: list[int],
        block_hasher: Callable[..., Any] | None,
        max_tokens: int = 1 << 20,
    ) -> Any:
        from vllm import SamplingParams

        # ignore_eos: fabricated outputs must not stop a request early by chance.
        params = _call(SamplingParams, max_tokens=max_tokens, ignore_eos=True)
        return _call(
            self._request.Request,
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            pooling_params=None,
            block_hasher=block_hasher,
        )

    def block_hasher(
        self, hash_block_size: int, num_hash_lookahead_tokens: int = 0
    ) -> Callable[..., Any]:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        hashing = self._optional_module("vllm.utils.hashing")
        hash_fn = getattr(hashing, "sha256", None) if hashing else None
        if hash_fn is None:
            hash_fn = getattr(importlib.import_module("vllm.utils"), "sha256", None)
        if hash_fn is None or not hasattr(utils, "get_request_block_hasher"):
            raise self._missing("a request block hasher (get_request_block_hasher, sha256)")
        utils.init_none_hash(hash_fn)
        hasher = utils.get_request_block_hasher
        if num_hash_lookahead_tokens:
            return typing.cast(
                Callable[..., Any], hasher(hash_block_size, hash_fn, num_hash_lookahead_tokens)
            )
        return typing.cast(Callable[..., Any], hasher(hash_block_size, hash_fn))

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
        """The prefix-cache hit for a waiting request, at most ``max_cache_hit_length`` tokens.

        ``get_computed_blocks`` takes ``max_cache_hit_length`` from 0.33.0 on; before,
        the hit is capped only at ``num_tokens - 1`` and the result may have two or
        three values. A hit longer than the chunk cannot be expressed on such a release.
        """
        result = _call(
            manager.get_computed_blocks, request=request, max_cache_hit_length=max_cache_hit_length
        )
        blocks, hit = result[0], int(result[1])
        if hit > max_cache_hit_length:
            raise self._missing(
                "KVCacheManager.get_computed_blocks(max_cache_hit_length=...)",
                f"the prefix-cache hit of {hit} tokens is longer than the first chunk allows "
                f"({max_cache_hit_length}); make the first prefill chunk longer than the shared prefix",
            )
        return blocks, hit

    def cache_blocks(self, manager: Any, request: Any, num_computed_tokens: int) -> None:
        if hasattr(manager, "cache_blocks"):
            _call(manager.cache_blocks, request=request, num_computed_tokens=num_computed_tokens)

    def null_block_id(self, manager: Any) -> int:
        return int(manager.block_pool.null_block.block_id)

    def free_block_count(self, manager: Any) -> int:
        return int(manager.block_pool.get_num_free_blocks())

    # -- the scheduler ----------------------------------------------------------------

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
                "VllmConfig",
            ),
            "vllm.v1.outputs": ("ModelRunnerOutput", "DraftTokenIds"),
            "vllm.v1.structured_output": ("StructuredOutputManager",),
        }
        found: dict[str, Any] = {}
        logging.disable(logging.WARNING)
        try:
            for module_name, attrs in names.items():
                try:
                    module = importlib.import_module(module_name)
                except Exception as exc:  # noqa: BLE001 - unimportable means "cannot exercise"
                    raise self._missing(module_name, f"{type(exc).__name__}: {exc}") from None
                for attr in attrs:
                    if not hasattr(module, attr):
                        raise self._missing(f"{module_name}.{attr}")
                    found[attr] = getattr(module, attr)
        finally:
            logging.disable(logging.NOTSET)
        return SimpleNamespace(**found)

    def model_config(self, model_dir: str, max_model_len: int) -> Any:
        """A ``ModelConfig`` for a local config-only model folder: no weights, no tokenizer."""
        # skip_tokenizer_init: the structured-output manager would otherwise load one.
        with _quiet_logs():
            return _call(
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
        with _quiet_logs():
            return _call(
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
        *,
        block_size: int,
        num_blocks: int,
        enable_prefix_caching: bool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: int,
        async_scheduling: bool,
    ) -> Any:
        """The ``VllmConfig`` an engine with these limits would hand its scheduler."""
        api = self._scheduling
        scheduler = _call(
            api.SchedulerConfig,
            max_model_len=model_config.max_model_len,
            is_encoder_decoder=False,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            async_scheduling=async_scheduling,
        )
        cache = _call(
            api.CacheConfig, block_size=block_size, enable_prefix_caching=enable_prefix_caching
        )
        parallel = (
            speculative_config.target_parallel_config
            if speculative_config is not None
            and getattr(speculative_config, "target_parallel_config", None) is not None
            else api.ParallelConfig()
        )
        with _quiet_logs():
            config = _call(
                api.VllmConfig,
                model_config=model_config,
                cache_config=cache,
                parallel_config=parallel,
                scheduler_config=scheduler,
                speculative_config=speculative_config,
                # Without it vLLM fails to infer a device on a machine without one.
                device_config=_call(api.DeviceConfig, device="cpu"),
            )
        # What the engine sets once it has profiled the device: the pool size.
        config.cache_config.num_gpu_blocks = num_blocks
        return config

    def new_scheduler(
        self, vllm_config: Any, kv_cache_config: Any, block_size: int, hash_block_size: int
    ) -> Any:
        """vLLM's scheduler class for this configuration (``Scheduler`` or ``AsyncScheduler``)."""
        scheduler_config = vllm_config.scheduler_config
        if not hasattr(scheduler_config, "get_scheduler_cls"):
            raise self._missing("SchedulerConfig.get_scheduler_cls")
        cls = scheduler_config.get_scheduler_cls()
        with _quiet_logs():
            return _call(
                cls,
                vllm_config=vllm_config,
                kv_cache_config=kv_cache_config,
                structured_output_manager=self._scheduling.StructuredOutputManager(vllm_config),
                block_size=block_size,
                hash_block_size=hash_block_size,
                log_stats=False,
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
            raise self._missing("vllm.v1.core.kv_cache_utils.resolve_kv_cache_block_sizes")
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

    def model_runner_output(self, req_ids: list[str], sampled: list[list[int]]) -> Any:
        return _call(
            self._scheduling.ModelRunnerOutput,
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any:
        return _call(self._scheduling.DraftTokenIds, req_ids=req_ids, draft_token_ids=drafts)

    # -- the warmup predictor ---------------------------------------------------------

    @cached_property
    def reserved_block_count(self) -> Callable[..., int] | None:
        """vLLM's ``_reserved_block_count``, or None where this release lacks it."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception:  # noqa: BLE001 - an unimportable warmup means "no predictor"
            return None
        return getattr(warmup, "_reserved_block_count", None)

    def below_minimum(self) -> bool:
        """Older than :data:`MINIMUM_SUPPORTED` (such trees run for bisection only)."""
        from packaging.version import InvalidVersion, Version

        try:
            return Version(_release_of(self.version)) < Version(MINIMUM_SUPPORTED)
        except InvalidVersion:
            return False

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
        return typing.cast(
            tuple[str, ...],
            self._remembered(
                ("declared_methods",), lambda: tuple(dict.fromkeys(_flatten_literal(literal)))
            ),
        )

    def method_aliases(self) -> dict[str, str]:
        """Method names vLLM's SpeculativeConfig rewrites to another (MTP variants)."""
        return dict(self._aliases)

    @cached_property
    def _aliases(self) -> dict[str, str]:
        mtp = getattr(self._speculative, "MTPModelTypes", None)
        if mtp is None:
            return {}
        return {name: "mtp" for name in _flatten_literal(mtp) if name != "mtp"}

    def canonical_method(self, method: str) -> str:
        return self._aliases.get(method, method)

    def _config_holder(
        self, method: str, k: int, sample_from_anchor: bool, enable_caching: bool
    ) -> SimpleNamespace:
        """What ``VllmConfig``'s speculative properties read, without a model.

        Built the way vLLM's own test builds it: a ``SpeculativeConfig`` made with
        ``object.__new__`` holding the method and k, plus the few attributes the
        properties read (the DSpark layout, the block-drop switches, prefix caching).
        """
        spec = object.__new__(self._speculative.SpeculativeConfig)
        hf_config = SimpleNamespace(sample_from_anchor=sample_from_anchor)
        for name, value in (
            ("method", self.canonical_method(method)),
            ("num_speculative_tokens", k),
            ("draft_model_config", SimpleNamespace(hf_config=hf_config)),
            ("disable_eagle_block_drop", False),
            ("disable_lookahead_block_hashes", False),
        ):
            object.__setattr__(spec, name, value)
        return SimpleNamespace(
            speculative_config=spec,
            num_speculative_tokens=k,
            cache_config=SimpleNamespace(enable_prefix_caching=enable_caching),
            kv_transfer_config=None,
        )

    def _config_property(self, name: str, holder: SimpleNamespace) -> int | None:
        config = importlib.import_module("vllm.config")
        prop = getattr(config.VllmConfig, name, None)
        if not isinstance(prop, property) or prop.fget is None:
            return None
        value = int(prop.fget(holder))
        setattr(holder, name, value)  # later properties read earlier ones through self
        return value

    def lookahead(
        self, method: str | None, num_speculative_tokens: int, sample_from_anchor: bool = True
    ) -> int | None:
        """``VllmConfig.num_lookahead_tokens`` for a method, or None if this vLLM lacks it."""
        key = ("lookahead", method, num_speculative_tokens, sample_from_anchor)
        return typing.cast(
            "int | None",
            self._remembered(
                key, lambda: self._lookahead(method, num_speculative_tokens, sample_from_anchor)
            ),
        )

    def _lookahead(
        self, method: str | None, num_speculative_tokens: int, sample_from_anchor: bool
    ) -> int | None:
        if method is None:
            return self._config_property(
                "num_lookahead_tokens", SimpleNamespace(speculative_config=None)
            )
        holder = self._config_holder(method, num_speculative_tokens, sample_from_anchor, False)
        return self._config_property("num_lookahead_tokens", holder)

    def manager_options(
        self, method: str | None, k: int, sample_from_anchor: bool, enable_caching: bool
    ) -> dict[str, int | bool]:
        """The speculative keywords vLLM's ``Scheduler`` passes to ``KVCacheManager``.

        ``use_eagle`` (trailing prefix-cache block drop) is ``use_eagle()`` before
        0.30 and ``use_eagle_block_drop()`` after; 0.33 replaces the drop with
        lookahead block hashes (``num_hash_lookahead_tokens``) under prefix
        caching; ``num_prefill_lookahead`` exists from 0.28. Keywords a release's
        ``KVCacheManager`` does not take are dropped when it is built.
        """
        key = ("manager_options", method, k, sample_from_anchor, enable_caching)
        options = self._remembered(
            key, lambda: self._manager_options(method, k, sample_from_anchor, enable_caching)
        )
        return dict(options)

    def _manager_options(
        self, method: str | None, k: int, sample_from_anchor: bool, enable_caching: bool
    ) -> dict[str, int | bool]:
        if method is None:
            return {}
        holder = self._config_holder(method, k, sample_from_anchor, enable_caching)
        spec = holder.speculative_config
        drop = getattr(spec, "use_eagle_block_drop", None) or spec.use_eagle
        options: dict[str, int | bool] = {"use_eagle": bool(drop())}
        prefill = self._config_property("num_prefill_lookahead_tokens", holder)
        if prefill is not None:
            options["num_prefill_lookahead"] = prefill
        hashes = self._config_property("num_hash_lookahead_tokens", holder)
        if hashes:
            options["num_hash_lookahead_tokens"] = hashes
            options["use_eagle"] = False  # lookahead hashes prove the boundary token
        return options

    def speculative_config(
        self, method: str, num_speculative_tokens: int, sample_from_anchor: bool = True
    ) -> Any:
        """A ``SpeculativeConfig`` without a model, as vLLM's own test makes one."""
        return self._config_holder(
            method, num_speculative_tokens, sample_from_anchor, False
        ).speculative_config

    # -- the real warmup --------------------------------------------------------------

    def warmup_entry_point(self, name: str) -> Callable[..., Any]:
        """``warmup_kernels`` or ``run_mixed_prefill_decode_warmup`` of this vLLM."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception as exc:  # noqa: BLE001 - an unimportable warmup cannot be exercised
            raise self._missing(
                "an importable vllm.v1.worker.gpu.warmup", f"{type(exc).__name__}: {exc}"
            ) from None
        fn = getattr(warmup, name, None)
        if fn is None:
            raise self._missing(f"vllm.v1.worker.gpu.warmup.{name}")
        return typing.cast(Callable[..., Any], fn)

    def stub_model_runner(self, settings: RunnerSettings) -> StubModelRunner:
        """The stub model runner of this vLLM's release family (see ``STUB_FAMILIES``)."""
        stub_class = stub_family(self.version)
        if stub_class is None:
            oldest = STUB_FAMILIES[0][0]
            raise self._missing(
                "a warmup kvconform can drive",
                f"kvconform's stub model runners start at vLLM {oldest}",
            )
        return stub_class(settings)

    def stub_shortfall(self, runner: StubModelRunner) -> VllmUnavailable | None:
        """The error to raise when the warmup read an attribute the stub lacks."""
        if not runner.stub_misses:
            return None
        attribute = runner.stub_misses[0]
        return VllmUnavailable(
            self.version,
            "a model runner kvconform can stub",
            f"its warmup reads {attribute}, which {type(runner).__name__} (kvconform's stub "
            f"for vLLM {runner.FAMILY}) does not provide; add it in "
            "kvconform/oracles/vllm_compat.py",
        )


# -- stub model runners ----------------------------------------------------------------
#
# vLLM's warmup takes a GPUModelRunner but reads only a handful of its attributes; vLLM's
# own warmup test passes a stub with just those. Which attributes differ per release, so
# there is one stub per release family below, each naming what its family reads (measured
# by running each release's warmup with a stub that records every attribute access).


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

    def __init__(self, settings: RunnerSettings) -> None:
        misses: list[str] = []
        self.stub_settings = settings
        super().__init__("GPUModelRunner", misses, **self._attributes(settings, misses))

    def _part(self, name: str, misses: list[str], **attributes: Any) -> StubNamespace:
        return StubNamespace(f"GPUModelRunner.{name}", misses, **attributes)

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
            "is_pooling_model": False,
            "kv_connector": self._part("kv_connector", misses, set_disabled=lambda disabled: None),
            "is_last_pp_rank": True,
            "model_config": self._part("model_config", misses, get_vocab_size=lambda: s.vocab_size),
            "max_num_reqs": s.max_num_seqs,
        }


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
    block, so the warmup caps its requests by the pool)."""

    FAMILY = "0.32.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {**super()._attributes(s, misses), "block_tables": None}


class StubModelRunner033(StubModelRunner032):
    """Stands in for the ``GPUModelRunner`` attributes vLLM 0.33.x's warmup reads:
    those of 0.32 plus ``speculative_config``, read after the main pass; when it is
    set, the warmup runs a second, greedy pass."""

    FAMILY = "0.33.x"

    def _attributes(self, s: RunnerSettings, misses: list[str]) -> dict[str, Any]:
        return {**super()._attributes(s, misses), "speculative_config": s.speculative_config}


# (first release, stub) in release order; a release uses the last family not newer than it.
STUB_FAMILIES: tuple[tuple[str, type[StubModelRunner]], ...] = (
    ("0.25.0", StubModelRunner),
    ("0.27.0", StubModelRunner027),
    ("0.28.0", StubModelRunner028),
    ("0.29.0", StubModelRunner029),
    ("0.30.0", StubModelRunner030),
    ("0.32.0", StubModelRunner032),
    ("0.33.0", StubModelRunner033),
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
