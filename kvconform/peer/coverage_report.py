"""How much of the reservation code vLLM's own tests cover: per file and per function.

The numbers come from coverage.py's JSON report of the green selection
(:mod:`kvconform.peer.reach` runs it, branches measured). For each
reservation file and each reservation function this module keeps statement
and branch counts and percentages, and lists the branches no test ever took,
each with the source line it leaves from (a branch ``a -> b`` is the jump from
line ``a`` to line ``b``; a negative ``b`` is leaving the function), so that a
reader sees at once which decision vLLM's tests never exercise.

:func:`summarize` is a pure function of the JSON report and the source files;
:func:`write` puts ``summary.json`` and ``summary.md`` in a report folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvconform.peer.reach import MODULE_LEVEL, counted, relative_name


@dataclass
class Counts:
    statements: int = 0
    covered_lines: int = 0
    branches: int = 0
    covered_branches: int = 0

    @property
    def line_percent(self) -> float:
        return 100.0 * self.covered_lines / self.statements if self.statements else 100.0

    @property
    def branch_percent(self) -> float:
        return 100.0 * self.covered_branches / self.branches if self.branches else 100.0

    @property
    def percent(self) -> float:
        """coverage.py's own figure: lines and branches together."""
        total = self.statements + self.branches
        done = self.covered_lines + self.covered_branches
        return 100.0 * done / total if total else 100.0

    def add(self, other: Counts) -> None:
        self.statements += other.statements
        self.covered_lines += other.covered_lines
        self.branches += other.branches
        self.covered_branches += other.covered_branches

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("line_percent", "branch_percent", "percent"):
            data[name] = round(getattr(self, name), 1)
        return data


@dataclass
class MissedBranch:
    source_line: int
    target_line: int  # negative: leaving the function
    text: str


@dataclass
class Unit:
    """A file or a function, with its counts and the branches never taken."""

    name: str
    counts: Counts
    missed: list[MissedBranch] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.counts.to_json(),
            "missed_branches": [asdict(m) for m in self.missed],
        }


def _counts(summary: dict[str, Any]) -> Counts:
    return Counts(
        statements=int(summary.get("num_statements", 0)),
        covered_lines=int(summary.get("covered_lines", 0)),
        branches=int(summary.get("num_branches", 0)),
        covered_branches=int(summary.get("covered_branches", 0)),
    )


def _missed(entry: dict[str, Any], lines: list[str]) -> list[MissedBranch]:
    missed = []
    for source, target in entry.get("missing_branches", []):
        text = lines[source - 1].strip() if 0 < source <= len(lines) else ""
        missed.append(MissedBranch(int(source), int(target), text))
    return missed


@dataclass
class CoverageSummary:
    files: list[Unit]
    functions: list[Unit]

    @property
    def total(self) -> Counts:
        total = Counts()
        for unit in self.files:
            total.add(unit.counts)
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total.to_json(),
            "files": [u.to_json() for u in self.files],
            "functions": [u.to_json() for u in self.functions],
        }


def summarize(report: dict[str, Any], vllm_dir: Path) -> CoverageSummary:
    """Per-file and per-function coverage of the reservation code in ``report``.

    A file counted only for some functions (``config/vllm.py``) contributes those
    functions' counts to its file row, not the whole file's.
    """
    files: list[Unit] = []
    functions: list[Unit] = []
    for measured, entry in sorted(report.get("files", {}).items()):
        relative = relative_name(measured, vllm_dir)
        source = Path(measured)
        lines = source.read_text(encoding="utf-8").splitlines() if source.exists() else []
        whole = all(counted(relative, name) for name in entry.get("functions", {}) if name)
        file_units = []
        for name, function in sorted(entry.get("functions", {}).items()):
            if name == MODULE_LEVEL or not counted(relative, name):
                continue
            unit = Unit(
                f"{relative}::{name}", _counts(function["summary"]), _missed(function, lines)
            )
            file_units.append(unit)
        functions.extend(file_units)
        if whole:
            files.append(Unit(relative, _counts(entry["summary"]), _missed(entry, lines)))
        elif file_units:
            partial = Counts()
            for unit in file_units:
                partial.add(unit.counts)
            files.append(Unit(relative, partial, [m for u in file_units for m in u.missed]))
    return CoverageSummary(files, functions)


def markdown(summary: CoverageSummary) -> str:
    rows = [
        "| file | statements | lines % | branches | branches % | coverage.py % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for unit in [*summary.files, Unit("**total**", summary.total)]:
        c = unit.counts
        rows.append(
            f"| {unit.name} | {c.statements} | {c.line_percent:.1f} | {c.branches} "
            f"| {c.branch_percent:.1f} | {c.percent:.1f} |"
        )
    return "\n".join(rows) + "\n"


def write(summary: CoverageSummary, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary.to_json(), indent=1))
    (folder / "summary.md").write_text(markdown(summary))
