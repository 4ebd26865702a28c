"""Copies of the installed vLLM's Python tree, for tests that inject a bug and run --vllm-src."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path


def copy_python_tree(target: Path) -> Path:
    """The installed vLLM's .py files under ``target/vllm`` (compiled parts stay installed)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent

    def skip(folder: str, names: list[str]) -> list[str]:
        return [
            n
            for n in names
            if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())
        ]

    shutil.copytree(source, target / "vllm", ignore=skip)
    return target


def inject(tree: Path, relative: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in one file of a copied tree; ``old`` must occur exactly once."""
    path = tree / relative
    text = path.read_text()
    count = text.count(old)
    assert count == 1, f"{path}: the line to inject into occurs {count} times, not once"
    path.write_text(text.replace(old, new))
