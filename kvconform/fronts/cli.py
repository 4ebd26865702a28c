"""The ``kvconform`` command line (``docs/cli.md``): a thin front over the session.

Each command parses its arguments into a :class:`~kvconform.harness.session.RunRequest`,
lets :class:`~kvconform.harness.session.Session` select, load and run, and prints
what it is told. Exit statuses are :class:`~kvconform.errors.ExitStatus`. Errors
meant for the user (a bad scenario, a vLLM lacking an API, a wrong flag) print one
message and no traceback.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from kvconform import __version__
from kvconform.errors import ExitStatus, KvconformError, UsageError
from kvconform.fronts.console import NORMAL, QUIET, Console, folded_lines
from kvconform.fronts.progress import add_progress_option, open_progress
from kvconform.harness import runner
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.coverage import render_text as render_coverage
from kvconform.harness.expectations import (
    DEFAULT_FILE,
    DEFAULT_SCENARIOS,
    default_expectations_path,
)
from kvconform.harness.loader import load_paths
from kvconform.harness.loader.budget import LIMITS, Limits
from kvconform.harness.select import Selection, Shard, shard_from
from kvconform.harness.session import RunRequest, Session, checks_from, load_vllm, vllm_to_load
from kvconform.model.methods import REGISTRY_FILE as BUILTIN_SOURCE
from kvconform.model.results import RunReport, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.model.wording import count, plural, shorten
from kvconform.oracles.vllm import Vllm

if TYPE_CHECKING:
    from kvconform.harness.vllm_code import CodeTracer

DEFAULT_REPORT_DIR = "build/report"
DEFAULT_FUZZ_DIR = "build/fuzz"
DEFAULT_VLLM_CODE_DIR = "build/vllm-coverage"


# -- shared pieces ---------------------------------------------------------------------


def add_vllm_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--vllm-src",
        metavar="DIR",
        help="run against the vLLM Python tree in DIR (the folder holding vllm/), put ahead "
        "of the installed vLLM, whose compiled parts and dependencies stay",
    )
    group.add_argument(
        "--vllm-release",
        metavar="VER",
        help="like --vllm-src, with the Python tree of PyPI release VER (downloaded once, cached)",
    )


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders")
    parser.add_argument(
        "-k", dest="expression", metavar="EXPR", help="select scenarios like pytest -k"
    )


def add_checks_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--checks`` of ``check`` and ``bisect`` (as ``run``'s)."""
    parser.add_argument(
        "--checks",
        metavar="LIST",
        help=f"comma-separated checks of {', '.join(CHECKS)}; 'default' is "
        f"{','.join(DEFAULT_CHECKS)} (used when omitted), 'all' adds slots, which runs "
        "vLLM's slot-mapping kernel (Triton's interpreter on a machine without CUDA)" + what,
    )


def add_verbosity_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="a line per scenario (verdict, time, the failures' first messages) instead of "
        "a character",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=0,
        help="the summary only: failures with their reruns, the counts, the reports",
    )


def add_expectation_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--expectations",
        metavar="FILE",
        help="known divergences (default: nearest expectations.yaml)",
    )
    group.add_argument(
        "--no-expectations",
        action="store_true",
        help="apply no expectations file: a known divergence counts as nonconformance",
    )


def add_methods_file_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--methods",
        metavar="FILE",
        help="a methods file whose entries join kvconform's method registry (default: the "
        "nearest methods.yaml at or above scenarios/; docs/adding-a-method.md)",
    )


def add_input_limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input-limit",
        action="append",
        default=[],
        metavar="NAME=N",
        help="raise one limit of a scenario document for a deliberate stress scenario "
        f"(repeatable; limits: {', '.join(Limits.names())}; defaults in docs/cli.md)",
    )


def vllm_from_args(args: argparse.Namespace) -> Vllm:
    """The vLLM the flags select (the session's one loader)."""
    return load_vllm(getattr(args, "vllm_src", None), getattr(args, "vllm_release", None))


def add_shard_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help=f"{what} (1-based; default: Buildkite's BUILDKITE_PARALLEL_JOB + 1 of "
        "BUILDKITE_PARALLEL_JOB_COUNT when set, else everything)",
    )


