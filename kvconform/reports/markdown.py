"""``summary.md``: the few lines a CI job page shows.

Verdict first, then counts, then the root-cause groups (upstream causes first, then the largest, each
with a representative scenario and its ``explain`` command), then for each failing scenario its first failure
and the command that reruns it, then the known divergences that conform now
(xpassed), the ones that still diverge (xfailed) with their reasons, and the
coverage gaps.
Long runs stay readable: at most a handful of failures per scenario are shown;
``report.json`` has all of them.
"""

from __future__ import annotations

from pathlib import Path

from kvconform.model.results import RunReport, Verdict
from kvconform.model.root_causes import RootCause
from kvconform.model.vllm_code import VllmCodeCoverage
from kvconform.model.wording import count
from kvconform.reports.root_causes import (
    MAX_GROUPS_LISTED,
    group_lines,
    never_below_floor_text,
    spans,
)

MAX_FAILURES_SHOWN = 3


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport) -> str:
    counts = report.counts()
    ok = report.exit_status == 0
    lines = [
        f"# kvconform: {'conform' if ok else 'NOT conform'} (exit {report.exit_status})",
        "",
        f"vLLM **{report.vllm_version or 'unavailable'}** ({report.vllm_source or '-'}"
        + (f", {report.vllm_path}" if report.vllm_path else "")
        + f"); torch {report.torch_version or '-'}; device {report.device or '-'}; "
        f"{report.duration:.1f} s",
        "",
        "| " + " | ".join(counts) + " |",
        "|" + "---|" * len(counts),
        "| " + " | ".join(str(v) for v in counts.values()) + " |",
        "",
    ]
    if report.vllm_error:
        lines += ["## vLLM could not be exercised", "", f"    {report.vllm_error}", ""]
    if report.input_errors:
        lines += ["## Input errors", ""]
        lines += [f"- `{e}`" for e in report.input_errors]
        lines.append("")
    if report.root_causes:
        lines += ["## Root causes", ""]
        text = group_lines(report)
        lines.append(text[0])
        fine = never_below_floor_text(report)
        if fine:
            lines.append(f"{fine[0].upper()}{fine[1:]}.")
        lines.append("")
        for number, group in enumerate(report.root_causes[:MAX_GROUPS_LISTED], 1):
            rep = group.representative
            lines.append(
                f"{number}. **{count(group.records, 'record')}, "
                f"{count(len(group.scenarios), 'scenario')}**: "
                f"{_cell(_where(group))} {_cell(group.miss)} "
                f"[{', '.join(group.check_names)}]; {_cell(spans(group))}; e.g. `{rep.id}`: "
                f"`{report.explain_command(rep.file, rep.id)}`"
            )
        if len(report.root_causes) > MAX_GROUPS_LISTED:
            lines.append(
                f"\n… {len(report.root_causes) - MAX_GROUPS_LISTED} smaller groups in report.json"
            )
        lines.append("")
    bad = [r for r in report.results if r.verdict in (Verdict.FAILED, Verdict.ERROR)]
    if bad:
        lines += ["## Failing scenarios", ""]
        for result in bad:
            lines.append(f"### `{result.id}` — {result.verdict.value} ({result.file})")
            lines.append("")
            if result.error:
                lines.append(
                    f"- {result.error_kind.value if result.error_kind else 'error'}: {_cell(result.error)}"
                )
            for failure in result.failures[:MAX_FAILURES_SHOWN]:
                lines.append(f"- **{failure.check}**: {_cell(failure.message)}")
            if len(result.failures) > MAX_FAILURES_SHOWN:
                lines.append(f"- … {len(result.failures) - MAX_FAILURES_SHOWN} more in report.json")
            lines += ["", f"    {report.rerun_command(result)}", ""]
    xpassed = [r for r in report.results if r.verdict is Verdict.XPASSED]
    if xpassed:
        lines += [
            "## Known divergences that conform now (xpassed)",
            "",
            "Listed in the expectations file for this vLLM version, but every check passed: "
            "`kvconform run --update-expectations` narrows the entries.",
            "",
            "| scenario | listed because |",
            "|---|---|",
        ]
        lines += [f"| `{r.id}` | {_cell(r.expectation or '')} |" for r in xpassed]
        lines.append("")
    skipped = [r for r in report.results if r.verdict is Verdict.SKIPPED]
    if skipped:
        lines += ["## Skipped here", "", "| scenario | why |", "|---|---|"]
        lines += [f"| `{r.id}` | {_cell(r.skip_reason or '')} |" for r in skipped]
        lines.append("")
    unsupported = [r for r in report.results if r.verdict is Verdict.UNSUPPORTED]
    if unsupported:
        lines += [
            f"## Not offered by this vLLM (unsupported: {len(unsupported)})",
            "",
            "These scenarios need a spec type, method, runner or scheduler option this release "
            "does not offer; they do not count against it.",
            "",
            "| scenario | why |",
            "|---|---|",
        ]
        lines += [f"| `{r.id}` | {_cell(r.error or '')} |" for r in unsupported]
        lines.append("")
    known = [r for r in report.results if r.verdict is Verdict.XFAILED]
    if known:
        lines += ["## Known divergences (xfailed)", "", "| scenario | reason |", "|---|---|"]
        lines += [f"| `{r.id}` | {_cell(r.expectation or '')} |" for r in known]
        lines.append("")
    if report.coverage is not None:
        gaps = report.coverage.gaps()
        lines += [f"## Coverage: {len(gaps)} gaps", ""]
        lines += [f"- {_cell(gap)}" for gap in gaps[:20]]
        if len(gaps) > 20:
            lines.append(f"- … {len(gaps) - 20} more in report.html")
        lines.append("")
    if report.vllm_coverage is not None:
        lines += vllm_code_table(report.vllm_coverage)
    for note in report.notes:
        lines.append(f"> {note}")
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(report: RunReport, directory: Path) -> Path:
    path = directory / "summary.md"
    path.write_text(render_markdown(report), encoding="utf-8")
    return path


def _where(group: RootCause) -> str:
    """Who falls short, with its code in backticks."""
    party = group.vllm
    if group.function is not None:
        return f"{party.description}'s `{group.function}` (`{group.vllm_file}`)"
    via = ""
    if group.managers:
        via = ", dispatching to " + ", ".join(f"`{name}`" for name, _ in group.managers)
    return f"{party.description} `{party.function}` (`{party.file}`{via})"


def vllm_code_table(coverage: VllmCodeCoverage) -> list[str]:
    """One table: per file of vLLM's reservation code, the lines and branches executed."""
    version = coverage.vllm_version or "?"
    lines = [
        f"## vLLM {version} reservation code executed by the scenarios",
        "",
        "| file | lines | lines % | branches | branches % | branches never taken |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [(f.path + ("" if f.whole else " (lookahead only)"), f.counts) for f in coverage.files]
    for name, c in [*rows, ("**total**", coverage.total)]:
        lines.append(
            f"| {name} | {c.executed_lines}/{c.statements} | {c.line_percent:.1f} "
            f"| {c.executed_branches}/{c.branches} | {c.branch_percent:.1f} "
            f"| {c.branches - c.executed_branches} |"
        )
    lines += [
        "",
        f"Measured with coverage.py (branch mode) in: {', '.join(coverage.processes)}; "
        "per function, the branches never taken and the functions each scenario executes: "
        "report.json (`vllm_coverage`); the sources with the unexecuted lines marked: "
        "report.html.",
        "",
    ]
    return lines
