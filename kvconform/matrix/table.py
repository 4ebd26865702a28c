"""The matrix report: release x verdict counts, what changed between neighbours, and why.

Built from the rows :mod:`.runner` read back, written as ``matrix.json``
(schema ``kvconform-matrix/1``), ``matrix.md`` (for a CI job page) and
``matrix.html`` (every count links the release's own ``report.html``).
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform import __version__
from kvconform.errors import ExitStatus
from kvconform.matrix.runner import ReleaseRun
from kvconform.model.kinds import entry

SCHEMA = "kvconform-matrix/1"
# Columns in this order; a verdict a report counts and this list lacks goes after them.
VERDICT_ORDER = (
    "passed",
    "failed",
    "error",
    "unsupported",
    "skipped",
    "xfailed",
    "xpassed",
    "input errors",
)
# Verdicts a reader has to look at: a count of them is a link to that part of report.html.
ANCHORS = {
    "passed": "passed",
    "failed": "groups",
    "error": "errors",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "skipped": "skipped",
    "unsupported": "unsupported",
    "input errors": "input-errors",
}
UPSTREAM_BUG = (
    "the upstream warmup bug: before 0.28.0 the V2 warmup reserves no lookahead blocks "
    "(docs/findings.md#consequence-of-the-0271-warmup-bug)"
)
NO_RUN = "—"  # a scenario a release's run did not have


@dataclass(frozen=True)
class Change:
    scenario: str
    before: str
    after: str


@dataclass
class Matrix:
    rows: list[ReleaseRun]  # oldest first
    minimum: str  # kvconform's minimum supported release
    command: str  # the `kvconform run` arguments every row ran with

    def columns(self) -> list[str]:
        seen = {k for row in self.rows for k, v in row.counts.items() if v}
        return [*[c for c in VERDICT_ORDER if c in seen], *sorted(seen - set(VERDICT_ORDER))]

    def changes(self) -> list[tuple[ReleaseRun, ReleaseRun, list[Change]]]:
        """Per pair of neighbouring releases that both ran: the scenarios whose verdict changed."""
        ran = [row for row in self.rows if row.exit_status is not None]
        out = []
        for older, newer in zip(ran[:-1], ran[1:], strict=True):
            ids = list(dict.fromkeys([*older.scenarios, *newer.scenarios]))
            changed = [
                Change(sid, before, after)
                for sid in ids
                for before, after in [(_verdict(older, sid), _verdict(newer, sid))]
                if before != after
            ]
            out.append((older, newer, changed))
        return out

    def exit_status(self) -> ExitStatus:
        """The worst supported row: nonconformance, then bad input, then not exercised
        (a failure outranks bad input, as in one run: ``runner.exit_status``)."""
        statuses = {
            ExitStatus.NOT_EXERCISED if r.exit_status is None else ExitStatus(r.exit_status)
            for r in self.rows
            if r.supported
        }
        for status in (
            ExitStatus.NONCONFORMANCE,
            ExitStatus.BAD_INPUT,
            ExitStatus.NOT_EXERCISED,
            ExitStatus.NO_SELECTION,
        ):
            if status in statuses:
                return status
        return ExitStatus.CONFORM

    def notes(self, row: ReleaseRun) -> list[str]:
        """What a reader needs beside the counts: why a row is not all green."""
        if row.exit_status is None or row.problem:
            return [row.problem or "no report"]
        notes = []
        if not row.supported:
            notes.append(
                f"below kvconform's minimum {self.minimum}: run for bisection, information only "
                "(not in the matrix's exit status)"
            )
            warmup = [c for c in row.scenarios.values() if entry(c.kind).drives_warmup]
            red = [c for c in warmup if c.verdict == "failed"]
            if red:
                notes.append(f"{len(red)} of {len(warmup)} warmup scenarios fail: {UPSTREAM_BUG}")
            others = Counter(
                c.verdict for c in row.scenarios.values() if not entry(c.kind).drives_warmup
            )
            if others:
                notes.append(
                    "the other scenarios: "
                    + ", ".join(f"{n} {v}" for v, n in sorted(others.items(), key=_by_column))
                )
        for verdict in ("unsupported", "error", "failed", "xpassed"):
            reasons = Counter(
                reason_of(c.headline)
                for c in row.scenarios.values()
                if c.verdict == verdict and not (not row.supported and entry(c.kind).drives_warmup)
            )
            for reason, n in reasons.most_common(4):
                notes.append(f"{verdict} ({n}): {reason}")
            if len(reasons) > 4:
                notes.append(f"{verdict}: {len(reasons) - 4} more reasons in the run's report")
        return notes

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kvconform": __version__,
            "minimum_supported": self.minimum,
            "command": self.command,
            "exit_status": int(self.exit_status()),
            "releases": [{**row.to_json(), "notes": self.notes(row)} for row in self.rows],
            "changes": [
                {
                    "from": older.release,
                    "to": newer.release,
                    "scenarios": [
                        {"id": c.scenario, "from": c.before, "to": c.after} for c in changed
                    ],
                }
                for older, newer, changed in self.changes()
            ],
        }


def _verdict(row: ReleaseRun, scenario: str) -> str:
    cell = row.scenarios.get(scenario)
    return cell.verdict if cell is not None else NO_RUN


def _by_column(item: tuple[str, int]) -> int:
    return VERDICT_ORDER.index(item[0]) if item[0] in VERDICT_ORDER else len(VERDICT_ORDER)


_FILE_REF = re.compile(r" \([^()]*\.ya?ml:\d+[^()]*\)")
_VERSION_PREFIX = re.compile(r"^vLLM \S+ ")
_STEP_DETAIL = re.compile(r"^(\[\w+\]) step .*$")


def reason_of(headline: str) -> str:
    """A headline without what differs per scenario, so that one cause counts once."""
    text = " ".join(headline.split())
    text = _VERSION_PREFIX.sub("", _FILE_REF.sub("", text))
    text = _STEP_DETAIL.sub(r"\1 failures", text)
    return text if len(text) <= 160 else text[:157] + "..."


# -- writers ---------------------------------------------------------------------------


def write_matrix(matrix: Matrix, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("matrix.json", json.dumps(matrix.to_json(), indent=1) + "\n"),
        ("matrix.md", render_markdown(matrix, directory)),
        ("matrix.html", render_html(matrix, directory)),
    ):
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _link(row: ReleaseRun, directory: Path) -> str:
    try:
        return str((row.folder / "report.html").relative_to(directory))
    except ValueError:
        return str(row.folder / "report.html")


def _changed(changed: list[Change]) -> str:
    if not changed:
        return "no verdict changed"
    return f"{len(changed)} verdict{'s' if len(changed) > 1 else ''} changed"


def _release_label(row: ReleaseRun) -> str:
    return row.release if row.supported else f"{row.release} (below minimum)"


def _status(matrix: Matrix) -> str:
    status = matrix.exit_status()
    meaning = {
        ExitStatus.CONFORM: "every supported release conforms",
        ExitStatus.NONCONFORMANCE: "an unexpected failure, or vLLM raising",
        ExitStatus.BAD_INPUT: "bad input",
        ExitStatus.NOT_EXERCISED: "a release could not be exercised",
        ExitStatus.NO_SELECTION: "the selection matched no scenario",
    }
    return f"{int(status)} ({meaning.get(status, status.name.lower())})"


def render_markdown(matrix: Matrix, directory: Path, changes_shown: int = 20) -> str:
    columns = matrix.columns()
    lines = [
        "# vLLM release matrix",
        "",
        f"kvconform {__version__}; per release `kvconform run {matrix.command} "
        f"--vllm-release V`; minimum supported {matrix.minimum}. "
        f"Exit status {_status(matrix)}.",
        "",
        "| release | " + " | ".join(columns) + " | exit | time | report | notes |",
        "|---|" + "---|" * (len(columns) + 4),
    ]
    for row in matrix.rows:
        counts = [str(row.counts.get(c, 0)) for c in columns]
        exit_text = "—" if row.exit_status is None else str(row.exit_status)
        notes = "; ".join(matrix.notes(row)).replace("|", "\\|")
        lines.append(
            f"| {_release_label(row)} | " + " | ".join(counts) + f" | {exit_text} | "
            f"{row.duration:.0f} s | [report.html]({_link(row, directory)}) | {notes} |"
        )
    lines += ["", "## Verdicts that changed between neighbouring releases", ""]
    for older, newer, changed in matrix.changes():
        lines.append(f"- **{older.release} → {newer.release}**: {_changed(changed)}")
        for change in changed[:changes_shown]:
            lines.append(f"  - `{change.scenario}`: {change.before} → {change.after}")
        if len(changed) > changes_shown:
            lines.append(f"  - … {len(changed) - changes_shown} more in matrix.json")
    return "\n".join(lines) + "\n"


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1b1b1b; }
table { border-collapse: collapse; margin: 12px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; } td.zero { color: #bbb; }
td.failed, td.error, td.input-errors { background: #fde8e7; color: #c62828; font-weight: 600; }
td.xpassed { background: #f3e5f5; } td.unsupported { background: #fff1d6; }
tr.info td:first-child { color: #666; font-style: italic; }
td.exit0 { background: #e6f4ea; } td.exitbad { background: #fde8e7; }
ul.notes { margin: 0; padding-left: 18px; } code { font-size: 13px; }
"""


