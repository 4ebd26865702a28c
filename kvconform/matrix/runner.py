"""One row of the matrix: ``kvconform run`` against one release, in a fresh process.

Each release needs its own process, because once ``vllm`` is imported another
tree cannot replace it. The child is ``python -m kvconform run`` with the same
interpreter and this very kvconform first on ``PYTHONPATH``
(:func:`kvconform.bisect.probe.kvconform_env`); it runs in the row's
own folder (so that a ``vllm/`` in the caller's working directory cannot shadow
the tree under test), writes its reports there and its output to ``run.log``.
The row is read back from the ``report.json`` it wrote.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.bisect.probe import log_tail, run_logged
from kvconform.model.kinds import Kind

LOG_FILE = "run.log"


@dataclass(frozen=True)
class ScenarioCell:
    """One scenario's outcome on one release, as its ``report.json`` says."""

    verdict: str
    kind: str
    headline: str = ""  # the error, or the first failure, or the first skip reason


@dataclass
class ReleaseRun:
    """One release's run: where its reports are and what they say."""

    release: str
    folder: Path
    supported: bool  # at or above kvconform's minimum; the others are information
    exit_status: int | None = None  # None: the run wrote no report
    counts: dict[str, int] = field(default_factory=dict)
    scenarios: dict[str, ScenarioCell] = field(default_factory=dict)
    duration: float = 0.0
    problem: str = ""  # why there is no report, or why vLLM could not be exercised
    vllm_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "supported": self.supported,
            "exit_status": self.exit_status,
            "counts": self.counts,
            "duration_s": round(self.duration, 3),
            "report_dir": str(self.folder),
            "problem": self.problem,
            "vllm_version": self.vllm_version,
            "verdicts": {sid: cell.verdict for sid, cell in self.scenarios.items()},
        }


def run_command(release: str, run_args: list[str], folder: Path) -> list[str]:
    return [
        sys.executable, "-m", "kvconform", "run", *run_args, "--vllm-release", release,
        "--report-dir", str(folder), "--progress", "off",
    ]  # fmt: skip


def run_release(release: str, run_args: list[str], folder: Path, supported: bool) -> ReleaseRun:
    """Run the corpus against ``release`` in a fresh process; reports land in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "report.html", "junit.xml", "summary.md"):
        (folder / stale).unlink(missing_ok=True)
    command = run_command(release, run_args, folder)
    started = time.perf_counter()
    done = run_logged(command, folder, LOG_FILE)
    row = read_run(release, folder, supported)
    row.duration = time.perf_counter() - started
    if row.exit_status is None:
        row.problem = f"kvconform run exited {done.returncode} without a report: {log_tail(folder, log_file=LOG_FILE)}"
    return row


def read_run(release: str, folder: Path, supported: bool) -> ReleaseRun:
    """The row a run's ``report.json`` describes (no exit status if there is none)."""
    row = ReleaseRun(release, folder, supported)
    try:
        data = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return row
    row.exit_status = int(data["exit_status"])
    row.counts = {k: int(v) for k, v in (data.get("counts") or {}).items()}
    vllm = data.get("vllm") or {}
    row.vllm_version = vllm.get("version")
    row.problem = vllm.get("error") or ""
    for entry in data.get("scenarios", []):
        row.scenarios[entry["id"]] = ScenarioCell(
            entry["verdict"], entry.get("kind", Kind.TRAJECTORY), headline_of(entry)
        )
    return row


def headline_of(entry: dict[str, Any]) -> str:
    if entry.get("error"):
        return str(entry["error"])
    failures = entry.get("failures") or []
    if failures:
        return f"[{failures[0]['check']}] {failures[0]['message']}"
    skipped = entry.get("skipped_checks") or {}
    return next((f"{name} skipped: {why}" for name, why in skipped.items()), "")
