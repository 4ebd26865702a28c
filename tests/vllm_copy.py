"""Copies of the installed vLLM's Python tree, with a bug injected, for ``--vllm-src``.

A test that claims kvconform catches a bug must show it on vLLM's own code with
the bug put in, not on a stand-in. :func:`copy_pristine` copies the installed
package's ``.py`` files plus their bytecode, so the copy imports as fast as the
original (compiled extensions stay in the installed package, which
``vllm_compat.load(src=...)`` appends to ``vllm.__path__``); the session fixture
``pristine_tree`` in ``conftest.py`` makes one per test session.
:func:`tree_with_replacement` hard-links that copy and replaces one exact piece
of text in one module, failing if the text is not there exactly once, so a vLLM
upgrade that moves the code fails loudly instead of testing nothing;
:func:`tree_with_patch` applies a unified diff instead (a real bug's patch from
``realbugs/patches/``), failing if it does not apply.
:func:`run_kvconform` runs the command against such a copy in a fresh process:
``--vllm-src`` must be the first vLLM the interpreter imports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def installed_vllm_dir() -> Path:
    found = importlib.util.find_spec("vllm")
    assert found is not None and found.origin is not None, "vLLM is not installed"
    return Path(found.origin).parent


def _python_only(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: keep folders, .py files and this interpreter's bytecode."""
    tag = f".{sys.implementation.cache_tag}.pyc"
    in_cache = Path(directory).name == "__pycache__"
    return [
        name
        for name in names
        if not (
            (Path(directory) / name).is_dir()
            or name.endswith(".py")
            or (in_cache and name.endswith(tag))
        )
    ]


def copy_pristine(root: Path) -> Path:
    """A copy of the installed vLLM's Python tree at ``root`` (the folder holding vllm/).

    ``copy2`` keeps modification times, so the copied bytecode stays valid for the
    copied sources; a patched module gets a new time and is recompiled.
    """
    shutil.copytree(installed_vllm_dir(), root / "vllm", ignore=_python_only)
    return root


def tree_with_replacement(pristine: Path, root: Path, module: str, old: str, new: str) -> Path:
    """A copy of ``pristine`` (hard links) at ``root`` with ``old`` replaced once in ``module``."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(pristine, root, copy_function=link)
    target = root / "vllm" / module
    text = target.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{module}: expected one {old!r}, found {text.count(old)}"
    target.unlink()  # break the hard link: the pristine copy stays pristine
    target.write_text(text.replace(old, new), encoding="utf-8")
    assert new in target.read_text(encoding="utf-8")
    return root


def tree_with_patch(pristine: Path, root: Path, patch: Path) -> Path:
    """A copy of ``pristine`` (hard links) at ``root`` with a unified diff applied (``patch -p1``).

    The diff must apply as it is: a vLLM upgrade that moves the code fails loudly.
    """

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(pristine, root, copy_function=link)
    text = patch.read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("+++ "):
            target = root / line[4:].split()[0].removeprefix("b/")
            data = target.read_bytes()
            target.unlink()  # break the hard link: the pristine copy stays pristine
            target.write_bytes(data)
    done = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-i", str(patch.resolve())],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{patch.name} does not apply: {done.stdout}{done.stderr}"
    return root


REPO = Path(__file__).resolve().parent.parent


def run_kvconform(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m kvconform ARGS`` in a fresh interpreter, this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "kvconform", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def failure_messages(tree: Path, scenario: Path, tmp_path: Path) -> list[str]:
    """``kvconform run SCENARIO --vllm-src TREE`` (one scenario): it must exit 1; the
    messages of its failures, read from its report."""
    out = tmp_path / "r"
    done = run_kvconform("run", scenario, "--vllm-src", tree, "--report-dir", out, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (result,) = json.loads((out / "report.json").read_text())["scenarios"]
    return [failure["message"] for failure in result["failures"]]


_IN_ONE_PROCESS = """
import contextlib, io, json, os, shlex, sys
from kvconform.fronts.cli import main
done = []
for step in json.loads(sys.argv[1]):
    if isinstance(step, list):  # [FILE, OLD, NEW]: an edit between two commands
        path, old, new = step
        if old is None:  # a new file
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            open(path, "w", encoding="utf-8").write(new)
            continue
        text = open(path, encoding="utf-8").read()
        assert text.count(old) == 1, (path, old)
        open(path, "w", encoding="utf-8").write(text.replace(old, new))
        continue
    line = step
    words = shlex.split(line)
    assert words[0] == "kvconform", line
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(words[1:])
    done.append({"command": line, "status": status, "output": out.getvalue()})
print(json.dumps(done))
"""


def run_kvconform_commands(
    steps: list[str | tuple[str, str | None, str]], cwd: Path
) -> list[dict[str, object]]:
    """Run ``kvconform ...`` command lines one after the other in one fresh interpreter
    (vLLM is imported once, by the first that needs it): each one's status and output.

    A step ``(FILE, OLD, NEW)`` is an edit between two commands, as a person makes it:
    OLD, which must be there once, replaced with NEW; with OLD None, FILE is written anew.
    """
    import json

    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", _IN_ONE_PROCESS, json.dumps(steps)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    results: list[dict[str, object]] = json.loads(last)
    return results
