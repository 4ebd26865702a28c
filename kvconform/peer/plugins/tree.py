"""Let a ``.py``-only vLLM tree find the installed vLLM's compiled extensions.

A mutated tree (``--vllm-src``, a mutant, a re-introduced bug) holds vLLM's
Python files only; ``vllm/_C*.so`` and the other extension modules stay in the
installed package. kvconform's own loader appends the installed folder to
``vllm.__path__``; in a pytest process that first imports vLLM somewhere in a
conftest, this plugin does the same without importing vLLM itself: a finder
placed *last* on ``sys.meta_path`` answers only for ``vllm.*`` modules the tree
lacks, looking for them at the same place in the installed package
(``$KVCONFORM_PEER_INSTALLED_VLLM``). Every module the tree has is still the
tree's. Load with ``-p kvconform.peer.plugins.tree``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType


class InstalledFallback(importlib.abc.MetaPathFinder):
    """Finds ``vllm.a.b`` in ``<installed>/a`` once the tree's own finders found nothing."""

    def __init__(self, installed: Path, package: str = "vllm") -> None:
        self.installed = installed
        self.prefix = package + "."

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if not fullname.startswith(self.prefix):
            return None
        folder = self.installed.joinpath(*fullname.split(".")[1:-1])
        if not folder.is_dir():
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(folder)])


def pytest_configure() -> None:
    installed = os.environ.get("KVCONFORM_PEER_INSTALLED_VLLM")
    if installed and not any(isinstance(f, InstalledFallback) for f in sys.meta_path):
        sys.meta_path.append(InstalledFallback(Path(installed)))
