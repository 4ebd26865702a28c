"""``kvconform judge``: judge the recordings of ``run --record-dir`` again, without vLLM."""

from __future__ import annotations

import argparse
import shlex
import sys

from kvconform import __version__
from kvconform.fronts.commands.run import DEFAULT_REPORT_DIR
from kvconform.fronts.console import QUIET
from kvconform.fronts.options import say, verbosity_of
from kvconform.fronts.summary import finish_run
from kvconform.harness.checks import DEFAULT_CHECKS
from kvconform.harness.session import RunRequest, checks_from
from kvconform.harness.subcommand import CommandLine, Subcommand


class JudgeCommand(Subcommand):
    name = "judge"
    help = "judge the recordings of `run --record-dir` again, without vLLM"
    description = (
        "Read recordings (files, or folders of NNNN-ID.json written by `kvconform "
        "run --record-dir`), judge them with the current checks and write the same reports "
        "as run; vLLM is never imported, so a run recorded on a GPU host is judged anywhere."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument("paths", nargs="+", metavar="PATH", help="a recording or a folder of them")
        parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
        parser.add_argument(
            "--checks",
            metavar="LIST",
            help="the checks to judge with, as for run (default: those the run selected)",
        )
        cli.add_expectation_options(parser)
        cli.add_verbosity_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_judge(args)


COMMAND = JudgeCommand()


def cmd_judge(args: argparse.Namespace) -> int:
    """``kvconform judge``: the recordings of ``run --record-dir``, judged again with the
    current checks, into the same reports; vLLM is never imported."""
    from kvconform.harness.judging import judge_recordings, read_recordings

    recordings = read_recordings(args.paths)
    chosen = checks_from(args.checks) if args.checks else None
    request = RunRequest(
        checks=chosen or (recordings[0].checks if recordings else DEFAULT_CHECKS),
        expectations=args.expectations,
        no_expectations=bool(args.no_expectations),
        command=shlex.join(["kvconform", *sys.argv[1:]]) if sys.argv else "kvconform judge",
    )
    report = judge_recordings(recordings, request, chosen)
    if verbosity_of(args) > QUIET:
        say(
            f"kvconform {__version__}: {len(recordings)} recordings of vLLM "
            f"{report.vllm_version} judged without vLLM"
        )
        for note in report.notes:
            if note.startswith("check "):
                say(note)
    return finish_run(report, args)
