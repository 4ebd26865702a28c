"""``kvconform coverage``: what the scenarios exercise; with ``--vllm-code``, which of
vLLM's reservation code they execute."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvconform.errors import ExitStatus, UsageError
from kvconform.fronts.commands.run import cmd_run
from kvconform.fronts.options import run_request, say
from kvconform.fronts.progress import open_progress
from kvconform.harness import runner
from kvconform.harness.coverage import render_text as render_coverage
from kvconform.harness.session import Session
from kvconform.harness.subcommand import CommandLine, Subcommand

DEFAULT_VLLM_CODE_DIR = "build/vllm-coverage"


class CoverageCommand(Subcommand):
    name = "coverage"
    help = (
        "which group types x methods x step kinds the scenarios exercise, and what vLLM "
        "offers that none covers"
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_selection_options(parser)
        cli.add_vllm_options(parser)
        parser.add_argument("--json", metavar="FILE", help="also write the coverage as JSON")
        parser.add_argument(
            "--vllm-code",
            action="store_true",
            help="instead: run the scenarios (as `run` does, every check unless --checks says "
            "otherwise) under coverage.py and report which lines and branches of vLLM's "
            "reservation code they execute, per file, function and scenario (report.json's "
            "vllm_coverage, summary.md, report.html with each source's unexecuted lines marked)",
        )
        parser.add_argument(
            "--vllm-files",
            action="append",
            metavar="GLOB[::FUNC,...]",
            help="with --vllm-code: the code that counts, a glob inside the folder holding vllm/ "
            "(repeat it; default: vllm/v1/core/*.py, vllm/v1/core/sched/*.py, "
            "vllm/v1/worker/gpu/warmup.py, vllm/v1/worker/gpu/block_table.py and the lookahead "
            "properties of vllm/config/vllm.py)",
        )
        parser.add_argument(
            "--checks", metavar="LIST", help="with --vllm-code: the checks to run (default all)"
        )
        parser.add_argument(
            "--report-dir",
            metavar="DIR",
            help=f"with --vllm-code: where the reports go (default {DEFAULT_VLLM_CODE_DIR})",
        )
        cli.add_expectation_options(parser)
        cli.add_progress_option(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_coverage(args)


COMMAND = CoverageCommand()


def cmd_coverage(args: argparse.Namespace) -> int:
    if args.vllm_code:
        from kvconform.harness.vllm_code import CodeTracer
        from kvconform.model.vllm_code import RESERVATION_CODE, Target

        targets = tuple(Target.from_text(t) for t in args.vllm_files or ()) or RESERVATION_CODE
        args.checks = args.checks or "all"
        args.report_dir = args.report_dir or DEFAULT_VLLM_CODE_DIR
        args.update_expectations = False
        return cmd_run(args, CodeTracer(targets))
    for option in ("checks", "vllm_files", "report_dir"):
        if getattr(args, option):
            raise UsageError(f"--{option.replace('_', '-')} goes with --vllm-code")
    # Coverage needs the trajectories, not the verdicts: the checks are skipped.
    session = Session(run_request(args, checks=()))
    selection = session.select()
    for err in selection.input_errors:
        say(f"ERROR {err}")
    results = []
    with open_progress(len(selection.scenarios), "scenarios", mode=args.progress) as progress:
        for scenario in selection.scenarios:
            progress.start_item(scenario.id)
            results.append(runner.run_scenario(scenario, session.vllm, checks=()))
            progress.advance(tally="error" if results[-1].error else "ok")
    notes: list[str] = []
    coverage = session.coverage(selection.scenarios, results, notes)
    for note in notes:
        say(f"note: {note}")
    say(render_coverage(coverage))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(coverage.to_json(), indent=1) + "\n")
        say(f"coverage: {args.json}")
    return ExitStatus.BAD_INPUT if selection.input_errors else ExitStatus.CONFORM
