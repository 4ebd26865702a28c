"""``kvconform run``: run scenarios and write reports (docs/cli.md)."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvconform import __version__
from kvconform.errors import ExitStatus, KvconformError
from kvconform.fronts.console import NORMAL, QUIET, Console, folded_lines
from kvconform.fronts.options import run_request, say, verbosity_of
from kvconform.fronts.progress import open_progress
from kvconform.fronts.summary import finish_run
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.expectations import DEFAULT_SCENARIOS, default_expectations_path
from kvconform.harness.select import Selection, shard_from
from kvconform.harness.session import Session, checks_from, vllm_to_load
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.model.results import RunReport, ScenarioResult
from kvconform.model.scenario import Scenario
from kvconform.model.wording import count
from kvconform.oracles.vllm import Vllm

if TYPE_CHECKING:
    from kvconform.harness.vllm_code import CodeTracer


DEFAULT_REPORT_DIR = "build/report"


class RunCommand(Subcommand):
    name = "run"
    help = "run scenarios and write reports"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_selection_options(parser)
        cli.add_vllm_options(parser)
        parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
        parser.add_argument(
            "-x",
            "--exitfirst",
            action="store_true",
            help="stop after the first scenario that fails (as pytest -x)",
        )
        cli.add_expectation_options(parser)
        cli.add_shard_option(parser, "run shard I of N of the selection, by a hash of each scenario id")
        parser.add_argument(
            "--impacted-by",
            metavar="DIFF_OR_REV",
            help="run only the scenarios a vLLM change touches: a unified diff file, or a git "
            "revision range A..B of the vLLM checkout given with --vllm-src; selected are those "
            "whose recorded coverage of vLLM's reservation code executes a changed function, and "
            "those whose coverage is unknown (the coverage map is measured once per vLLM version, "
            "cached, and rebuilt when stale)",
        )
        parser.add_argument(
            "--checks",
            metavar="LIST",
            help=f"comma-separated checks of {', '.join(CHECKS)}; 'default' is "
            f"{','.join(DEFAULT_CHECKS)} (used when omitted), 'all' adds slots, which runs "
            "vLLM's slot-mapping kernel (Triton's interpreter on a machine without CUDA)",
        )
        parser.add_argument(
            "--update-expectations",
            action="store_true",
            help="after the run, rewrite the expectations file for this vLLM version: add entries "
            "for new failures (reason 'TODO: investigate'), narrow entries that conform now",
        )
        parser.add_argument(
            "--record-dir",
            metavar="DIR",
            help="also write each scenario's recording here (NNNN-ID.json: what vLLM did, before "
            "any check judged it), for `kvconform judge`",
        )
        cli.add_verbosity_options(parser)
        cli.add_progress_option(parser)
        cli.add_input_limit_option(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_run(args)


COMMAND = RunCommand()


def cmd_run(args: argparse.Namespace, tracer: CodeTracer | None = None) -> int:
    """``kvconform run``; with a ``tracer``, measured (``kvconform coverage --vllm-code``)."""
    lap = time.perf_counter()
    shard = shard_from(args.shard) if "shard" in vars(args) else None
    verbosity = verbosity_of(args)
    session = Session(run_request(args, checks_from(args.checks), shard))
    selection = session.select()
    if getattr(args, "impacted_by", None) and selection.scenarios:
        impacted(args, selection)
    report = session.new_report(selection)
    report.phases["select"] = time.perf_counter() - lap
    if getattr(args, "impacted_by", None):
        report.notes += [n for n in selection.notes]
    # The input errors are printed once, in the short summary (print_short_summary).
    scenarios = selection.scenarios
    if not scenarios:
        session.run(selection, report)  # concludes without importing vLLM
        for note in report.notes:
            say(note)
        return finish_run(report, args)
    # The first line comes before vLLM's import, which takes seconds.
    picked = count(len(scenarios), "scenario") + (
        f" (shard {shard} of {selection.matched})" if shard is not None else ""
    )
    loading = vllm_to_load(args.vllm_src, args.vllm_release)
    if verbosity > QUIET:
        say(
            f"kvconform {__version__}: {picked} from {', '.join(session.request.scenario_paths)}; "
            f"loading {loading}"
        )
    # Off a terminal the rows (or -v's lines) are the progress, and -q asked for none:
    # a bar on a terminal, else only what --progress lines asks for.
    with open_progress(
        len(scenarios), "scenarios", mode=args.progress, elsewhere="off"
    ) as progress:
        console = Console(verbosity, len(scenarios), progress)

        def loaded(vllm: Vllm) -> None:
            # The estimate of the time left counts from here, not from before the import.
            progress.restart()
            if verbosity > QUIET:
                console.say(
                    f"vLLM {vllm.version} loaded in {report.phases.get('load_vllm', 0.0):.1f} s "
                    f"({vllm.source.describe()})"
                )

        def finished(result: ScenarioResult) -> None:
            console.result(result)
            progress.advance(tally=result.verdict.value)

        def started(scenario: Scenario) -> None:
            if tracer is not None:
                tracer.switch(scenario.id)
            progress.start_item(scenario.id)

        progress.start_item(f"loading {loading}")
        if tracer is not None:
            tracer.start()  # before vLLM's import: its module-level code counts too
        try:
            session.run(selection, report, on_loaded=loaded, on_start=started, on_result=finished)
        finally:
            console.end_row()
            if tracer is not None:
                tracer.stop()
    if tracer is not None and report.vllm_error is None:
        lap = time.perf_counter()
        report.vllm_coverage = tracer.finish(
            report.vllm_version, report.vllm_path, Path(args.report_dir)
        )
        report.phases["vllm_code"] = time.perf_counter() - lap
        if report.vllm_path:  # what --impacted-by selects by, for this vLLM tree
            from kvconform.harness.impact import save_map

            save_map(report.vllm_coverage, selection.scenarios, report.vllm_path)
        from kvconform.reports.markdown import vllm_code_table

        for line in vllm_code_table(report.vllm_coverage):
            say(line)
    if report.vllm_error is not None:
        say(f"ERROR {report.vllm_error}")
        return finish_run(report, args)
    if verbosity > QUIET:
        for line in folded_lines(report.results) if verbosity == NORMAL else []:
            say(line)
        for note in report.notes:
            if note.startswith(("check ", "stopped after")):
                say(note)
    if args.update_expectations and session.expectation_errors:
        path = session.expectations_file()
        say(f"\nexpectations: not rewriting {path}: it does not load (see the error above)")
    elif args.update_expectations:
        try:
            rewrite_expectations(
                report, session.expectations_file(), args.paths, report.vllm_version
            )
        except KvconformError as exc:
            # The run's reports are still worth writing; the exit status says it went wrong.
            say(f"ERROR {exc}")
            report.notes.append(f"--update-expectations failed: {exc}")
            if report.exit_status != ExitStatus.NONCONFORMANCE:  # a failure outranks it
                report.exit_status = ExitStatus.BAD_INPUT
    return finish_run(report, args)


def impacted(args: argparse.Namespace, selection: Selection) -> None:
    """Narrow the selection to the scenarios a vLLM change touches (``--impacted-by``)."""
    from kvconform.harness.impact import plan

    paths = list(args.paths) or [DEFAULT_SCENARIOS]
    impact, change = plan(
        args.impacted_by, selection.scenarios, paths, args.vllm_src, args.vllm_release, say
    )
    total = len(selection.scenarios)
    if impact.why:
        why = f"every scenario: {'; '.join(impact.why[:3])}"
    else:
        shown = ", ".join(sorted(change.functions)[:6]) + (
            ", ..." if len(change.functions) > 6 else ""
        )
        why = (
            f"{impact.touching} execute a changed function ({shown or 'none changed'}), "
            f"{impact.unknown} have no recorded coverage"
        )
    if change.ignored:
        why += f"; ignored (not vLLM's Python code): {', '.join(change.ignored[:5])}"
    line = f"impacted by {args.impacted_by}: {len(impact.selected)} of {total} scenarios ({why})"
    say(line)
    selection.notes.append(line)
    selection.scenarios = impact.selected
    if not impact.selected:
        selection.why_empty = f"the change {args.impacted_by} touches none of the {total} scenarios"


def rewrite_expectations(
    report: RunReport, found: Path | None, paths: Sequence[str], version: str | None
) -> None:
    from kvconform.harness.expectations_update import update_expectations

    version = version or "unknown"
    path = found or default_expectations_path(paths)
    rerun = {r.id: report.rerun_command(r) for r in report.results}
    changes = update_expectations(path, report.results, version, rerun)
    if not changes:
        say(f"\nexpectations: {path} is up to date for vLLM {version}")
        return
    say(f"\nexpectations: rewrote {path} for vLLM {version}:")
    for change in changes:
        say(f"  {change}")
    report.notes.append(
        f"--update-expectations rewrote {path}: "
        + ", ".join(f"{n} {k}" for k, n in Counter(c.kind for c in changes).items())
        + " (verdicts in this report are those of the run, before the rewrite)"
    )
    report.expectations_file = str(path)
