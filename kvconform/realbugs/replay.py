"""One real bug through the corpus: detected, missed or broken, and who caught it.

The corpus runs in a fresh process (``kvconform run --checks all --vllm-src TREE``,
as a bisection probe runs, :func:`kvconform.bisect.probe.run_logged`) and its
``report.json`` is read back. The verdict follows the run's exit status: 1 is
*detected* (with every failed scenario and the checks that failed it), 0 is
*missed*, anything else is *broken* with why (the patched tree did not import, a
scenario errored, the run died). The unpatched release is replayed the same way
first: a bug can only be detected against a green baseline.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.bisect.probe import log_tail, run_logged

LOG_FILE = "run.log"


@dataclass
class Replay:
    """What the corpus made of one tree."""

    outcome: str  # detected | missed | broken | green (a baseline)
    exit_status: int | None
    # scenario id -> the checks that failed it ("crash" for vLLM raising)
    caught_by: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    why: str = ""
    report_dir: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "exit_status": self.exit_status,
            "caught_by": self.caught_by,
            "counts": self.counts,
            "seconds": round(self.seconds, 1),
            "why": self.why,
            "report_dir": self.report_dir,
        }


def replay(
    tree: Path, paths: list[str], folder: Path, checks: str = "all", exitfirst: bool = False
) -> Replay:
    """Run the corpus at ``paths`` against the vLLM tree ``tree``; reports in ``folder``.

    ``exitfirst``: stop at the first failing scenario (enough to call a bug detected).
    """
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "kvconform", "run", *paths, "--checks", checks,
        "--vllm-src", str(tree), "--report-dir", str(folder), "--progress", "off",
        *(["--exitfirst"] if exitfirst else []),
    ]  # fmt: skip
    started = time.perf_counter()
    done = run_logged(command, folder, LOG_FILE)
    seconds = time.perf_counter() - started
    try:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Replay(
            "broken", done.returncode, seconds=seconds, report_dir=str(folder),
            why=f"kvconform run exited {done.returncode} without a report: "
            + log_tail(folder, log_file=LOG_FILE),
        )  # fmt: skip
    status = int(report.get("exit_status", done.returncode))
    caught: dict[str, list[str]] = {}
    for entry in report.get("scenarios", []):
        if entry["verdict"] == "failed":
            caught[entry["id"]] = sorted({f["check"] for f in entry.get("failures", [])})
        elif entry["verdict"] == "error" and entry.get("error_kind") == "crash":
            caught[entry["id"]] = ["crash"]
    result = Replay(
        "detected" if status == 1 else "missed" if status == 0 else "broken",
        status,
        caught,
        dict(report.get("counts", {})),
        seconds,
        report_dir=str(folder),
    )
    if result.outcome == "broken":
        errors = [
            f"{e['id']}: {e.get('error')}"
            for e in report.get("scenarios", [])
            if e["verdict"] == "error"
        ]
        problem = (
            report.get("vllm", {}).get("error") if isinstance(report.get("vllm"), dict) else None
        )
        result.why = f"exit {status}: " + (
            problem or "; ".join(errors[:3]) or log_tail(folder, log_file=LOG_FILE)
        )
    return result
