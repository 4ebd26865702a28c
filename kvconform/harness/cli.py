"""The ``kvconform`` command line (DESIGN.md §6): a thin front over the engine.

Exit status: 0 conform; 1 nonconformance; 2 bad input or usage; 3 vLLM could
not be exercised. Errors meant for the user (a bad scenario, a vLLM lacking an
API, a wrong flag) print one message and no traceback.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from kvconform import __version__
from kvconform.errors import KvconformError, ScenarioError, UsageError, VllmUnavailable
from kvconform.harness import engine
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS, parse_checks
from kvconform.harness.coverage import Coverage, compute_coverage, offered_by, pair_results
from kvconform.harness.coverage import render_text as render_coverage
from kvconform.harness.expectations import DEFAULT_FILE, Expectation, load_expectations
from kvconform.harness.loader import load_paths
from kvconform.harness.progress import add_progress_option, open_progress
from kvconform.harness.results import RunReport, ScenarioResult, Verdict
from kvconform.harness.scenario import Scenario
from kvconform.harness.select import compile_expression
from kvconform.oracles import vllm_compat
from kvconform.oracles.vllm_compat import Vllm

DEFAULT_SCENARIOS = "scenarios"
DEFAULT_REPORT_DIR = "build/report"
DEFAULT_FUZZ_DIR = "build/fuzz"


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


def load_vllm(args: argparse.Namespace, checks: Sequence[str] = ()) -> Vllm:
    """The vLLM the flags select; prepared for the slot-mapping kernel if ``slots`` runs."""
    slot_kernel = "slots" in checks
    release = getattr(args, "vllm_release", None)
    if release:
        from kvconform.harness.releases import release_tree

        return vllm_compat.load(src=release_tree(release), release=release, slot_kernel=slot_kernel)
    return vllm_compat.load(src=getattr(args, "vllm_src", None), slot_kernel=slot_kernel)


def selected_checks(text: str | None) -> tuple[str, ...]:
    try:
        return parse_checks(text)
    except ValueError as exc:
        raise UsageError(f"--checks: {exc}") from None


def skipped_notes(results: Sequence[ScenarioResult]) -> list[str]:
    """One line per check and reason it was skipped for: skipped, never passed."""
    counts: dict[tuple[str, str], int] = {}
    for result in results:
        for name, why in result.skipped_checks.items():
            counts[(name, why)] = counts.get((name, why), 0) + 1
    return [
        f"check {name} SKIPPED in {n} scenario{'s' if n > 1 else ''}: {why}"
        for (name, why), n in counts.items()
    ]


def select_scenarios(args: argparse.Namespace) -> tuple[list[Scenario], list[ScenarioError]]:
    paths = args.paths or [DEFAULT_SCENARIOS]
    for path in paths:
        if not Path(path).exists():
            raise UsageError(f"no such file or folder: {path}")
    loaded = load_paths(paths)
    scenarios = loaded.scenarios
    if args.expression:
        matches = compile_expression(args.expression)
        scenarios = [s for s in scenarios if matches(s)]
    return scenarios, loaded.errors


def find_expectations(paths: Sequence[str]) -> Path | None:
    """The nearest expectations.yaml at or above the first scenario path."""
    start = Path(paths[0] if paths else DEFAULT_SCENARIOS).resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = folder / DEFAULT_FILE
        if candidate.exists():
            return candidate
        if (folder / ".git").exists():
            break
    return None


def say(text: str = "") -> None:
    print(text, flush=True)


# -- run -------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    started = time.time()
    # Where the run's time went (report.json "phases_s"): vLLM's import usually dominates.
    phases: dict[str, float] = {}
    lap = time.perf_counter()
    scenarios, input_errors = select_scenarios(args)
    for err in input_errors:
        say(f"ERROR {err}")
    checks = selected_checks(args.checks)
    expectations: list[Expectation] = []
    exp_path = Path(args.expectations) if args.expectations else find_expectations(args.paths)
    expectations_load = True
    if getattr(args, "no_expectations", False):  # `check --no-expectations`
        exp_path = None
    if exp_path is not None:
        try:
            expectations = load_expectations(exp_path)
        except ScenarioError as err:
            input_errors.append(err)
            say(f"ERROR {err}")
            expectations_load = False
    report = RunReport(
        results=[],
        input_errors=input_errors,
        vllm_version=None,
        vllm_source=None,
        vllm_path=None,
        started=started,
        command=shlex.join(["kvconform", *sys.argv[1:]]) if sys.argv else "kvconform run",
        checks=checks,
        expectations_file=str(exp_path) if exp_path is not None else None,
        phases=phases,
    )
    phases["select"], lap = time.perf_counter() - lap, time.perf_counter()
    try:
        vllm = load_vllm(args, checks)
    except VllmUnavailable as exc:
        say(f"ERROR {exc}")
        report.vllm_error = str(exc)
        report.vllm_version = exc.version
        report.exit_status = 2 if input_errors else exc.exit_status
        return finish_run(report, args)
    report.vllm_version = vllm.version
    report.vllm_source = vllm.source.kind
    report.vllm_path = vllm.location
    report.vllm_release = vllm.source.release
    report.torch_version, report.device = vllm.runtime()
    phases["load_vllm"], lap = time.perf_counter() - lap, time.perf_counter()
    say(
        f"kvconform {__version__}: {len(scenarios)} scenarios against vLLM {vllm.version} "
        f"({vllm.source.describe()})"
    )
    with open_progress(len(scenarios), "scenarios", mode=args.progress) as progress:
        for scenario in scenarios:
            progress.start_item(scenario.id)
            result = engine.run_scenario(scenario, vllm, checks, expectations)
            report.results.append(result)
            print_result(result, progress.echo)
            progress.advance(tally=result.verdict.value)
    phases["scenarios"], lap = time.perf_counter() - lap, time.perf_counter()
    report.coverage = run_coverage(scenarios, report.results, vllm, report.notes)
    phases["coverage"] = time.perf_counter() - lap
    if report.device == "cpu" and any(r.kind == "warmup" for r in report.results):
        from kvconform.oracles.warmup import CPU_RUN_NOTE

        report.notes.append(CPU_RUN_NOTE)
    for note in skipped_notes(report.results):
        say(note)
        report.notes.append(note)
    report.exit_status = engine.exit_status(report.results, len(input_errors))
    if args.update_expectations and not expectations_load:
        say(f"\nexpectations: not rewriting {exp_path}: it does not load (see the error above)")
    elif args.update_expectations:
        try:
            rewrite_expectations(report, exp_path, args.paths, vllm.version)
        except KvconformError as exc:
            # The run's reports are still worth writing; the exit status says it went wrong.
            say(f"ERROR {exc}")
            report.notes.append(f"--update-expectations failed: {exc}")
            report.exit_status = 2
    return finish_run(report, args)


def run_coverage(
    scenarios: list[Scenario], results: list[ScenarioResult], vllm: Vllm, notes: list[str]
) -> Coverage:
    try:
        offered = offered_by(vllm)
    except VllmUnavailable as exc:
        offered = None
        notes.append(f"coverage of what vLLM offers is missing: {exc}")
    return compute_coverage(pair_results(scenarios, results), offered)


def rewrite_expectations(
    report: RunReport, found: Path | None, paths: Sequence[str], version: str
) -> None:
    from kvconform.harness.expectations_update import update_expectations
    from kvconform.reports.common import rerun_command

    path = found or default_expectations_path(paths)
    rerun = {r.id: rerun_command(r, report) for r in report.results}
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


def default_expectations_path(paths: Sequence[str]) -> Path:
    """Where a new expectations file goes: beside the scenario tree that was run."""
    first = Path(paths[0] if paths else DEFAULT_SCENARIOS).resolve()
    folder = first if first.is_dir() else first.parent
    for candidate in [folder, *folder.parents]:
        if candidate.name == DEFAULT_SCENARIOS:
            return candidate / DEFAULT_FILE
        if (candidate / ".git").exists():
            break
    return folder / DEFAULT_FILE


def print_result(result: ScenarioResult, out: Callable[[str], None] = say) -> None:
    skipped = "".join(f"; {name} skipped" for name in result.skipped_checks)
    out(f"{result.verdict.value.upper():8} {result.id}  ({result.duration * 1000:.0f} ms{skipped})")
    if result.verdict in (Verdict.FAILED, Verdict.ERROR):
        for line in ([result.error] if result.error else []) + [
            f"[{f.check}] {f.message}" for f in result.failures[:3]
        ]:
            out(f"         {line}")
        if len(result.failures) > 3:
            out(f"         ... {len(result.failures) - 3} more failures in report.json")
    elif result.verdict is Verdict.XPASSED:
        out(
            f"         listed as a known divergence ({result.expectation}) but conforms now: "
            "narrow the entry (kvconform run --update-expectations)"
        )
    elif result.expectation:
        out(f"         known divergence: {result.expectation}")


def finish_run(report: RunReport, args: argparse.Namespace) -> int:
    from kvconform.reports import write_reports

    report.duration = time.time() - report.started
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items() if v)
    say(f"\n{counts or 'nothing ran'} in {report.duration:.1f} s; exit {report.exit_status}")
    xpassed = [r.id for r in report.results if r.verdict is Verdict.XPASSED]
    if xpassed:
        say(
            f"XPASSED: {len(xpassed)} known divergence(s) conform now ({', '.join(xpassed[:5])}"
            + (", ..." if len(xpassed) > 5 else "")
            + "); their expectations entries are stale for this vLLM"
        )
    if args.report_dir:  # `check` writes reports only when asked to
        written = write_reports(report, args.report_dir)
        say("reports: " + ", ".join(str(p) for p in written))
    return report.exit_status


# -- coverage --------------------------------------------------------------------------


def cmd_coverage(args: argparse.Namespace) -> int:
    scenarios, input_errors = select_scenarios(args)
    for err in input_errors:
        say(f"ERROR {err}")
    vllm = load_vllm(args)
    results = []
    # Coverage needs the trajectories, not the verdicts: the checks are skipped.
    with open_progress(len(scenarios), "scenarios", mode=args.progress) as progress:
        for scenario in scenarios:
            progress.start_item(scenario.id)
            results.append(engine.run_scenario(scenario, vllm, checks=()))
            progress.advance(tally="error" if results[-1].error else "ok")
    notes: list[str] = []
    coverage = run_coverage(scenarios, results, vllm, notes)
    for note in notes:
        say(f"note: {note}")
    say(render_coverage(coverage))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(coverage.to_json(), indent=1) + "\n")
        say(f"coverage: {args.json}")
    return 2 if input_errors else 0


# -- check -----------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    """``run`` with git-bisect exit codes: 0 old, 1 new, 125 skip, 128 abort."""
    from kvconform.harness.bisect.outcome import git_code

    args.checks = None
    args.update_expectations = False
    try:
        status = cmd_run(args)
    except KvconformError as exc:
        say(f"ERROR {exc}")
        status = int(getattr(exc, "exit_status", 2))
    code = git_code(status, args.find_fix)
    say(
        f"check: exit {code} for git bisect (run status {status}{', --find-fix' if args.find_fix else ''})"
    )
    return code


# -- bisect ----------------------------------------------------------------------------


def cmd_bisect(args: argparse.Namespace) -> int:
    from kvconform.harness.bisect import command

    return command.bisect(args)


# -- methods ---------------------------------------------------------------------------


def cmd_methods(args: argparse.Namespace) -> int:
    from kvconform.oracles.lookahead import rule_for

    vllm = load_vllm(args)
    k = args.k
    aliases = vllm.method_aliases()
    say(f"Speculative methods declared by vLLM {vllm.version} (lookahead for k={k}):")
    say(f"{'method':26} {'vLLM':>5} {'kvconform':>9}  {'status':12} rule")
    status_code = 0
    for method in vllm.declared_methods():
        canonical = aliases.get(method, method)
        theirs = vllm.lookahead(canonical, k)
        rule = rule_for(canonical)
        ours = None if rule is None else rule.lookahead(k, True)
        if rule is None:
            status, status_code = "NOT IN TABLE", 1
        elif theirs is None:
            status = "vLLM: n/a"
        elif theirs != ours:
            status, status_code = "MISMATCH", 1
        else:
            status = "ok"
        shown = method if canonical == method else f"{method} (= {canonical})"
        formula = rule.formula if rule else "?"
        say(
            f"{shown:26} {'-' if theirs is None else theirs:>5} {'-' if ours is None else ours:>9}  "
            f"{status:12} {formula}"
        )
    return status_code


# -- explain ---------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    from kvconform.harness.explain import explain

    target = args.scenario
    paths = [target] if Path(target).exists() else [DEFAULT_SCENARIOS]
    loaded = load_paths(paths)
    if loaded.errors and Path(target).exists():
        for err in loaded.errors:
            say(f"ERROR {err}")
        return 2
    chosen = [s for s in loaded.scenarios if Path(target).exists() or s.id == target]
    if not chosen:
        chosen = [s for s in loaded.scenarios if s.name == target]
    if not chosen:
        raise UsageError(
            f"no scenario {target!r} (give a file, or an id from {DEFAULT_SCENARIOS}/)"
        )
    vllm = load_vllm(args)
    expectations = []
    found = find_expectations([str(Path(chosen[0].file))])
    if found is not None:
        expectations = load_expectations(found)
    worst = 0
    for scenario in chosen:
        result = engine.run_scenario(scenario, vllm, expectations=expectations)
        say(explain(scenario, result, vllm.version))
        worst = max(worst, engine.exit_status([result]))
    return worst


# -- doctor ----------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from kvconform.harness.doctor import doctor

    return doctor(load_vllm(args), say)


# -- fuzz ------------------------------------------------------------------------------


def cmd_fuzz(args: argparse.Namespace) -> int:
    try:
        from kvconform.harness.fuzz.findings import first_message
        from kvconform.harness.fuzz.runner import run_fuzz
    except ImportError as exc:
        if exc.name != "hypothesis":
            raise
        raise UsageError("kvconform fuzz needs Hypothesis: pip install 'kvconform[fuzz]'") from None

    if args.examples < 1:
        raise UsageError("--examples must be at least 1")
    if args.max_findings < 1:
        raise UsageError("--max-findings must be at least 1")
    exp_path = Path(args.expectations) if args.expectations else find_expectations([])
    expectations = load_expectations(exp_path) if exp_path is not None else []
    vllm = load_vllm(args)
    command = ["kvconform", "fuzz", "--examples", str(args.examples), "--seed", str(args.seed)]
    command += ["--out", args.out]
    if args.vllm_src:
        command += ["--vllm-src", args.vllm_src]
    if getattr(args, "vllm_release", None):
        command += ["--vllm-release", args.vllm_release]
    say(
        f"kvconform {__version__}: fuzzing vLLM {vllm.version} ({vllm.source.describe()}) "
        f"with {args.examples} examples, seed {args.seed}"
    )
    # A line every 5% of the budget (or 10 s) in a CI log; a bar on a terminal.
    every = max(25, args.examples // 20)
    with open_progress(args.examples, "examples", mode=args.progress, every_items=every) as bar:
        stats = run_fuzz(
            vllm,
            args.examples,
            args.seed,
            args.out,
            command=shlex.join(command),
            progress=bar.echo,
            on_example=lambda outcome: bar.advance(tally=outcome),
            max_findings=args.max_findings,
            expectations=expectations,
        )
    say()
    for line in stats.summary_lines():
        say(line)
    say(f"  drew from {stats.space}")
    for type_name, why in sorted(stats.excluded.items()):
        say(f"  not fuzzed: {type_name}: {why}")
    for type_name, how in sorted(stats.diverged.items()):
        say(f"  probe diverged, fuzzed anyway: {type_name}: {how}")
    if not stats.findings:
        say("no findings; exit 0")
        return 0
    say(f"{len(stats.findings)} finding(s), reproducers in {args.out}:")
    for finding in stats.findings:
        steps = f"{finding.steps} step{'s' if finding.steps != 1 else ''}"
        say(f"  {finding.number}. {finding.signature}: {finding.path} ({steps})")
        say(f"     {' '.join(first_message(finding.result, finding.signature).split())[:300]}")
    if len(stats.findings) >= args.max_findings:
        say(f"stopped at --max-findings {args.max_findings}")
    say("exit 1")
    return 1


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
        "--expectations",
        metavar="FILE",
        help="known divergences (default: nearest expectations.yaml)",
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
    add_progress_option(run)
    run.set_defaults(handler=cmd_run)

    coverage = sub.add_parser(
        "coverage",
        help="which group types x methods x step kinds the scenarios exercise, and what vLLM "
        "offers that none covers",
    )
    add_selection_options(coverage)
    add_vllm_options(coverage)
    coverage.add_argument("--json", metavar="FILE", help="also write the coverage as JSON")
    add_progress_option(coverage)
    coverage.set_defaults(handler=cmd_coverage)

    check = sub.add_parser(
        "check",
        help="run scenarios and exit like a `git bisect run` script (0 good, 1 bad, 125 skip)",
        description="Run the selected scenarios against one vLLM and exit with git bisect's "
        "codes: 0 conform, 1 nonconformance, 125 vLLM could not be exercised (skip), 128 bad "
        "input or usage (aborts git bisect). With --find-fix, 0 and 1 swap. Usable as "
        "`git bisect run kvconform check --vllm-src . /abs/path/scenarios/...`. Known "
        "divergences in the nearest expectations.yaml count as conforming, as in `run`.",
    )
    add_selection_options(check)
    add_vllm_options(check)
    check.add_argument(
        "--find-fix", action="store_true", help="exit 0 on nonconformance and 1 on conformance"
    )
    check.add_argument("--report-dir", metavar="DIR", help="write reports here (default: none)")
    add_expectation_options(check)
    add_progress_option(check)
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
    add_expectation_options(bisect)
    bisect.set_defaults(handler=cmd_bisect)

    methods = sub.add_parser("methods", help="list vLLM's speculative methods and their lookahead")
    methods.add_argument(
        "-k", type=int, default=3, help="num_speculative_tokens to evaluate (default 3)"
    )
    add_vllm_options(methods)
    methods.set_defaults(handler=cmd_methods)

    explain = sub.add_parser(
        "explain", help="run one scenario and show every step, request and group"
    )
    explain.add_argument("scenario", help="a scenario file, or a scenario id under scenarios/")
    add_vllm_options(explain)
    explain.set_defaults(handler=cmd_explain)

    doctor = sub.add_parser(
        "doctor", help="what the installed vLLM offers and what kvconform can exercise"
    )
    add_vllm_options(doctor)
    doctor.set_defaults(handler=cmd_doctor)

    from kvconform.harness.fuzz import DEFAULT_EXAMPLES, DEFAULT_MAX_FINDINGS, NIGHTLY_EXAMPLES

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
    add_vllm_options(fuzz)
    add_progress_option(fuzz)
    fuzz.set_defaults(handler=cmd_fuzz)
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
            from kvconform.harness.bisect.outcome import ABORT_CODE

            return ABORT_CODE
        return code
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(args.handler(args))
    except KvconformError as exc:
        say(f"ERROR {exc}")
        return int(getattr(exc, "exit_status", 2))
    except KeyboardInterrupt:
        say("interrupted")
        return 130


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
