"""Which vLLM is in use: where its Python tree came from and which release it is.

Read without importing vLLM, so that the fronts can say what they are about to
run before paying for the import, and so that bisection can name a tree's version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MINIMUM_SUPPORTED", "VllmSource", "installed_version", "release_of", "tree_version"]

# The oldest release every scenario kind runs on; older trees run for bisection only.
MINIMUM_SUPPORTED = "0.28.0"


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


def release_of(version: str) -> str:
    """``0.33.1`` for ``0.33.1.dev12+gabc``: commits of one release share a cache."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).base_version
    except InvalidVersion:
        return version


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
