"""``kvconform mutate``: the subcommand's options and its run, from flags to reports.

The command line (:mod:`kvconform.fronts.cli`) only registers the subcommand (:data:`COMMAND`)
and lends its progress display;
everything it does is here: load the targets, the equivalents, the corpus and
vLLM; the clean run; the mutants of this shard; the forked runs
(:mod:`.campaign`); with ``--with-fuzz N`` the fuzzer against each survivor
and declared equivalent (:mod:`.fuzzing`); the reports (:mod:`.report`). ``--merge`` joins shard reports.

Exit status: 0 when the campaign ran (and the score is at least
``--fail-under``, when given); 1 below it; 2 bad input or usage; 3 vLLM could
not be exercised.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvconform import __version__
from kvconform.errors import ExitStatus, UsageError
from kvconform.harness.select import parse_shard
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.mutate.targets import DEFAULT_EQUIVALENTS, DEFAULT_TARGETS

if TYPE_CHECKING:
    from kvconform.mutate.campaign import MutantResult, ResolvedTarget

DEFAULT_REPORT_DIR = "build/mutation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="scenario files or folders (default: scenarios)"
    )
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        metavar="FILE",
        help=f"target functions (default {DEFAULT_TARGETS})",
    )
    parser.add_argument(
        "--equivalents",
        default=DEFAULT_EQUIVALENTS,
        metavar="FILE",
        help=f"equivalent mutants and why (default {DEFAULT_EQUIVALENTS})",
    )
    parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    parser.add_argument("--shard", default="1/1", metavar="I/N", help="run the I-th of N shards")
    parser.add_argument(
        "--mutant",
        action="append",
        default=[],
        metavar="ID",
        help="run only this mutant (repeatable)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, metavar="N", help="mutants at once"
    )
    parser.add_argument(
        "--with-fuzz",
        type=int,
        default=0,
        metavar="N",
        help="run the fuzzer for N examples, aimed at the mutated function, against each "
        "survivor and each declared equivalent (the equivalents' audit)",
    )
    parser.add_argument(
        "--checks", metavar="LIST", help="checks to run (default: the default checks of `run`)"
    )
    parser.add_argument(
        "--fail-under", type=float, metavar="SCORE", help="exit 1 when the score is below SCORE"
    )
    parser.add_argument(
        "--peer-tests",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="also run vLLM's own CPU-runnable tests against every mutant kvconform does not "
        "kill and a sample of those it kills (docs/peer-tests.md); DIR: a folder holding "
        "vLLM's tests/ (default: the release's source distribution)",
    )
    parser.add_argument(
        "--peer-sample",
        type=int,
        default=200,
        metavar="N",
        help="killed mutants vLLM's tests also run against, stratified by function (default 200)",
    )
    parser.add_argument(
        "--peer-seed", type=int, default=0, metavar="S", help="the sample's seed (default 0)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="merge these shard reports (mutation.json) into --report-dir; runs nothing",
    )


def _say(text: str = "") -> None:
    print(text, flush=True)


def _vllm_option(args: argparse.Namespace) -> list[str]:
    if getattr(args, "vllm_release", None):
        return ["--vllm-release", args.vllm_release]
    if getattr(args, "vllm_src", None):
        return ["--vllm-src", args.vllm_src]
    return []


def merge_command(args: argparse.Namespace) -> ExitStatus:
    from kvconform.mutate import report as reports

    loaded = []
    for name in args.merge:
        path = Path(name)
        if path.is_dir():
            path = path / "mutation.json"
        if not path.exists():
            raise UsageError(f"--merge: no such report: {path}")
        loaded.append(json.loads(path.read_text()))
    try:
        merged = reports.merge(loaded)
    except ValueError as exc:
        raise UsageError(f"--merge: {exc}") from None
    sources = _sources_of(merged)
    written = reports.write(merged, args.report_dir, sources)
    _say(f"merged {len(loaded)} reports: {merged['mutants']} mutants, score {merged['score']}")
    _say("reports: " + ", ".join(map(str, written)))
    return ExitStatus.CONFORM


def _sources_of(report: dict[str, Any]) -> dict[str, str]:
    sources = {}
    for row in report["targets"]:
        path = row.get("path")
        if path and Path(path).exists():
            sources[row["module"]] = Path(path).read_text(encoding="utf-8")
    return sources


def mutate(args: argparse.Namespace, open_progress: Callable[..., Any]) -> ExitStatus:
    """The whole campaign; ``open_progress`` is the front's progress display."""
    # Imported here: cosmic-ray (and vLLM, through the oracles) only when a campaign runs.
    from kvconform.harness.session import RunRequest, Session, checks_from
    from kvconform.mutate import report as reports
    from kvconform.mutate.campaign import clean_run, resolve_targets, run_mutants
    from kvconform.mutate.fresh import run_fresh
    from kvconform.mutate.mutants import Mutant
    from kvconform.mutate.targets import load_equivalents, load_targets

    if args.merge:
        return merge_command(args)
    started = time.perf_counter()
    phases: dict[str, float] = {}
    shard = parse_shard(args.shard)
    shard_index, shard_count = shard.index, shard.count
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if not Path(args.targets).exists():
        raise UsageError(f"no such file: {args.targets}")
    targets = load_targets(args.targets)
    equivalents = load_equivalents(args.equivalents)
    # Mutants run in forked children, and CUDA cannot be initialised again in a child of a
    # process that used it: on a GPU host every warmup scenario crashed ("Cannot
    # re-initialize CUDA in forked subprocess") and those crashes counted as kills. The
    # campaign judges reservation arithmetic, which is the same on the CPU, so it hides
    # the GPUs before vLLM and torch are loaded (engine scenarios are then skipped, as on
    # a machine without CUDA).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    session = Session(
        RunRequest(
            paths=tuple(args.paths),
            checks=checks_from(args.checks),
            vllm_src=getattr(args, "vllm_src", None),
            vllm_release=getattr(args, "vllm_release", None),
        )
    )
    selection = session.select()
    for error in selection.input_errors:
        _say(f"ERROR {error}")
    if selection.input_errors:
        return ExitStatus.BAD_INPUT
    scenarios = selection.scenarios
    checks = session.request.checks

    lap = time.perf_counter()
    vllm = session.vllm
    phases["load_vllm"] = time.perf_counter() - lap
    _say(
        f"kvconform {__version__} mutate: vLLM {vllm.version} ({vllm.source.describe()}), "
        f"{len(targets)} targets, {len(scenarios)} scenarios"
    )

    lap = time.perf_counter()
    resolved = resolve_targets(targets)
    phases["mutants"] = time.perf_counter() - lap
    for entry in resolved:
        if entry.missing:
            _say(f"target {entry.target.key}: missing in vLLM {vllm.version}: {entry.missing}")

    lap = time.perf_counter()
    with open_progress(len(scenarios), "scenarios (clean run)", mode=args.progress) as progress:
        baseline = clean_run(
            scenarios, session.run_scenario, resolved, lambda s: progress.advance()
        )
    for error in session.expectation_errors:
        _say(f"ERROR {error}")
    if session.expectation_errors:
        return ExitStatus.BAD_INPUT
    phases["clean_run"] = time.perf_counter() - lap

    everything: list[Mutant] = [m for entry in resolved for m in entry.mutants]
    order = {m.id: i for i, m in enumerate(everything)}
    chosen = [m for i, m in enumerate(everything) if i % shard_count == shard_index - 1]
    if args.mutant:
        wanted = set(args.mutant)
        unknown = wanted - {m.id for m in everything}
        if unknown:
            raise UsageError(f"--mutant: no such mutant: {', '.join(sorted(unknown))}")
        chosen = [m for m in everything if m.id in wanted]
    _say(
        f"clean run: {len(scenarios)} scenarios in {phases['clean_run']:.1f} s; "
        f"{len(chosen)} of {len(everything)} mutants in shard {args.shard}"
    )

    package = vllm.location
    scenario_files = {s.id: s.file for s in scenarios}

    def fresh(mutant: Mutant, text: str, ids: list[str]) -> dict[str, Any]:
        entry = next(r for r in resolved if r.target.key == f"{mutant.module}:{mutant.function}")
        assert entry.source is not None
        return run_fresh(
            package,
            entry.source.path,
            text,
            ids,
            sorted({scenario_files[i] for i in ids}),
            baseline.outcomes,
            checks,
        )

    lap = time.perf_counter()
    tally: Counter[str] = Counter()
    with open_progress(len(chosen), "mutants", mode=args.progress) as progress:

        def on_result(result: MutantResult) -> None:
            tally[result.verdict] += 1
            if result.verdict in ("survived", "timeout"):
                progress.echo(
                    f"{result.verdict.upper():9} {result.mutant.id}: {result.replacement}"
                )
            progress.advance(tally=result.verdict)

        results = run_mutants(
            vllm,
            resolved,
            chosen,
            scenarios,
            baseline,
            session.run_scenario,
            equivalents,
            jobs=args.jobs,
            fresh_runner=fresh,
            on_result=on_result,
        )
    phases["mutants_run"] = time.perf_counter() - lap
    forked = [r for r in results if r.how == "fork"]
    forked_seconds = phases["mutants_run"] - sum(r.seconds for r in results if r.how == "fresh")

    if args.with_fuzz:
        from kvconform.mutate.fuzzing import fuzz_not_killed

        lap = time.perf_counter()
        fuzz_not_killed(
            vllm,
            resolved,
            results,
            args.with_fuzz,
            jobs=args.jobs,
            say=_say,
            expectations=session.expectations_for(),
        )
        phases["fuzz"] = time.perf_counter() - lap

    peer_entries: dict[str, dict[str, Any]] = {}
    if args.peer_tests is not None:
        from kvconform.mutate.peer import choose, run_peer
        from kvconform.peer import prepare

        lap = time.perf_counter()
        chosen_peer = choose(results, args.peer_sample, args.peer_seed)
        _say(f"vLLM's own tests against {len(chosen_peer)} mutants (docs/peer-tests.md)")
        suite = prepare(
            vllm.version,
            reference_tree=Path(vllm.location).parent if vllm.source.kind != "installed" else None,
            tests=Path(args.peer_tests) if args.peer_tests else None,
        )
        peer_entries = run_peer(
            suite, Path(vllm.location), resolved, chosen_peer, jobs=args.jobs, say=_say
        )
        phases["peer_tests"] = time.perf_counter() - lap

    seconds = time.perf_counter() - started
    report = reports.build(
        vllm={
            "version": vllm.version,
            "source": vllm.source.kind,
            "path": vllm.location,
            "release": vllm.source.release,
        },
        targets=[_target_json(entry, baseline.reached) for entry in resolved],
        results=[
            {
                **_result_json(r, order[r.mutant.id], args.targets, _vllm_option(args)),
                **({"peer": peer_entries[r.mutant.id]} if r.mutant.id in peer_entries else {}),
            }
            for r in results
        ],
        seconds=seconds,
        phases=phases,
        shard=args.shard,
        command=shlex.join(["kvconform", *sys.argv[1:]]) if sys.argv else "kvconform mutate",
        extra={
            "kvconform": __version__,
            "checks": list(checks),
            "scenarios": len(scenarios),
            "forked_mutants_per_second": round(len(forked) / forked_seconds, 2)
            if forked and forked_seconds > 0
            else None,
            "with_fuzz": args.with_fuzz,
        },
    )
    sources = {entry.target.module: entry.source.module_text for entry in resolved if entry.source}
    written = reports.write(report, args.report_dir, sources)
    _say()
    _say(
        f"{report['mutants']} mutants: "
        + ", ".join(f"{report[v]} {v}" for v in reports.VERDICTS[:5])
        + f"; score {report['score']}; {seconds:.0f} s"
        + (
            f" ({report['forked_mutants_per_second']} mutants/s forked)"
            if report["forked_mutants_per_second"]
            else ""
        )
    )
    _say("reports: " + ", ".join(map(str, written)))
    if args.fail_under is not None and (report["score"] or 0.0) < args.fail_under:
        _say(f"score {report['score']} is below --fail-under {args.fail_under}")
        return ExitStatus.NONCONFORMANCE
    return ExitStatus.CONFORM


