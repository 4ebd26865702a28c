"""Machine facts for a benchmark row: what the numbers were measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from kvconform import __version__
from kvconform.oracles.vllm import Vllm


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def machine_facts(vllm: Vllm, root: Path) -> dict[str, Any]:
    torch_version, device = vllm.runtime()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    commit = _git(root, "rev-parse", "--short", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "vllm": vllm.version,
        "vllm_source": vllm.source.describe(),
        "torch": torch_version,
        "device": device,
        "kvconform": __version__,
        "commit": (commit + ("+dirty" if dirty else "")) if commit else None,
    }
