"""Where kvconform keeps what it downloads and caches: outside the repository.

``KVCONFORM_CACHE`` wins; otherwise ``$XDG_CACHE_HOME/kvconform`` or
``~/.cache/kvconform``. Release trees, vLLM's own cache (``VLLM_CACHE_ROOT``)
and Hypothesis' example database all live below it, so a clone stays clean and
two clones share one download of each vLLM release.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    explicit = os.environ.get("KVCONFORM_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "kvconform"


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root, created on first use."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