def run_request(
    args: argparse.Namespace, checks: tuple[str, ...], shard: Shard | None = None
) -> RunRequest:
    """The session's request for a command's selection, vLLM and expectation options."""
    return RunRequest(
        shard=shard,
        paths=tuple(args.paths),
        expression=getattr(args, "expression", None),
        checks=checks,
        vllm_src=getattr(args, "vllm_src", None),
        vllm_release=getattr(args, "vllm_release", None),
        expectations=getattr(args, "expectations", None),
        no_expectations=bool(getattr(args, "no_expectations", False)),
        command=shlex.join(["kvconform", *sys.argv[1:]]) if sys.argv else "kvconform run",
        exitfirst=bool(getattr(args, "exitfirst", False)),
        record_dir=getattr(args, "record_dir", None),
    )


def say(text: str = "") -> None:
    print(text, flush=True)


# -- run -------------------------------------------------------------------------------


def verbosity_of(args: argparse.Namespace) -> int:
    """``-v`` / ``-q`` as a number: 1 a line per scenario, 0 a character, -1 the summary."""
    return int(getattr(args, "verbose", 0) or 0) - int(getattr(args, "quiet", 0) or 0)


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


# -- merge -----------------------------------------------------------------------------


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


# -- coverage --------------------------------------------------------------------------


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


# -- check -----------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    """``run`` with git-bisect exit codes: 0 old, 1 new, 125 skip, 128 abort."""
    from kvconform.bisect.outcome import git_code

    args.update_expectations = False
    try:
        status = cmd_run(args)
    except KvconformError as exc:
        say(f"ERROR {exc}")
        status = exc.exit_status
    code = git_code(status, args.find_fix)
    say(
        f"check: exit {code} for git bisect (run status {status}{', --find-fix' if args.find_fix else ''})"
    )
    return code


# -- bisect ----------------------------------------------------------------------------


def cmd_bisect(args: argparse.Namespace) -> int:
    from kvconform.bisect import command

    return command.bisect(args)


# -- matrix ----------------------------------------------------------------------------


def cmd_matrix(args: argparse.Namespace) -> int:
    from kvconform.matrix.command import matrix

    return int(matrix(args, say))


# -- methods ---------------------------------------------------------------------------


def use_methods_file(args: argparse.Namespace) -> Path | None:
    """The methods file of ``methods`` and ``doctor`` (``--methods FILE``, else the
    nearest methods.yaml above scenarios/), its entries added to the registry."""
    from kvconform.harness.methods_file import use_methods_for

    explicit = getattr(args, "methods", None)
    if explicit is not None and not Path(explicit).is_file():
        raise UsageError(f"--methods: no such file: {explicit}")
    path, error = use_methods_for([DEFAULT_SCENARIOS], explicit)
    if error is not None:
        raise error
    return path