def render_html(matrix: Matrix, directory: Path) -> str:
    e = html.escape
    columns = matrix.columns()
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>vLLM release matrix</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>vLLM release matrix</h1>",
        f"<p>kvconform {e(__version__)}; per release <code>kvconform run {e(matrix.command)} "
        f"--vllm-release V</code>; minimum supported {e(matrix.minimum)}. "
        f"Exit status <b>{e(_status(matrix))}</b>.</p>",
        "<table><tr><th>release</th>"
        + "".join(f"<th>{e(c)}</th>" for c in columns)
        + "<th>exit</th><th>time</th><th>notes</th></tr>",
    ]
    for row in matrix.rows:
        link = _link(row, directory)
        cells = []
        for column in columns:
            n = row.counts.get(column, 0)
            anchor = ANCHORS.get(column, "")
            href = f"{link}#{anchor}" if anchor else link
            klass = "n zero" if not n else f"n {column.replace(' ', '-')}"
            text = f'<a href="{e(href)}">{n}</a>' if row.exit_status is not None else "—"
            cells.append(f'<td class="{klass}">{text}</td>')
        good = row.exit_status == 0
        exit_text = "—" if row.exit_status is None else str(row.exit_status)
        notes = "".join(f"<li>{e(n)}</li>" for n in matrix.notes(row))
        out.append(
            f'<tr class="{"" if row.supported else "info"}">'
            f'<td><a href="{e(link)}">{e(_release_label(row))}</a></td>'
            + "".join(cells)
            + f'<td class="n {"exit0" if good else "exitbad"}">{exit_text}</td>'
            f'<td class="n">{row.duration:.0f} s</td><td><ul class="notes">{notes}</ul></td></tr>'
        )
    out.append("</table><h2>Verdicts that changed between neighbouring releases</h2>")
    for older, newer, changed in matrix.changes():
        out.append(f"<h3>{e(older.release)} → {e(newer.release)}: {e(_changed(changed))}</h3>")
        if changed:
            out.append("<table><tr><th>scenario</th>")
            out.append(f"<th>{e(older.release)}</th><th>{e(newer.release)}</th></tr>")
            for change in changed:
                out.append(
                    f"<tr><td><code>{e(change.scenario)}</code></td>"
                    f'<td><a href="{e(_link(older, directory))}">{e(change.before)}</a></td>'
                    f'<td><a href="{e(_link(newer, directory))}">{e(change.after)}</a></td></tr>'
                )
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def render_console(matrix: Matrix) -> list[str]:
    """The matrix as a few console lines: one per release, then the changes' sizes."""
    columns = matrix.columns()
    lines = [f"{'release':24} " + " ".join(f"{c[:11]:>11}" for c in columns) + "  exit"]
    for row in matrix.rows:
        counts = " ".join(f"{row.counts.get(c, 0):>11}" for c in columns)
        exit_text = "—" if row.exit_status is None else str(row.exit_status)
        lines.append(f"{_release_label(row):24} {counts}  {exit_text:>4}")
    for older, newer, changed in matrix.changes():
        if changed:
            lines.append(f"{older.release} → {newer.release}: {len(changed)} verdicts changed")
    return lines
