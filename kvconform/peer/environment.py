"""The process environment vLLM's tests run in: paths, offline switches, the redirect map.

A peer run is ``python -m pytest`` in a subprocess, started in the folder
holding the sdist's ``tests/`` (so ``import tests.utils`` resolves there), with
an environment built from scratch rather than inherited piecemeal:

``PYTHONPATH``
    the vLLM tree under test first (when one is given; otherwise the installed
    vLLM is used), then a folder exposing only the ``kvconform`` package (so
    ``-p kvconform.peer.plugins.*`` imports, and nothing else of this checkout
    can shadow a test module), then the pinned test plugins *last*
    (:mod:`kvconform.peer.deps`).
offline
    ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``; model ids resolve
    through ``VLLM_MODEL_REDIRECT_PATH`` to config-only folders
    (:mod:`kvconform.peer.models`).
vLLM
    ``VLLM_TARGET_DEVICE=cpu``, ``VLLM_NO_USAGE_STATS=1``, and vLLM's own cache
    under kvconform's (``VLLM_CACHE_ROOT``).

The parent's ``PYTEST_*`` and coverage variables are dropped, so a peer run
started from inside kvconform's own test session is not steered by it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from kvconform.paths import cache_dir

FIXED = {
    # The CPU-runnable tests, judged as on a machine without a GPU wherever they run: vLLM's
    # configuration checks read the variable (test_scheduler.py's pipeline-parallel async
    # test passes with it empty and fails with it unset), so a baseline computed under a
    # mutation campaign, which hides the GPUs, disagreed with a run from a plain shell.
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}
_DROPPED_PREFIXES = ("PYTEST_", "COV_CORE_", "COVERAGE_")


def installed_vllm_dir() -> Path | None:
    """The installed ``vllm`` package folder, found without importing vLLM."""
    try:
        located = Path(str(importlib.metadata.distribution("vllm").locate_file("vllm")))
        if (located / "__init__.py").exists():
            return located
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("vllm")
    return Path(spec.origin).parent if spec and spec.origin else None


def installed_vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def kvconform_only_path() -> Path:
    """A folder whose only entry is a link to this ``kvconform`` package."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    folder = cache_dir("peer", "pythonpath", digest)
    link = folder / "kvconform"
    if not (link.is_symlink() and link.resolve() == package):
        tmp = folder / f".kvconform-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(package, target_is_directory=True)
        os.replace(tmp, link)
    return folder


def build_env(
    *,
    deps: Path,
    redirect_map: Path,
    version: str,
    vllm_tree: Path | None = None,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one pytest subprocess over vLLM's tests."""
    env = {
        key: value
        for key, value in (os.environ if base is None else base).items()
        if not key.startswith(_DROPPED_PREFIXES)
    }
    path = [str(kvconform_only_path()), str(deps)]
    if vllm_tree is not None:
        path.insert(0, str(vllm_tree))
        installed = installed_vllm_dir()
        if installed is not None:
            env["KVCONFORM_PEER_INSTALLED_VLLM"] = str(installed)
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(FIXED)
    env["VLLM_MODEL_REDIRECT_PATH"] = str(redirect_map)
    env.setdefault("VLLM_CACHE_ROOT", str(cache_dir("vllm", version)))
    env.update(extra or {})
    return env