def _target_json(entry: ResolvedTarget, reached: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "key": entry.target.key,
        "module": entry.target.module,
        "function": entry.target.function,
        "focus": list(entry.target.focus),
        "missing": entry.missing,
        "path": entry.source.path if entry.source else None,
        "lines": [entry.source.first_line, entry.source.last_line] if entry.source else None,
        "reached_by": len(reached.get(entry.target.key, [])),
    }


def _result_json(
    result: MutantResult, order: int, targets_file: str, vllm_option: list[str]
) -> dict[str, Any]:
    from kvconform.mutate import report as reports

    m = result.mutant
    data: dict[str, Any] = {
        "id": m.id,
        "order": order,
        "target": f"{m.module}:{m.function}",
        "module": m.module,
        "function": m.function,
        "operator": m.operator,
        "occurrence": m.occurrence,
        "line": m.line,
        "column": m.column,
        "end_line": m.end_line,
        "end_column": m.end_column,
        "region": m.region,
        "verdict": result.verdict,
        "killed_by": result.killed_by,
        "covered": result.covered,
        "scenarios_run": result.scenarios_run,
        "seconds": round(result.seconds, 3),
        "how": result.how,
        "note": result.note,
        "original": m.original.strip(),
        "replacement": result.replacement,
        "diff": result.diff,
        "rerun": reports.rerun_command(m.id, targets_file, vllm_option),
    }
    if result.equivalent_reason:
        data["equivalent_reason"] = result.equivalent_reason
    if result.fuzz is not None:
        data["fuzz"] = result.fuzz
    return data


class MutateCommand(Subcommand):
    name = "mutate"
    help = "mutation campaign: how many mutants of vLLM's reservation code the suite kills"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        add_arguments(parser)
        cli.add_vllm_options(parser)
        cli.add_progress_option(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return int(mutate(args, cli.open_progress))


COMMAND = MutateCommand()
