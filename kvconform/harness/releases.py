"""The Python trees of vLLM's PyPI releases, downloaded once and cached.

``--vllm-release 0.27.1`` runs kvconform against that release's Python code,
put ahead of the installed vLLM (whose compiled extensions and dependencies
stay), exactly like ``--vllm-src``. The wheel is fetched with ``pip download
--no-deps``; only its Python tree (every file but compiled ``.so`` objects)
and the ``METADATA`` that names its version are kept, under
``~/.cache/kvconform/releases/<version>/``. The wheel itself (300 MB) is not
kept. Concurrent processes (pytest-xdist workers, a bisect) share one download
through a file lock.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kvconform.errors import UsageError, VllmUnavailable
from kvconform.paths import cache_dir

_KEEP_DIST_INFO = ("METADATA", "WHEEL", "top_level.txt")
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d*)?(\.post\d+)?$")


def release_tree(version: str) -> Path:
    """The folder holding ``vllm/`` of PyPI release ``version``; downloads it once."""
    if not _VERSION.match(version):
        raise UsageError(f"--vllm-release: {version!r} is not a release version like 0.28.0")
    root = cache_dir("releases")
    tree = root / version
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (tree / ".complete").exists():
            return tree
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{version}-") as tmp:
            wheel = _download(version, Path(tmp))
            staging = Path(tmp) / "tree"
            _extract_python_tree(wheel, staging)
            (staging / ".complete").write_text(f"vllm {version} from {wheel.name}\n")
            shutil.rmtree(tree, ignore_errors=True)
            staging.rename(tree)
    return tree


def _download(version: str, into: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "-q", "-d", str(into), f"vllm=={version}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip().splitlines()
        detail = text[-1] if text else f"pip exited {done.returncode}"
        if "No matching distribution" in (done.stderr or ""):
            raise UsageError(f"--vllm-release: PyPI has no vllm=={version} for this platform")
        raise VllmUnavailable(version, "a downloadable PyPI release", detail)
    wheels = sorted(into.glob("vllm-*.whl"))
    if not wheels:
        raise VllmUnavailable(version, "a wheel on PyPI", "pip downloaded no vllm wheel")
    return wheels[0]


def _extract_python_tree(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            top = member.split("/", 1)[0]
            if top == "vllm":
                if ".so" in Path(member).suffixes or member.endswith("/"):
                    continue
            elif top.endswith(".dist-info"):
                if Path(member).name not in _KEEP_DIST_INFO:
                    continue
            else:
                continue
            archive.extract(member, target)


def link_tree(package: Path, root: Path) -> Path:
    """``root/vllm``: a copy of the vLLM package folder ``package`` that costs no space.

    Folders, sources and this interpreter's bytecode are hard-linked (copied where
    linking fails), so the copy imports as fast as the original; compiled extensions
    stay in the installed package (``--vllm-src`` finds them there). Replace a file by
    unlinking it first: writing through a hard link would change the original.
    """
    tag = f".{sys.implementation.cache_tag}.pyc"

    def ignore(directory: str, names: list[str]) -> list[str]:
        here = Path(directory)
        return [
            name
            for name in names
            if not (
                (here / name).is_dir()
                or name.endswith((".py", ".pyi", ".json"))
                or (here.name == "__pycache__" and name.endswith(tag))
            )
        ]

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system: copy
            shutil.copy2(src, dst)

    shutil.copytree(package, root / "vllm", ignore=ignore, copy_function=link)
    return root


def cached_releases() -> list[str]:
    root = cache_dir("releases")
    return sorted(p.name for p in root.iterdir() if (p / ".complete").exists())
