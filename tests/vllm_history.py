"""A small synthetic vLLM git history for the commit-bisection tests.

The installed vLLM's Python tree is copied once into a fresh repository, and
each later commit changes one file, like upstream history does:

==========  =====================================================================
``base``    the installed vLLM's ``.py`` files, as they are (conforms)
``docs``    a comment in ``vllm/v1/core/kv_cache_manager.py`` (conforms)
``tidy``    a comment in ``vllm/v1/request.py`` (conforms)
``broken``  a syntax error in ``vllm/v1/request.py``, which kvconform imports:
            this commit cannot be exercised and must be skipped
``repair``  the syntax error undone (conforms)
``bug``     ``KVCacheManager.allocate_slots`` drops the lookahead: the injected
            bug, the first commit that does not conform
``later``   a comment in ``vllm/v1/request.py`` (still carries the bug)
==========  =====================================================================

The tree holds no compiled extensions; kvconform takes those from the
installed vLLM, as it does for every ``--vllm-src`` tree.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

MANAGER = "vllm/v1/core/kv_cache_manager.py"
REQUEST = "vllm/v1/request.py"
LOOKAHEAD_LINE = "num_tokens_main_model + num_lookahead_tokens, self.max_model_len"
DROPPED_LINE = "num_tokens_main_model, self.max_model_len  # injected bug: no lookahead"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "kvconform tests",
    "GIT_AUTHOR_EMAIL": "tests@kvconform.invalid",
    "GIT_COMMITTER_NAME": "kvconform tests",
    "GIT_COMMITTER_EMAIL": "tests@kvconform.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def installed_tree() -> Path:
    """The installed ``vllm`` package folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vLLM is not installed"
    return Path(spec.origin).parent


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def _edit(repo: Path, relative: str, old: str, new: str) -> None:
    path = repo / relative
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{relative} no longer contains {old!r}: update the synthetic history"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _append(repo: Path, relative: str, line: str) -> None:
    with open(repo / relative, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def _commit(repo: Path, message: str) -> str:
    git(repo, "commit", "--quiet", "-am", message)
    return git(repo, "rev-parse", "HEAD")


def build_history(repo: Path) -> dict[str, str]:
    """Create the history in ``repo``; the commit SHAs by name (see the module docstring)."""
    source = installed_tree()
    shutil.copytree(
        source,
        repo / "vllm",
        ignore=lambda folder, names: [
            n for n in names if n == "__pycache__" or (not n.endswith(".py") and "." in n)
        ],
    )
    git(repo, "init", "--quiet")
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", "base: the installed vLLM's Python tree")
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    _append(repo, MANAGER, "# docs: a comment")
    shas["docs"] = _commit(repo, "docs: a comment in the KV cache manager")
    _append(repo, REQUEST, "# tidy: a comment")
    shas["tidy"] = _commit(repo, "tidy: a comment in request.py")
    _append(repo, REQUEST, "def broken(:  # a syntax error")
    shas["broken"] = _commit(repo, "broken: request.py does not parse")
    _edit(repo, REQUEST, "def broken(:  # a syntax error\n", "")
    shas["repair"] = _commit(repo, "repair: request.py parses again")
    _edit(repo, MANAGER, LOOKAHEAD_LINE, DROPPED_LINE)
    shas["bug"] = _commit(repo, "bug: allocate_slots drops the lookahead")
    _append(repo, REQUEST, "# later: a comment")
    shas["later"] = _commit(repo, "later: another comment")
    return shas
