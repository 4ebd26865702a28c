"""Patched vLLM trees: a release's Python tree with one real bug put back, cached.

The tree of the patch's release comes from :func:`kvconform.harness.releases.release_tree`
(downloaded once), or from the installed vLLM when it is that release. The copy
hard-links every file the patch leaves alone, so a patched tree costs the patched
files only; it is kept under ``~/.cache/kvconform/realbugs/`` keyed by the release
and the patch's content, and rebuilt when the patch changes. A patch that does not
apply is the catalogue's problem, reported with ``patch``'s own words.

Both trees are byte-compiled once (:func:`with_bytecode`). Every replay imports them
in fresh processes (the corpus, the explorer, its differential baseline, the run of
its reproducers on the unpatched release), and where no bytecode is written
(``PYTHONDONTWRITEBYTECODE``) each of those imports compiled the whole of vLLM anew:
about a minute a process on a loaded 2-core machine. The patched tree takes the
pristine tree's bytecode by hard link and compiles the files its patch changed.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvconform.errors import PatchFailed
from kvconform.harness.releases import link_tree, release_tree
from kvconform.oracles.vllm import installed_version
from kvconform.paths import cache_dir
from kvconform.realbugs.catalogue import RealBug


def pristine_tree(release: str) -> Path:
    """The folder holding ``vllm/`` of ``release``: the installed one when it is that release."""
    if installed_version() == release:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is not None and spec.origin is not None:
            return Path(spec.origin).parent.parent
    return with_bytecode(release_tree(release))


def with_bytecode(tree: Path, like: Path | None = None) -> Path:
    """``tree`` (the folder holding ``vllm/``) with this interpreter's bytecode, written once.

    ``like``: a tree whose bytecode is hard-linked first, for the sources ``tree`` shares
    with it; ``compileall`` then compiles what is missing or stale (a patched file is newer
    than the bytecode of its original) and replaces a linked file by a new one (written
    aside, then renamed), never writing through the link. A marker file says it is done.
    """
    tag = sys.implementation.cache_tag
    marker = tree / f".bytecode-{tag}"
    if marker.exists():
        return tree
    if like is not None:
        for compiled in (like / "vllm").rglob(f"__pycache__/*.{tag}.pyc"):
            target = tree / compiled.relative_to(like)
            if target.exists() or not target.parent.parent.is_dir():
                continue
            target.parent.mkdir(exist_ok=True)
            try:
                os.link(compiled, target)
            except OSError:
                shutil.copy2(compiled, target)
    compileall.compile_dir(tree / "vllm", quiet=2)
    marker.write_text(f"bytecode for {tag}\n", encoding="utf-8")
    return tree


def patched_files(patch: Path) -> list[str]:
    """The files a unified diff changes, relative to the folder holding ``vllm/``."""
    names = re.findall(r"^\+\+\+ (?:b/)?(\S+)", patch.read_text(encoding="utf-8"), re.M)
    return [name for name in names if name != "/dev/null"]


def patched_tree(bug: RealBug) -> Path:
    """A copy of the bug's release tree with its patch applied (cached by patch content)."""
    digest = hashlib.sha256(bug.patch.read_bytes()).hexdigest()[:12]
    root = cache_dir("realbugs", bug.patch_target)
    tree = root / f"{bug.name}-{digest}"
    source = pristine_tree(bug.patch_target)
    if (tree / ".complete").exists():
        return with_bytecode(tree, like=source)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{bug.name}-") as tmp:
        staging = link_tree(source / "vllm", Path(tmp) / "tree")
        for name in patched_files(bug.patch):
            target = staging / name
            if target.exists():  # break the hard link: the pristine tree stays pristine
                data = target.read_bytes()
                target.unlink()
                target.write_bytes(data)
                os.utime(target)  # newer than its bytecode: recompiled once patched
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-i", str(bug.patch.resolve())],
            cwd=staging,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            words = (done.stdout + done.stderr).strip().splitlines()
            raise PatchFailed(
                f"{bug.patch.name} does not apply to vLLM {bug.patch_target}'s tree: "
                + " | ".join(words[-3:])
            )
        (staging / ".complete").write_text(f"{bug.name} on vllm {bug.patch_target}\n")
        shutil.rmtree(tree, ignore_errors=True)
        staging.rename(tree)
    return with_bytecode(tree, like=source)
