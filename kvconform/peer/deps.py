"""The pytest plugins vLLM's tests need beyond kvconform's own environment.

vLLM's ``tests/conftest.py`` imports ``tblib``; its tests use the fixtures and
markers of pytest-asyncio, pytest-mock and pytest-timeout; coverage.py and
pytest-cov record which test reaches which function. They are pinned here and
installed once with ``pip install --no-deps --target <cache>/peer/peer-deps``,
a folder of their own that goes *last* on the tests' ``PYTHONPATH``: the
environment's own packages (pytest, torch, vLLM) are never replaced, and
kvconform's virtual environment is left as it is. ``--no-deps`` keeps pip from
putting a second pytest in that folder; each pin's own requirements are met by
the environment (pytest, pluggy, typing-extensions). A stamp file holding the
pins makes a changed pin reinstall the folder.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvconform.errors import VllmUnavailable
from kvconform.paths import cache_dir

PINS: tuple[str, ...] = (
    "tblib==3.2.2",
    "pytest-asyncio==1.5.0",
    "pytest-mock==3.17.0",
    "pytest-timeout==2.4.0",
    "coverage[toml]==7.17.5",
    "pytest-cov==7.1.0",
)
_STAMP = ".kvconform-pins"


def deps_dir(pins: tuple[str, ...] = PINS) -> Path:
    """``<cache>/peer/peer-deps`` holding ``pins``; installs them once."""
    root = cache_dir("peer")
    target = root / "peer-deps"
    wanted = "\n".join(pins) + "\n"
    with open(root / ".deps.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / _STAMP
        if stamp.exists() and stamp.read_text() == wanted:
            return target
        with tempfile.TemporaryDirectory(dir=root, prefix=".deps-") as tmp:
            staging = Path(tmp) / "peer-deps"
            command = [
                sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-deps", "--no-compile", "--target", str(staging), *pins,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                raise VllmUnavailable(
                    "-", "the peer tests' pytest plugins", lines[-1] if lines else "pip failed"
                )
            (staging / _STAMP).write_text(wanted)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return target
