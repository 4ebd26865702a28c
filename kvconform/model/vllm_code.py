"""How much of vLLM's reservation code a run executed, as data (``kvconform coverage --vllm-code``).

:mod:`kvconform.harness.vllm_code` measures it with coverage.py (branch mode, one
dynamic context per scenario) and fills these records; ``report.json``
(``vllm_coverage``), ``summary.md`` and ``report.html`` show them, and
``kvconform run --impacted-by`` reads the per-scenario functions.

Names: a file is its path inside the folder holding ``vllm/`` (``vllm/v1/core/block_pool.py``);
a function is ``FILE::Qual.name`` (``vllm/v1/core/block_pool.py::BlockPool.get_new_blocks``),
nested functions ``outer.inner``; :data:`MODULE_LEVEL` stands for the code outside any
function (imports, class bodies, constants), which every scenario runs at import. A branch
``a -> b`` is the jump from line ``a`` to line ``b``; a negative ``b`` leaves the function
that starts at line ``-b`` (coverage.py's notation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

MODULE_LEVEL = "<module>"


@dataclass(frozen=True)
class Target:
    """A part of vLLM's tree that counts: a glob inside the folder holding ``vllm/``, and
    the functions of it that count (None: every one, module level included)."""

    pattern: str
    functions: tuple[str, ...] | None = None

    def matches(self, path: str) -> bool:
        return fnmatch(path, self.pattern)

    def counts(self, path: str, function: str) -> bool:
        return self.matches(path) and (self.functions is None or function in self.functions)

    def to_text(self) -> str:
        return self.pattern + (f"::{','.join(self.functions)}" if self.functions else "")

    @classmethod
    def from_text(cls, text: str) -> Target:
        """``vllm/v1/core/*.py`` or ``vllm/config/vllm.py::VllmConfig.a,VllmConfig.b``."""
        pattern, _, names = text.partition("::")
        functions = tuple(n.strip() for n in names.split(",") if n.strip()) or None
        return cls(pattern.strip(), functions)


# vLLM's reservation code: the KV-cache manager, coordinator, block pool, the scheduler
# and its queue, the planner; the worker's block tables and warmup predictor; and the
# lookahead properties of VllmConfig (the only functions of config/vllm.py that count).
RESERVATION_CODE: tuple[Target, ...] = (
    Target("vllm/v1/core/*.py"),
    Target("vllm/v1/core/sched/*.py"),
    Target("vllm/v1/worker/gpu/warmup.py"),
    Target("vllm/v1/worker/gpu/block_table.py"),
    Target(
        "vllm/config/vllm.py",
        (
            "VllmConfig.num_lookahead_tokens",
            "VllmConfig.num_prefill_lookahead_tokens",
            "VllmConfig.num_hash_lookahead_tokens",
        ),
    ),
)


def counted(targets: tuple[Target, ...], path: str, function: str) -> bool:
    return any(t.counts(path, function) for t in targets)


def whole_file(targets: tuple[Target, ...], path: str) -> bool:
    return any(t.matches(path) and t.functions is None for t in targets)


@dataclass
class Counts:
    statements: int = 0
    executed_lines: int = 0
    branches: int = 0
    executed_branches: int = 0

    @property
    def line_percent(self) -> float:
        return 100.0 * self.executed_lines / self.statements if self.statements else 100.0

    @property
    def branch_percent(self) -> float:
        return 100.0 * self.executed_branches / self.branches if self.branches else 100.0

    @property
    def percent(self) -> float:
        """coverage.py's own figure: lines and branches together."""
        total = self.statements + self.branches
        done = self.executed_lines + self.executed_branches
        return 100.0 * done / total if total else 100.0

    def add(self, other: Counts) -> None:
        self.statements += other.statements
        self.executed_lines += other.executed_lines
        self.branches += other.branches
        self.executed_branches += other.executed_branches

    def to_json(self) -> dict[str, Any]:
        return {
            "statements": self.statements,
            "executed_lines": self.executed_lines,
            "branches": self.branches,
            "executed_branches": self.executed_branches,
            "line_percent": round(self.line_percent, 1),
            "branch_percent": round(self.branch_percent, 1),
            "percent": round(self.percent, 1),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(
            int(data["statements"]),
            int(data["executed_lines"]),
            int(data["branches"]),
            int(data["executed_branches"]),
        )


@dataclass(frozen=True)
class MissedBranch:
    """A branch no scenario took: from ``line`` (its source text) to ``target``."""

    line: int
    target: int
    text: str

    def describe(self) -> str:
        where = "exit" if self.target < 0 else str(self.target)
        return f"{self.line}->{where}: {self.text}"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "target": self.target, "text": self.text}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MissedBranch:
        return cls(int(data["line"]), int(data["target"]), str(data["text"]))


@dataclass
class FunctionCoverage:
    name: str  # Qual.name inside its file
    line: int  # its def line (0: module level)
    counts: Counts
    missing_lines: list[int] = field(default_factory=list)
    missed_branches: list[MissedBranch] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "line": self.line,
            **self.counts.to_json(),
            "missing_lines": self.missing_lines,
            "missed_branches": [m.to_json() for m in self.missed_branches],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionCoverage:
        return cls(
            str(data["name"]),
            int(data["line"]),
            Counts.from_json(data),
            [int(n) for n in data.get("missing_lines", [])],
            [MissedBranch.from_json(m) for m in data.get("missed_branches", [])],
        )


@dataclass
class FileCoverage:
    path: str  # vllm/...
    counts: Counts  # the counted functions only, for a file counted in part
    functions: list[FunctionCoverage] = field(default_factory=list)
    whole: bool = True  # every function counts (False: config/vllm.py's lookahead only)
    html: str | None = None  # its page in the run's coverage.py HTML, relative to the report

    @property
    def missed_branches(self) -> list[MissedBranch]:
        return [m for f in self.functions for m in f.missed_branches]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            **self.counts.to_json(),
            "whole": self.whole,
            "html": self.html,
            "functions": [f.to_json() for f in self.functions],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileCoverage:
        return cls(
            str(data["path"]),
            Counts.from_json(data),
            [FunctionCoverage.from_json(f) for f in data.get("functions", [])],
            bool(data.get("whole", True)),
            data.get("html"),
        )


@dataclass
class VllmCodeCoverage:
    """The run's coverage of vLLM's reservation code, per file, function and scenario."""

    vllm_version: str | None
    targets: tuple[Target, ...]
    files: list[FileCoverage] = field(default_factory=list)
    # scenario id -> the counted functions (FILE::Qual.name) it executed
    scenario_functions: dict[str, list[str]] = field(default_factory=dict)
    # where it was measured: "in-process", "engine child" (a child that ran, per scenario)
    processes: list[str] = field(default_factory=list)
    html_index: str | None = None  # coverage.py's HTML, relative to the report directory
    seconds: float = 0.0  # what measuring and analysing added after the run

    @property
    def total(self) -> Counts:
        total = Counts()
        for unit in self.files:
            total.add(unit.counts)
        return total

    def file(self, path: str) -> FileCoverage | None:
        return next((f for f in self.files if f.path == path), None)

    def scenarios_executing(self, function: str) -> list[str]:
        return sorted(s for s, names in self.scenario_functions.items() if function in names)

    def to_json(self) -> dict[str, Any]:
        # Each function name once; a scenario lists the indices of those it executed.
        names = sorted({n for v in self.scenario_functions.values() for n in v})
        index = {name: i for i, name in enumerate(names)}
        return {
            "vllm_version": self.vllm_version,
            "targets": [t.to_text() for t in self.targets],
            "total": self.total.to_json(),
            "files": [f.to_json() for f in self.files],
            "function_names": names,
            "scenario_functions": {
                s: [index[n] for n in v] for s, v in self.scenario_functions.items()
            },
            "processes": self.processes,
            "html_index": self.html_index,
            "seconds": round(self.seconds, 2),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VllmCodeCoverage:
        names = list(data.get("function_names", []))
        return cls(
            data.get("vllm_version"),
            tuple(Target.from_text(t) for t in data.get("targets", [])),
            [FileCoverage.from_json(f) for f in data.get("files", [])],
            {k: [names[i] for i in v] for k, v in data.get("scenario_functions", {}).items()},
            list(data.get("processes", [])),
            data.get("html_index"),
            float(data.get("seconds", 0.0)),
        )


# -- functions of a source file, by line (ast) -----------------------------------------


@dataclass(frozen=True)
class FunctionSpan:
    name: str  # Qual.name
    line: int  # the def line
    first: int  # first line of the definition, decorators included
    body: int  # first line of its body (the def line itself runs in the enclosing scope)
    last: int


def function_spans(source: str) -> list[FunctionSpan]:
    """Every function and method of ``source`` with its lines, outermost first."""
    import ast

    spans: list[FunctionSpan] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans.append(
                    FunctionSpan(
                        name, child.lineno, first, child.body[0].lineno, child.end_lineno or 0
                    )
                )
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return spans


class FunctionMap:
    """Which function a line of one source file belongs to (the innermost one)."""

    def __init__(self, source: str) -> None:
        self.spans = function_spans(source)
        self.lines = source.splitlines()

    def executing(self, line: int) -> FunctionSpan | None:
        """The function whose execution runs ``line`` (a def line runs in its parent)."""
        found = None
        for span in self.spans:
            if span.body <= line <= span.last:
                found = span if found is None or span.body >= found.body else found
        return found

    def name_executing(self, line: int) -> str:
        span = self.executing(line)
        return span.name if span is not None else MODULE_LEVEL

    def defining(self, line: int) -> str:
        """The function a change of ``line`` changes (its decorators and signature included)."""
        found = None
        for span in self.spans:
            if span.first <= line <= span.last:
                found = span if found is None or span.first >= found.first else found
        return found.name if found is not None else MODULE_LEVEL

    def text(self, line: int) -> str:
        return self.raw(line).strip()

    def raw(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""
