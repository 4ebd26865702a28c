"""``kvconform merge``: join the report directories of ``run --shard`` jobs."""

from __future__ import annotations

import argparse
import shlex
import sys

from kvconform.fronts.commands.run import DEFAULT_REPORT_DIR
from kvconform.fronts.options import say
from kvconform.fronts.summary import counts_line, print_short_summary
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.model.wording import count


class MergeCommand(Subcommand):
    name = "merge"
    help = "join the report directories of `run --shard` jobs into one set of reports"
    description = (
        "Read each DIR/report.json (one per shard), write one report.json, "
        "junit.xml, summary.md and report.html, and exit with the status of the whole "
        "selection. A missing or repeated shard, or shards run against different vLLM "
        "versions or checks, exits 2."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument("dirs", nargs="+", metavar="DIR", help="a shard's --report-dir")
        parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_merge(args)


COMMAND = MergeCommand()


def cmd_merge(args: argparse.Namespace) -> int:
    from kvconform.reports import write_reports
    from kvconform.reports.merge import merge_reports

    report = merge_reports(args.dirs, command=shlex.join(["kvconform", *sys.argv[1:]]))
    for note in report.notes:
        if note.startswith("merge: "):
            say(f"ERROR {note}")
    print_short_summary(report)
    say(
        f"\nmerged {count(len(args.dirs), 'shard')}: {counts_line(report) or 'nothing ran'}; "
        f"exit {report.exit_status}"
    )
    written = write_reports(report, args.report_dir)
    say("reports: " + ", ".join(str(p) for p in written))
    return report.exit_status
