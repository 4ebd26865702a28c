"""A vLLM tree's fingerprint: what its baseline and coverage map are cached under.

Two trees with the same Python files give the same tests the same results, so
the baseline (:mod:`kvconform.peer.baseline`) and the reach map
(:mod:`kvconform.peer.reach`) are cached per vLLM version *and* per
fingerprint: the sha256 of every ``.py`` file's relative path and contents
under ``vllm/``. Bytecode, compiled extensions and data files are left out; a
tree copied with its bytecode and the tree it came from share one fingerprint.
The installed vLLM and a ``.py``-only copy of it do as well.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path


def tree_fingerprint(vllm_dir: Path) -> str:
    """The fingerprint of the ``vllm`` package folder ``vllm_dir`` (16 hex digits)."""
    digest = hashlib.sha256()
    for path in sorted(vllm_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(vllm_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def key_of(*parts: str | Iterable[str]) -> str:
    """A short stable key for a cache file from strings and lists of strings."""
    digest = hashlib.sha256()
    for part in parts:
        items = [part] if isinstance(part, str) else sorted(part)
        for item in items:
            digest.update(item.encode() + b"\0")
        digest.update(b"\1")
    return digest.hexdigest()[:16]
