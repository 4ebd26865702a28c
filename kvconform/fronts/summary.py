"""The end of a run, as pytest's: the short summary, the root causes, the counts, the
reports (``run``, ``check``, ``judge``, ``coverage --vllm-code``; ``merge`` prints
the short summary and the counts)."""

from __future__ import annotations

import argparse
import time

from kvconform.fronts.console import QUIET
from kvconform.fronts.options import say, verbosity_of
from kvconform.model.results import RunReport, Verdict
from kvconform.model.wording import count, plural, shorten

SHORT_SUMMARY_MAX = 20
# A short summary line's message: its prose is shortened to this, never its figures.
SHORT_LINE = 160


def print_short_summary(report: RunReport) -> None:
    """The failed ids at the end of the log, as pytest's "short test summary info",
    each with the command that reruns it."""
    bad = [r for r in report.results if r.verdict in (Verdict.FAILED, Verdict.ERROR)]
    if not bad and not report.input_errors:
        return
    say("\n" + " short summary ".center(72, "="))
    for err in report.input_errors[:SHORT_SUMMARY_MAX]:
        say(f"INPUT   {err}")
    for result in bad[:SHORT_SUMMARY_MAX]:
        first = result.failures[0] if result.failures and not result.error else None
        headline = " ".join(
            (f"[{first.check}] {result.headline()}" if first else result.headline()).split()
        )
        say(f"{result.verdict.value.upper():7} {result.id} - {shorten(headline, SHORT_LINE)}")
        say(f"        rerun: {report.rerun_command(result)}")
    hidden = max(0, len(bad) - SHORT_SUMMARY_MAX) + max(
        0, len(report.input_errors) - SHORT_SUMMARY_MAX
    )
    if hidden:
        say(f"... and {hidden} more in summary.md and report.json")


def counts_line(report: RunReport) -> str:
    """ "3 passed, 1 failed, 1 input error": the verdicts' counts, the nouns in number."""
    # Verdicts are adjectives ("1 passed"); "error" and "input errors" are nouns.
    return ", ".join(
        count(n, verdict.removesuffix("s")) if "error" in verdict else f"{n} {verdict}"
        for verdict, n in report.counts().items()
        if n
    )


def finish_run(report: RunReport, args: argparse.Namespace) -> int:
    """The end of a run, as pytest's: every failure with its first message and rerun,
    the root causes (not with -q), the counts, the reports."""
    from kvconform.reports import write_reports
    from kvconform.reports.root_causes import group_lines

    verbosity = verbosity_of(args)
    report.duration = time.time() - report.started
    print_short_summary(report)
    if verbosity > QUIET:
        lines = group_lines(report)
        if lines:
            say("\n" + " root causes ".center(72, "="))
        for line in lines:
            say(line)
    xpassed = [r.id for r in report.results if r.verdict is Verdict.XPASSED]
    if xpassed:
        say(
            f"XPASSED: {count(len(xpassed), 'known divergence')} "
            f"{'conforms' if len(xpassed) == 1 else 'conform'} now ({', '.join(xpassed[:5])}"
            + (", ..." if len(xpassed) > 5 else "")
            + f"); {plural(len(xpassed), 'its', 'their')} expectations "
            f"{plural(len(xpassed), 'entry')} {plural(len(xpassed), 'is')} stale for this vLLM"
        )
    say(
        f"\n{counts_line(report) or 'nothing ran'} in {report.duration:.1f} s; exit {report.exit_status}"
    )
    if args.report_dir:  # `check` writes reports only when asked to
        written = write_reports(report, args.report_dir)
        say("reports: " + ", ".join(str(p) for p in written))
    return report.exit_status
