"""The ``kvconform`` command line (DESIGN.md §6): a thin front over the engine.

Exit status: 0 conform; 1 nonconformance; 2 bad input or usage; 3 vLLM could
not be exercised. Errors meant for the user (a bad scenario, a vLLM lacking an
API, a wrong flag) print one message and no traceback.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kvconform import __version__
from kvconform.errors import KvconformError, ScenarioError, UsageError, VllmUnavailable
from kvconform.harness import engine
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS, parse_checks
from kvconform.harness.expectations import DEFAULT_FILE, Expectation, load_expectations
from kvconform.harness.loader import load_paths
from kvconform.harness.results import RunReport, ScenarioResult, Verdict
from kvconform.harness.scenario import Scenario
from kvconform.harness.select import compile_expression
from kvconform.oracles import vllm_compat
from kvconform.oracles.vllm_compat import Vllm

DEFAULT_SCENARIOS = "scenarios"
DEFAULT_REPORT_DIR = "build/report"


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
    scenarios, input_errors = select_scenarios(args)
    for err in input_errors:
        say(f"ERROR {err}")
    checks = selected_checks(args.checks)
    expectations: list[Expectation] = []
    exp_path = Path(args.expectations) if args.expectations else find_expectations(args.paths)
    if exp_path is not None:
        try:
            expectations = load_expectations(exp_path)
        except ScenarioError as err:
            input_errors.append(err)
            say(f"ERROR {err}")
    report = RunReport(
        results=[],
        input_errors=input_errors,
        vllm_version=None,
        vllm_source=None,
        vllm_path=None,
        started=started,
        command=shlex.join(["kvconform", *sys.argv[1:]]) if sys.argv else "kvconform run",
        checks=checks,
    )
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
    say(
        f"kvconform {__version__}: {len(scenarios)} scenarios against vLLM {vllm.version} "
        f"({vllm.source.describe()})"
    )
    for result in engine.run_all(scenarios, vllm, checks, expectations):
        report.results.append(result)
        print_result(result)
    for note in skipped_notes(report.results):
        say(note)
        report.notes.append(note)
    report.exit_status = engine.exit_status(report.results, len(input_errors))
    return finish_run(report, args)


def print_result(result: ScenarioResult) -> None:
    skipped = "".join(f"; {name} skipped" for name in result.skipped_checks)
    say(f"{result.verdict.value.upper():8} {result.id}  ({result.duration * 1000:.0f} ms{skipped})")
    if result.verdict in (Verdict.FAILED, Verdict.ERROR):
        for line in ([result.error] if result.error else []) + [
            f"[{f.check}] {f.message}" for f in result.failures[:3]
        ]:
            say(f"         {line}")
        if len(result.failures) > 3:
            say(f"         ... {len(result.failures) - 3} more failures in report.json")
    elif result.expectation:
        say(f"         known divergence: {result.expectation}")


def finish_run(report: RunReport, args: argparse.Namespace) -> int:
    from kvconform.reports import write_reports

    report.duration = time.time() - report.started
    written = write_reports(report, args.report_dir)
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items() if v)
    say(f"\n{counts or 'nothing ran'} in {report.duration:.1f} s; exit {report.exit_status}")
    say("reports: " + ", ".join(str(p) for p in written))
    return report.exit_status


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
    run.set_defaults(handler=cmd_run)

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2 already
        return int(exc.code or 0)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(args.handler(args))
    except KvconformError as exc:
        say(f"ERROR {exc}")
        return int(getattr(exc, "exit_status", 2))
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
