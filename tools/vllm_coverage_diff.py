"""Two measurements of vLLM's reservation code, side by side: per file, and the branches one
takes that the other does not.

Each side is a kvconform ``report.json`` (its ``vllm_coverage``, from
``kvconform coverage --vllm-code``) or the peer's summary of vLLM's own tests
(``coverage-vllm-tests-VERSION.json``: ``files`` with ``name``, ``statements``,
``covered_lines``, ``branches``, ``covered_branches`` and ``missed_branches`` of
``source_line``, ``target_line``, ``text``). Several kvconform reports on one side are
joined: a branch counts as taken when any of them took it (a run of new scenarios beside
the corpus's run).

    python tools/vllm_coverage_diff.py --left build/vllm-coverage/report.json \\
        --right coverage-vllm-tests-0.33.0.json --left-name kvconform --right-name "vLLM tests"

prints a Markdown table per file and the branches taken by one side only, grouped by
function (written for docs/coverage.md).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Branch = tuple[int, int]


@dataclass
class Side:
    """Per file: statements, branches, missed branches (with text), function of each."""

    name: str
    branches: dict[str, int] = field(default_factory=dict)
    statements: dict[str, int] = field(default_factory=dict)
    missed_lines: dict[str, set[int]] = field(default_factory=dict)
    missed: dict[str, dict[Branch, tuple[str, str]]] = field(default_factory=dict)

    def percent(self, path: str) -> float:
        total = self.branches.get(path, 0)
        return 100.0 * (total - len(self.missed.get(path, {}))) / total if total else 100.0

    def line_percent(self, path: str) -> float:
        total = self.statements.get(path, 0)
        return 100.0 * (total - len(self.missed_lines.get(path, set()))) / total if total else 100.0


def read_side(name: str, paths: list[Path]) -> Side:
    side = Side(name)
    for number, path in enumerate(paths):
        data = json.loads(path.read_text())
        files = _kvconform_files(data) if "vllm_coverage" in data else _peer_files(data)
        for file, (statements, branches, missed_lines, missed) in files.items():
            if number == 0 or file not in side.missed:
                side.statements[file], side.branches[file] = statements, branches
                side.missed_lines[file], side.missed[file] = missed_lines, missed
            else:  # joined: missed only where every report missed it
                side.missed_lines[file] &= missed_lines
                side.missed[file] = {
                    b: side.missed[file][b] for b in side.missed[file] if b in missed
                }
    return side


def _kvconform_files(data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for unit in (data.get("vllm_coverage") or {}).get("files", []):
        missed = {}
        lines: set[int] = set()
        for function in unit["functions"]:
            lines |= set(function.get("missing_lines", []))
            for m in function["missed_branches"]:
                missed[(m["line"], m["target"])] = (function["name"], m["text"])
        out[unit["path"]] = (unit["statements"], unit["branches"], lines, missed)
    return out


def _peer_files(data: dict[str, Any]) -> dict[str, Any]:
    functions = data.get("functions", [])
    out = {}
    for unit in data.get("files", []):
        path = unit["name"]
        owner: dict[Branch, str] = {}
        for function in functions:
            file, _, qual = function["name"].partition("::")
            if file == path:
                for m in function.get("missed_branches", []):
                    owner[(m["source_line"], m["target_line"])] = qual
        missed = {
            (m["source_line"], m["target_line"]): (
                owner.get((m["source_line"], m["target_line"]), "<module>"),
                m["text"],
            )
            for m in unit.get("missed_branches", [])
        }
        covered = int(unit.get("covered_lines", 0))
        statements = int(unit.get("statements", 0))
        lines = set(range(statements - covered))  # counts only: the peer lists no line numbers
        out[path] = (statements, int(unit.get("branches", 0)), lines, missed)
    return out


def only_in(taker: Side, other: Side) -> dict[str, dict[str, list[tuple[Branch, str]]]]:
    """Per file and function: branches ``taker`` takes and ``other`` misses."""
    out: dict[str, dict[str, list[tuple[Branch, str]]]] = {}
    for path, missed in other.missed.items():
        if path not in taker.missed:
            continue
        mine = taker.missed[path]
        by_function: dict[str, list[tuple[Branch, str]]] = defaultdict(list)
        for branch, (function, text) in sorted(missed.items()):
            if branch not in mine:
                by_function[function].append((branch, text))
        if by_function:
            out[path] = dict(by_function)
    return out


def table(left: Side, right: Side) -> str:
    rows = [
        f"| file | {left.name} lines % | {left.name} branches % | {right.name} lines % "
        f"| {right.name} branches % | only {left.name} takes | only {right.name} takes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    left_only, right_only = only_in(left, right), only_in(right, left)
    for path in sorted(set(left.branches) | set(right.branches)):
        a = sum(len(v) for v in left_only.get(path, {}).values())
        b = sum(len(v) for v in right_only.get(path, {}).values())
        lp = f"{left.line_percent(path):.0f}" if path in left.branches else "-"
        lb = f"{left.percent(path):.0f}" if path in left.branches else "-"
        rp = f"{right.line_percent(path):.0f}" if path in right.branches else "-"
        rb = f"{right.percent(path):.0f}" if path in right.branches else "-"
        rows.append(f"| `{path}` | {lp} | {lb} | {rp} | {rb} | {a} | {b} |")
    return "\n".join(rows) + "\n"


def listing(taker: Side, other: Side) -> str:
    lines = []
    for path, functions in only_in(taker, other).items():
        lines.append(f"\n`{path}`\n")
        for function, branches in sorted(functions.items()):
            shown = "; ".join(
                f"{a}->{'exit' if b < 0 else b} `{text[:60]}`" for (a, b), text in branches[:6]
            )
            more = f" (+{len(branches) - 6} more)" if len(branches) > 6 else ""
            lines.append(f"- `{function}` ({len(branches)}): {shown}{more}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--left", nargs="+", type=Path, required=True)
    parser.add_argument("--right", nargs="+", type=Path, required=True)
    parser.add_argument("--left-name", default="left")
    parser.add_argument("--right-name", default="right")
    parser.add_argument("--list", action="store_true", help="also list the one-sided branches")
    args = parser.parse_args()
    left, right = read_side(args.left_name, args.left), read_side(args.right_name, args.right)
    print(table(left, right))
    if args.list:
        print(f"### Branches only {left.name} takes\n{listing(left, right)}")
        print(f"### Branches only {right.name} takes\n{listing(right, left)}")


if __name__ == "__main__":
    main()
