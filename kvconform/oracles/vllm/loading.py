"""Loading vLLM: the installed package, a Python tree ahead of it, or a release's tree.

:func:`load` imports vLLM once per process and wraps it in the core facade
(:class:`~kvconform.oracles.vllm.core.Vllm`). ``load(src=DIR)`` puts another vLLM
Python tree ahead of the installed one; the installed package directory is
appended to ``vllm.__path__`` so that compiled extension modules, which a
``.py``-only tree lacks, still resolve.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

from kvconform.errors import VllmUnavailable
from kvconform.oracles.vllm.core import Vllm
from kvconform.oracles.vllm.slot_kernel import prepare_slot_kernel
from kvconform.oracles.vllm.versions import (
    VllmSource,
    installed_version,
    release_of,
    tree_version,
)
from kvconform.paths import cache_dir

__all__ = ["load"]


def _quiet_imports(version: str) -> None:
    # vLLM and torch log at import time (missing compiled extensions on CPU,
    # deprecations); a harness run wants its own output, not theirs.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # One cache per release: vLLM's model-info cache (architecture inspection,
    # seconds per architecture when cold) is written in a release's own format,
    # which another release fails to read and then re-inspects every time.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir("vllm", release_of(version))))
    # Nothing kvconform runs downloads: model folders are written locally.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Importing vLLM (0.33) imports its humming kernel library, which starts two
    # background processes that compile CUDA launchers kvconform never calls; on a
    # small CPU machine they cost more than the import itself.
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    for name in ("torch", "vllm"):
        logging.getLogger(name).setLevel(logging.ERROR)


def load(src: str | Path | None = None, release: str | None = None) -> Vllm:
    """Import vLLM (optionally a tree at ``src``) and wrap it.

    The process is first prepared for vLLM's slot-mapping kernel
    (:func:`prepare_slot_kernel`) whichever checks run: on a machine without
    CUDA that set-up decides whether vLLM finds Triton usable, and releases
    0.28-0.32 choose and refuse model runners by that answer, so every run of
    every release must see the same one (docs/releases.md). Raises
    :class:`VllmUnavailable` when vLLM cannot be imported.
    """
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
