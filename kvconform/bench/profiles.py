"""Profiles that show where time goes: pyinstrument over the harness, ``-X importtime``.

``--profile DIR`` writes, next to the figures:

* ``harness-corpus.txt`` / ``harness-scaling.txt``: pyinstrument call trees of
  the harness pass over the corpus and over a long scaling point, so the split
  between vLLM's frames and kvconform's is visible;
* ``import.txt``: the slowest modules of a fresh ``load()`` by cumulative
  import time (``python -X importtime``), which shows whose import dominates.

pyinstrument is an optional dependency (the ``bench`` extra); without it the
call trees are skipped and the reason is returned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBE = "from kvconform.oracles.vllm import load; load()"


def call_tree(work: Callable[[], object], path: Path, repeat: int = 3) -> str | None:
    """Profile ``work`` with pyinstrument into ``path``; the reason when it cannot."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return "pyinstrument is not installed (pip install -e '.[bench]')"
    profiler = Profiler(interval=0.0005)
    profiler.start()
    for _ in range(repeat):
        work()
    profiler.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profiler.output_text(unicode=False, color=False), encoding="utf-8")
    return None


def import_times(root: Path, path: Path, top: int = 25) -> list[dict[str, Any]]:
    """The ``top`` modules by cumulative import time of a fresh ``load()``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows: list[dict[str, Any]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        first, cumulative_us, name = line.split("|", 2)
        self_us = first.removeprefix("import time:")
        rows.append(
            {
                "module": name.strip(),
                "self_s": int(self_us) / 1e6,
                "cumulative_s": int(cumulative_us) / 1e6,
            }
        )
    rows.sort(key=lambda r: -float(r["cumulative_s"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{r['cumulative_s']:8.3f} s cumulative {r['self_s']:8.3f} s self  {r['module']}"
        for r in rows[:top]
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows[:top]