def aligned(
    header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: tuple[int, ...] = ()
) -> list[str]:
    """A plain-text table: each column as wide as its longest cell (the header's included),
    two spaces between columns, the columns in ``right`` aligned right, the last left ragged."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in (header, *rows):
        cells = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        cells[-1] = row[-1]
        lines.append("  ".join(cells).rstrip())
    return lines


def cmd_methods(args: argparse.Namespace) -> int:
    from kvconform.model.methods import METHODS, how_to_add, method_for

    methods_file = use_methods_file(args)
    vllm = vllm_from_args(args)
    k = args.k
    aliases = vllm.method_aliases()
    say(f"Speculative methods declared by vLLM {vllm.version} (lookahead for k={k}):")
    if methods_file is not None:
        say(f"(kvconform's registry plus the methods file {methods_file})")
    rows: list[tuple[str, ...]] = []
    status_code = ExitStatus.CONFORM
    missing: list[str] = []
    for method in vllm.declared_methods():
        canonical = aliases.get(method, method)
        theirs = vllm.lookahead(canonical, k)
        entry = method_for(canonical)
        ours = None if entry is None else entry.lookahead(k, True)
        if entry is None:
            status, status_code = "NO ENTRY", ExitStatus.NONCONFORMANCE
            if canonical not in missing:
                missing.append(canonical)
        elif theirs is None:
            status = "vLLM: n/a"
        elif theirs != ours:
            status, status_code = "MISMATCH", ExitStatus.NONCONFORMANCE
        else:
            status = "ok"
        shown = method if canonical == method else f"{method} (= {canonical})"
        formula = "? (no entry)"
        if entry is not None:
            formula = entry.rule.formula + (
                f"  [{entry.source}]" if entry.source != BUILTIN_SOURCE else ""
            )
        rows.append(
            (shown, "-" if theirs is None else str(theirs), "-" if ours is None else str(ours),
             status, formula)
        )  # fmt: skip
    for line in aligned(("method", "vLLM", "kvconform", "status", "rule"), rows, right=(1, 2)):
        say(line)
    declared = {aliases.get(m, m) for m in vllm.declared_methods()}
    for name, entry in METHODS.items():
        if entry.source != BUILTIN_SOURCE and name not in declared:
            say(f"note: {name} [{entry.source}] is not a method vLLM {vllm.version} declares")
    for name in missing:
        say("")
        for line in how_to_add(name, str(methods_file) if methods_file else None):
            say(line)
    return status_code


# -- explain ---------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from kvconform.fronts.explain import explain, find_targets, to_draw

    # The first line comes at once: finding the scenario and vLLM's import take seconds.
    say(
        f"kvconform {__version__}: explaining {args.scenario}; loading "
        f"{vllm_to_load(args.vllm_src, args.vllm_release)}"
    )
    targets = find_targets(args.scenario)
    for err in targets.errors:
        say(f"ERROR {err}")
    if not targets.scenarios:
        return ExitStatus.BAD_INPUT if targets.errors else ExitStatus.NO_SELECTION
    session = Session(run_request(argparse.Namespace(**vars(args), paths=()), DEFAULT_CHECKS))
    results = [session.run_scenario(scenario) for scenario in targets.scenarios]
    drawn = to_draw(targets, results)
    if len(results) > 1:
        say(
            f"{count(len(results), 'scenario')}: "
            + ", ".join(f"{r.id} {r.verdict.value}" for r in results)
        )
        if not drawn:
            say(
                "none of them fails; name one to see its steps: kvconform explain "
                f"{shlex.quote(results[0].file + '::' + results[0].id)}"
            )
    for index in drawn:
        say("")
        say(explain(targets.scenarios[index], results[index], session.vllm.version))
    return runner.exit_status(results, len(targets.errors))


# -- engine record ---------------------------------------------------------------------


def cmd_engine_record(args: argparse.Namespace) -> int:
    from kvconform.harness.engine_record import record
    from kvconform.oracles.engine import EngineRecording

    loaded = load_paths([args.scenario])
    if loaded.errors:
        for err in loaded.errors:
            say(f"ERROR {err}")
        return 2
    chosen = [s for s in loaded.scenarios if args.scenario_id in (None, s.id)]
    if len(chosen) != 1 or chosen[0].kind != "engine":
        ids = ", ".join(s.id for s in loaded.scenarios)
        raise UsageError(
            f"{args.scenario} must hold one engine scenario (-k ID picks one of: {ids})"
        )
    recording = None
    if args.recording is not None:
        recording = EngineRecording.from_json(args.recording.read_text())
    phases = ["serving"] + (["warmup"] if args.warmup_out else [])
    written = record(chosen[0], recording, phases)
    for phase, out in (("serving", args.out), ("warmup", args.warmup_out)):
        if phase in written:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(written[phase])
            say(f"wrote {out}: the {phase} steps of {chosen[0].id} as a trajectory scenario")
    return 0


# -- export ----------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from kvconform.harness.select import split_node
    from kvconform.reports.vllm_test import render_vllm_test, test_name

    if not args.vllm_test:
        raise UsageError("export: say what to export (--vllm-test)")
    target = args.scenario
    file, scenario_id = split_node(target)
    paths = [file] if Path(file).exists() else [DEFAULT_SCENARIOS]
    loaded = load_paths(paths)
    for err in loaded.errors:
        say(f"ERROR {err}")
    wanted = scenario_id or (None if Path(file).exists() else target)
    chosen = [s for s in loaded.scenarios if wanted in (None, s.id)]
    if len(chosen) != 1:
        raise UsageError(
            f"export: {target!r} names {len(chosen)} scenarios; name one "
            f"(FILE::ID, or an id under {DEFAULT_SCENARIOS}/)"
        )
    (scenario,) = chosen
    # No expectations: the export reproduces what vLLM does, listed or not.
    request = run_request(argparse.Namespace(**vars(args), paths=()), DEFAULT_CHECKS)
    session = Session(RunRequest(**{**vars(request), "no_expectations": True}))
    result = session.run_scenario(scenario)
    test = render_vllm_test(scenario, result, session.vllm)
    out = Path(args.out or f"{test_name(scenario)}.py")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(test.source, encoding="utf-8")
    say(
        f"{scenario.id}: {result.verdict.value} against vLLM {session.vllm.version}; wrote {out} "
        f"({test.shape}: it belongs in {test.folder}/ of that release's test tree)"
    )
    return ExitStatus.CONFORM


# -- doctor ----------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from kvconform.fronts.doctor import doctor

    methods_file = use_methods_file(args)
    return doctor(vllm_from_args(args), say, methods_file)


# -- fuzz ------------------------------------------------------------------------------


def cmd_fuzz(args: argparse.Namespace) -> int:
    from kvconform.fuzz.command import fuzz

    return fuzz(args, say, open_progress)


# -- main ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvconform",
        description="Differential testing of vLLM's KV-cache block reservation.",
    )
    parser.add_argument("--version", action="version", version=f"kvconform {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run scenarios and write reports")
    add_selection_options(run)
    add_vllm_options(run)
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    run.add_argument(
        "-x",
        "--exitfirst",
        action="store_true",
        help="stop after the first scenario that fails (as pytest -x)",
    )
    add_expectation_options(run)
    add_shard_option(run, "run shard I of N of the selection, by a hash of each scenario id")
    run.add_argument(
        "--impacted-by",
        metavar="DIFF_OR_REV",
        help="run only the scenarios a vLLM change touches: a unified diff file, or a git "
        "revision range A..B of the vLLM checkout given with --vllm-src; selected are those "
        "whose recorded coverage of vLLM's reservation code executes a changed function, and "
        "those whose coverage is unknown (the coverage map is measured once per vLLM version, "
        "cached, and rebuilt when stale)",
    )
    run.add_argument(
        "--checks",
        metavar="LIST",
        help=f"comma-separated checks of {', '.join(CHECKS)}; 'default' is "
        f"{','.join(DEFAULT_CHECKS)} (used when omitted), 'all' adds slots, which runs "
        "vLLM's slot-mapping kernel (Triton's interpreter on a machine without CUDA)",
    )
    run.add_argument(
        "--update-expectations",
        action="store_true",
        help="after the run, rewrite the expectations file for this vLLM version: add entries "
        "for new failures (reason 'TODO: investigate'), narrow entries that conform now",
    )
    run.add_argument(
        "--record-dir",
        metavar="DIR",
        help="also write each scenario's recording here (NNNN-ID.json: what vLLM did, before "
        "any check judged it), for `kvconform judge`",
    )
    add_verbosity_options(run)
    add_progress_option(run)
    add_input_limit_option(run)
    run.set_defaults(handler=cmd_run)

    judge = sub.add_parser(
        "judge",
        help="judge the recordings of `run --record-dir` again, without vLLM",
        description="Read recordings (files, or folders of NNNN-ID.json written by `kvconform "
        "run --record-dir`), judge them with the current checks and write the same reports "
        "as run; vLLM is never imported, so a run recorded on a GPU host is judged anywhere.",
    )
    judge.add_argument("paths", nargs="+", metavar="PATH", help="a recording or a folder of them")
    judge.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    judge.add_argument(
        "--checks",
        metavar="LIST",
        help="the checks to judge with, as for run (default: those the run selected)",
    )
    add_expectation_options(judge)
    add_verbosity_options(judge)
    judge.set_defaults(handler=cmd_judge)

    merge = sub.add_parser(
        "merge",
        help="join the report directories of `run --shard` jobs into one set of reports",
        description="Read each DIR/report.json (one per shard), write one report.json, "
        "junit.xml, summary.md and report.html, and exit with the status of the whole "
        "selection. A missing or repeated shard, or shards run against different vLLM "
        "versions or checks, exits 2.",
    )
    merge.add_argument("dirs", nargs="+", metavar="DIR", help="a shard's --report-dir")
    merge.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    merge.set_defaults(handler=cmd_merge)

    coverage = sub.add_parser(
        "coverage",
        help="which group types x methods x step kinds the scenarios exercise, and what vLLM "
        "offers that none covers",
    )
    add_selection_options(coverage)
    add_vllm_options(coverage)
    coverage.add_argument("--json", metavar="FILE", help="also write the coverage as JSON")
    coverage.add_argument(
        "--vllm-code",
        action="store_true",
        help="instead: run the scenarios (as `run` does, every check unless --checks says "
        "otherwise) under coverage.py and report which lines and branches of vLLM's "
        "reservation code they execute, per file, function and scenario (report.json's "
        "vllm_coverage, summary.md, report.html with each source's unexecuted lines marked)",
    )
    coverage.add_argument(
        "--vllm-files",
        action="append",
        metavar="GLOB[::FUNC,...]",
        help="with --vllm-code: the code that counts, a glob inside the folder holding vllm/ "
        "(repeat it; default: vllm/v1/core/*.py, vllm/v1/core/sched/*.py, "
        "vllm/v1/worker/gpu/warmup.py, vllm/v1/worker/gpu/block_table.py and the lookahead "
        "properties of vllm/config/vllm.py)",
    )
    coverage.add_argument(
        "--checks", metavar="LIST", help="with --vllm-code: the checks to run (default all)"
    )
    coverage.add_argument(
        "--report-dir",
        metavar="DIR",
        help=f"with --vllm-code: where the reports go (default {DEFAULT_VLLM_CODE_DIR})",
    )
    add_expectation_options(coverage)
    add_progress_option(coverage)
    coverage.set_defaults(handler=cmd_coverage)

    check = sub.add_parser(
        "check",
        help="run scenarios and exit like a `git bisect run` script (0 good, 1 bad, 125 skip)",
        description="Run the selected scenarios against one vLLM and exit with git bisect's "
        "codes: 0 conform, 1 nonconformance (whatever input errors came with it), 125 vLLM "
        "could not be exercised (skip), 128 bad input with nothing failed, or usage (aborts "
        "git bisect). With --find-fix, 0 and 1 swap. Usable as "
        "`git bisect run kvconform check --vllm-src . /abs/path/scenarios/...`. Known "
        "divergences in the nearest expectations.yaml count as conforming, as in `run`.",
    )
    add_selection_options(check)
    add_vllm_options(check)
    check.add_argument(
        "--find-fix", action="store_true", help="exit 0 on nonconformance and 1 on conformance"
    )
    check.add_argument("--report-dir", metavar="DIR", help="write reports here (default: none)")
    add_checks_option(check)
    add_expectation_options(check)
    add_verbosity_options(check)
    add_progress_option(check)
    add_input_limit_option(check)
    check.set_defaults(handler=cmd_check)

    bisect = sub.add_parser(
        "bisect",
        help="find the release or commit where conformance changed",
        description="Bisect over PyPI releases (--releases A..B) or over the commits of a "
        "vLLM git checkout (--repo DIR --good REV --bad REV). See docs/bisect.md.",
    )
    add_selection_options(bisect)
    target = bisect.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--releases", metavar="A..B", help="bisect the PyPI releases of vllm from A to B"
    )
    target.add_argument("--repo", metavar="DIR", help="bisect the commits of a vLLM checkout")
    bisect.add_argument("--good", metavar="REV", help="with --repo: a commit that conforms")
    bisect.add_argument("--bad", metavar="REV", help="with --repo: a commit that does not")
    bisect.add_argument(
        "--find-fix",
        action="store_true",
        help="look for the first conforming release or commit after nonconforming ones",
    )
    bisect.add_argument("--pre", action="store_true", help="with --releases: include pre-releases")
    bisect.add_argument(
        "--fresh",
        action="store_true",
        help="forget a saved bisection and cached probe results; list releases anew",
    )
    add_checks_option(bisect, "; every probe runs them (as the nightly that saw the failure did)")
    add_expectation_options(bisect)
    bisect.set_defaults(handler=cmd_bisect)

    from kvconform.matrix.command import add_matrix_options

    matrix = sub.add_parser(
        "matrix",
        help="run the corpus against every release from A to B; one matrix report",
        description="Run `kvconform run --checks all --vllm-release V` for each PyPI release "
        "V from A to B, each in its own process, and write matrix.json, matrix.md and "
        "matrix.html: verdict counts per release, the scenarios whose verdict changed between "
        "neighbouring releases, links to each run's report. Exits non-zero when a release at "
        "or above the minimum supported one errors or fails unexpectedly. See docs/releases.md.",
    )
    add_selection_options(matrix)
    add_expectation_options(matrix)
    add_matrix_options(matrix)
    matrix.set_defaults(handler=cmd_matrix)

    methods = sub.add_parser("methods", help="list vLLM's speculative methods and their lookahead")
    methods.add_argument(
        "-k", type=int, default=3, help="num_speculative_tokens to evaluate (default 3)"
    )
    add_methods_file_option(methods)
    add_vllm_options(methods)
    methods.set_defaults(handler=cmd_methods)

    explain = sub.add_parser(
        "explain", help="run one scenario and show every step, request and group"
    )
    explain.add_argument(
        "scenario",
        help="FILE::ID (as every rerun prints it), a scenario file (of a matrix file, the "
        "variants that do not pass), or a scenario id or name under scenarios/",
    )
    add_vllm_options(explain)
    explain.set_defaults(handler=cmd_explain)

    export = sub.add_parser(
        "export",
        help="write a scenario's finding as a self-contained pytest file for vLLM's tests",
        description="Run one scenario and write what it found (a lookahead short of the "
        "drafter's, a disagreement of the warmup with the allocator, a floor shortfall, a "
        "crash) as a pytest module for the release's own test tree (tests/v1/core or "
        "tests/v1/worker, using their helpers), failing while the finding holds.",
    )
    export.add_argument("scenario", help="FILE::ID, a one-scenario file, or an id under scenarios/")
    export.add_argument(
        "--vllm-test", action="store_true", help="a pytest module for vLLM's own test suite"
    )
    export.add_argument("--out", metavar="FILE", help="where to write it (default: test_<id>.py)")
    add_vllm_options(export)
    export.set_defaults(handler=cmd_export)

    doctor = sub.add_parser(
        "doctor", help="what the installed vLLM offers and what kvconform can exercise"
    )
    add_methods_file_option(doctor)
    add_vllm_options(doctor)
    doctor.set_defaults(handler=cmd_doctor)

    engine_mode = sub.add_parser(
        "engine", help="engine mode: vLLM's real engine (docs/engine-mode.md)"
    )
    engine_sub = engine_mode.add_subparsers(dest="engine_command", required=True)
    record = engine_sub.add_parser(
        "record",
        help="write an engine run's steps as a kind: trajectory scenario (record -> replay)",
    )
    record.add_argument("scenario", help="an engine scenario file")
    record.add_argument("-k", dest="scenario_id", help="which scenario of a matrix file (its id)")
    record.add_argument("--out", required=True, type=Path, help="the trajectory scenario to write")
    record.add_argument("--from", dest="recording", type=Path,
                        help="a recording an earlier run kept (KVCONFORM_ENGINE_RECORDINGS) "
                        "instead of running the engine")  # fmt: skip
    record.add_argument("--warmup-out", type=Path,
                        help="also write the warmup's steps as a trajectory scenario")  # fmt: skip
    record.set_defaults(handler=cmd_engine_record)

    from kvconform.fuzz import DEFAULT_EXAMPLES, DEFAULT_MAX_FINDINGS, NIGHTLY_EXAMPLES

    fuzz = sub.add_parser(
        "fuzz", help="search generated trajectories for divergences, shrunk to YAML reproducers"
    )
    fuzz.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"scenarios to generate (default {DEFAULT_EXAMPLES}; the nightly job runs "
        f"{NIGHTLY_EXAMPLES})",
    )
    fuzz.add_argument(
        "--seed", type=int, default=0, metavar="S", help="the same seed repeats the run (default 0)"
    )
    fuzz.add_argument(
        "--out",
        default=DEFAULT_FUZZ_DIR,
        metavar="DIR",
        help=f"where reproducers go (default {DEFAULT_FUZZ_DIR})",
    )
    fuzz.add_argument(
        "--max-findings",
        type=int,
        default=DEFAULT_MAX_FINDINGS,
        metavar="N",
        help=f"stop after N distinct findings (default {DEFAULT_MAX_FINDINGS})",
    )
    fuzz.add_argument(
        "--expectations",
        metavar="FILE",
        help="known divergences; group types whose probe diverges as listed are not drawn "
        f"(default: {DEFAULT_SCENARIOS}/{DEFAULT_FILE})",
    )
    add_shard_option(fuzz, "run shard I of N: 1/N of the examples, with a seed of its own")
    add_vllm_options(fuzz)
    add_progress_option(fuzz)
    fuzz.set_defaults(handler=cmd_fuzz)

    from kvconform.explore.command import add_arguments as add_explore_arguments
    from kvconform.explore.command import explore
    from kvconform.mutate.command import add_arguments as add_mutate_arguments
    from kvconform.mutate.command import mutate
    from kvconform.realbugs.command import add_arguments as add_realbugs_arguments
    from kvconform.realbugs.command import realbugs

    explore_parser = sub.add_parser(
        "explore", help="search generated scheduler workloads, shrunk to YAML scheduler scenarios"
    )
    add_explore_arguments(explore_parser)
    add_vllm_options(explore_parser)
    explore_parser.set_defaults(handler=lambda args: explore(args, say, open_progress))

    realbugs_parser = sub.add_parser(
        "realbugs",
        help="replay real vLLM bugs (realbugs/catalogue.yaml) through the corpus: detected or missed",
    )
    add_realbugs_arguments(realbugs_parser)
    realbugs_parser.set_defaults(handler=lambda args: realbugs(args, say))

    mutate_parser = sub.add_parser(
        "mutate",
        help="mutation campaign: how many mutants of vLLM's reservation code the suite kills",
    )
    add_mutate_arguments(mutate_parser)
    add_vllm_options(mutate_parser)
    add_progress_option(mutate_parser)
    mutate_parser.set_defaults(handler=lambda args: mutate(args, open_progress))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2 already
        code = int(exc.code or 0)
        words = list(sys.argv[1:] if argv is None else argv)
        if code == 2 and words[:1] == ["check"]:
            # Under `git bisect run`, 2 would mark the commit bad: abort instead.
            from kvconform.bisect.outcome import ABORT_CODE

            return ABORT_CODE
        return code
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    token = None
    try:
        if getattr(args, "input_limit", None):
            token = LIMITS.set(Limits().raised(args.input_limit))
        return int(args.handler(args))
    except KvconformError as exc:
        say(f"ERROR {exc}")
        if args.command == "check":
            from kvconform.bisect.outcome import git_code

            return git_code(exc.exit_status, getattr(args, "find_fix", False))
        return exc.exit_status
    except KeyboardInterrupt:
        say("interrupted")
        return ExitStatus.INTERRUPTED
    finally:
        if token is not None:
            LIMITS.reset(token)


def console_main() -> NoReturn:
    """The ``kvconform`` command: :func:`main`, then leave without tearing vLLM down.

    Once vLLM and torch are imported, the interpreter's own shutdown (freeing
    their modules and objects) took 5-20 s on the 2-core machine, longer than
    the whole default corpus (docs/benchmarks.md). By then the command has
    nothing left to do: every report is written and closed. So it runs the
    ``atexit`` handlers (logging's flush among them), flushes its streams and
    ends the process with ``os._exit``. In-process callers (tests, bisection)
    call :func:`main` and keep the ordinary shutdown.
    """
    status = main()
    if "torch" not in sys.modules:  # nothing heavy was imported: leave the ordinary way
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe has nothing more to say
            pass
    os._exit(status)


if __name__ == "__main__":
    console_main()
