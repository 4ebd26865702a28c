"""Copies of the installed vLLM's Python tree, with a bug injected, for ``--vllm-src``.

A test that claims kvconform catches a bug must show it on vLLM's own code with
the bug put in, not on a stand-in. :func:`copy_vllm_tree` makes a tree of the
installed package's ``.py`` files (symbolic links, so a copy costs a moment and
no disk); :func:`inject` replaces one exact piece of text in one file of the copy
(the link becomes a real file), and fails if the text is not there exactly once,
so a vLLM upgrade that moves the code fails loudly instead of testing nothing.
The compiled extensions stay in the installed package, which
``vllm_compat.load(src=...)`` appends to ``vllm.__path__``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def installed_vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vLLM is not installed"
    return Path(spec.origin).parent


def copy_vllm_tree(dest: Path) -> Path:
    """A tree at ``dest`` (holding ``vllm/``) of links to the installed ``.py`` files."""
    source = installed_vllm_dir()
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        target = dest / "vllm" / Path(folder).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.endswith(".py"):
                (target / name).symlink_to(Path(folder) / name)
    return dest


def inject(tree: Path, relative: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in ``tree/vllm/relative``; ``old`` must occur once."""
    path = tree / "vllm" / relative
    text = path.read_text(encoding="utf-8")
    count = text.count(old)
    assert count == 1, f"{relative}: expected the text to inject into once, found {count}"
    path.unlink()  # a link to the installed file: replace it, never write through it
    path.write_text(text.replace(old, new), encoding="utf-8")


# The bugs the fuzzer must find (issue 5): where they go and what they do.
BUGS: dict[str, tuple[str, str, str]] = {
    # The warmup predictor forgets the drafter's lookahead slots.
    "predictor-no-lookahead": (
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = min(num_tokens, max_model_len)",
    ),
    # The warmup predictor does not cap the lookahead at max_model_len.
    "predictor-no-cap": (
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = num_tokens + num_lookahead_tokens",
    ),
    # The allocator drops Mamba's speculative state blocks (modes other than align).
    "mamba-no-spec-blocks": (
        "v1/core/single_type_kv_cache_manager.py",
        "                num_tokens += self.block_size * self.num_speculative_blocks\n",
        "                pass\n",
    ),
}


def buggy_vllm(dest: Path, bug: str) -> Path:
    """A copy of the installed vLLM with ``BUGS[bug]`` injected."""
    tree = copy_vllm_tree(dest)
    inject(tree, *BUGS[bug])
    return tree
