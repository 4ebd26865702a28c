"""``kvconform realbugs``: replay the catalogue's bugs through the corpus and report.

Each bug's patched tree runs the corpus (``--checks all``) in a process of its own;
``--jobs`` runs several at once and ``--shard I/N`` takes one CI job's share (by a
hash of the bug's name). The unpatched release of every patch target runs first:
a red baseline makes its bugs *broken*, since nothing could be concluded. The exit
status is 0 when every bug is detected, 1 when one is missed, 2 for a bad
catalogue or a patch that does not apply, 3 when a tree cannot be exercised.
"""

from __future__ import annotations

import argparse
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvconform.errors import ExitStatus, PatchFailed, UsageError
from kvconform.harness.select import parse_shard, shard_of
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.realbugs.catalogue import DEFAULT_CATALOGUE, RealBug, read_catalogue
from kvconform.realbugs.replay import Replay, replay
from kvconform.realbugs.report import BugResult, RealBugsReport, who_catches, write_report
from kvconform.realbugs.trees import patched_tree, pristine_tree

DEFAULT_REPORT_DIR = "build/realbugs"
Say = Callable[[str], None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="the corpus (default: scenarios)")
    parser.add_argument("--catalogue", default=DEFAULT_CATALOGUE, metavar="FILE")
    parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    parser.add_argument("--shard", metavar="I/N", help="replay shard I of N of the bugs")
    parser.add_argument(
        "--bug", action="append", default=[], metavar="NAME", help="replay only these bugs"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="bugs replayed at once (default 1)"
    )
    parser.add_argument(
        "--checks", default="all", metavar="LIST", help="the checks the corpus runs (default all)"
    )
    parser.add_argument(
        "--all-catches",
        action="store_true",
        help="run each patched tree through the whole corpus, listing every scenario that "
        "catches it (default: stop at the first, enough to call it detected)",
    )
    parser.add_argument(
        "--peer-tests",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="also run vLLM's own CPU-runnable tests against each patched tree (the files "
        "that reach the functions its patch changes; docs/peer-tests.md): who catches what. "
        "DIR: a folder holding vLLM's tests/ (default: each release's source distribution)",
    )
    explorer = parser.add_mutually_exclusive_group()
    explorer.add_argument(
        "--explorer-only",
        type=float,
        metavar="SECONDS",
        help="replay each bug against kvconform explore alone (no corpus; seed 0, SECONDS of "
        "search per bug), its findings judged against the unpatched release",
    )
    explorer.add_argument(
        "--with-explorer",
        type=float,
        metavar="SECONDS",
        help="run the corpus, then kvconform explore (SECONDS per bug) on each bug it misses",
    )


def realbugs(args: argparse.Namespace, say: Say) -> ExitStatus:
    started = time.perf_counter()
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    for option, seconds in (("--explorer-only", args.explorer_only),
                            ("--with-explorer", args.with_explorer)):  # fmt: skip
        if seconds is not None and not seconds > 0:
            raise UsageError(f"{option} must be a positive number of seconds")
    catalogue = read_catalogue(args.catalogue)
    for error in catalogue.errors:
        say(f"ERROR {error}")
    bugs = catalogue.bugs
    unknown = sorted(set(args.bug) - {b.name for b in bugs})
    if unknown:
        raise UsageError(f"--bug: no such bug in {args.catalogue}: {', '.join(unknown)}")
    if args.bug:
        bugs = [b for b in bugs if b.name in args.bug]
    if args.shard:
        shard = parse_shard(args.shard)
        bugs = [b for b in bugs if shard_of(b.name, shard.count) == shard.index]
    paths = [str(Path(p).resolve()) for p in (args.paths or ["scenarios"])]
    directory = Path(args.report_dir).resolve()
    say(f"kvconform realbugs: {len(bugs)} bugs from {args.catalogue}, corpus {shlex.join(paths)}")

    if args.explorer_only is not None:
        say(f"  the explorer alone: {args.explorer_only:g} s per bug, seed 0")
        return _explorer_only(args, bugs, catalogue.errors, directory, started, say)

    baselines: dict[str, Replay] = {}
    for release in sorted({b.patch_target for b in bugs}):
        baseline = replay(
            pristine_tree(release), paths, directory / "baseline" / release, args.checks
        )
        baselines[release] = baseline
        green = baseline.outcome == "missed"  # exit 0: nothing caught on the unpatched tree
        baseline.outcome = "green" if green else "red"
        say(f"  baseline vLLM {release}: {'green' if green else baseline.why or 'red'} "
            f"({baseline.seconds:.0f} s)")  # fmt: skip

    def one(bug: RealBug) -> BugResult:
        base = baselines[bug.patch_target]
        if base.outcome != "green":
            result = Replay(
                "broken", None, why=f"the unpatched vLLM {bug.patch_target} is not green"
            )
        else:
            try:
                tree = patched_tree(bug)
            except PatchFailed as exc:
                result = Replay("broken", None, why=str(exc))
            else:
                result = replay(
                    tree, paths, directory / bug.name, args.checks, not args.all_catches
                )
        caught = ", ".join(list(result.caught_by)[:3]) if result.caught_by else result.why
        say(f"  {bug.name}: {result.outcome} ({result.seconds:.0f} s) {caught}")
        return BugResult(bug, result)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, bugs))
    if args.with_explorer is not None:
        _explore_the_missed(args, results, directory, baselines, say)
    if args.peer_tests is not None:
        run_peer_tests(results, args, say)
    return _finish(args, results, baselines, catalogue.errors, directory, started, say)


def _finish(
    args: argparse.Namespace,
    results: list[BugResult],
    baselines: dict[str, Replay],
    errors: list[Any],
    directory: Path,
    started: float,
    say: Say,
) -> ExitStatus:
    command = ["kvconform", "realbugs", *args.paths]
    if args.explorer_only is not None:
        command += ["--explorer-only", f"{args.explorer_only:g}"]
    if args.with_explorer is not None:
        command += ["--with-explorer", f"{args.with_explorer:g}"]
    report = RealBugsReport(
        results, baselines, shlex.join(command), time.perf_counter() - started,
    )  # fmt: skip
    written = write_report(report, directory)
    counts = report.counts()
    if args.peer_tests is not None:
        table = who_catches(results)
        say("who catches the bugs: " + ", ".join(f"{k} {v}" for k, v in table.items() if v))
    say(
        f"realbugs: {counts['detected']} detected, {counts['missed']} missed, "
        f"{counts['broken']} broken of {len(results)} ({report.detection_rate():.0%}) "
        f"in {report.seconds:.0f} s; " + ", ".join(str(p) for p in written)
    )
    if errors:
        return ExitStatus.BAD_INPUT
    if counts["missed"]:
        return ExitStatus.NONCONFORMANCE
    if counts["broken"]:
        return ExitStatus.NOT_EXERCISED
    return ExitStatus.CONFORM


def _explorer_only(
    args: argparse.Namespace,
    bugs: list[RealBug],
    errors: list[Any],
    directory: Path,
    started: float,
    say: Say,
) -> ExitStatus:
    """Every bug against the explorer alone (no corpus), judged against its unpatched release."""
    from kvconform.realbugs.explorer import explore_baseline, explore_replay

    seconds = float(args.explorer_only)
    releases = sorted({b.patch_target for b in bugs})

    def explore_release(release: str) -> Replay:
        base = explore_baseline(pristine_tree(release), directory / "baseline" / release, seconds)
        found = ", ".join(base.caught_by) if base.caught_by else base.why
        say(f"  baseline vLLM {release} (explorer): {base.outcome} ({base.seconds:.0f} s) {found}")
        return base

    def explore_bug(bug: RealBug) -> Replay:
        try:
            tree = patched_tree(bug)
        except PatchFailed as exc:
            return Replay("broken", None, why=str(exc))
        result = explore_replay(
            tree, pristine_tree(bug.patch_target), directory / bug.name, seconds
        )
        caught = ", ".join(list(result.caught_by)[:3]) if result.caught_by else result.why
        say(f"  {bug.name}: {result.outcome} ({result.seconds:.0f} s) {caught}")
        return result

    # The releases' baselines and the bugs are independent explorations, all started at
    # once (up to --jobs): a bug's run compares with its unpatched release as it goes
    # (--baseline-src), so it need not wait for the release's own exploration, which is
    # reported beside it (is the release green for the explorer?) and decides only a bug
    # whose release could not be explored at all.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        base_runs = {release: pool.submit(explore_release, release) for release in releases}
        bug_runs = [(bug, pool.submit(explore_bug, bug)) for bug in bugs]
        baselines = {release: run.result() for release, run in base_runs.items()}
        results = []
        for bug, run in bug_runs:
            base = baselines[bug.patch_target]
            result = run.result()
            if base.outcome == "broken":
                result = Replay(
                    "broken", None, why=f"the unpatched vLLM {bug.patch_target}: {base.why}"
                )
            results.append(BugResult(bug, result))
    return _finish(args, results, baselines, errors, directory, started, say)


def _explore_the_missed(
    args: argparse.Namespace,
    results: list[BugResult],
    directory: Path,
    baselines: dict[str, Replay],
    say: Say,
) -> None:
    """``--with-explorer``: the explorer on each bug the corpus missed; a bug it detects is
    detected, with the explorer's reproducers as what caught it."""
    from kvconform.realbugs.explorer import explore_baseline, explore_replay

    seconds = float(args.with_explorer)
    missed = [r for r in results if r.replay.outcome == "missed"]
    explored: dict[str, Replay] = {}
    for release in sorted({r.bug.patch_target for r in missed}):
        explored[release] = explore_baseline(
            pristine_tree(release), directory / "baseline-explorer" / release, seconds
        )
        baselines[f"{release} explorer"] = explored[release]
    for result in missed:
        base = explored[result.bug.patch_target]
        if base.outcome == "broken":
            continue
        found = explore_replay(
            patched_tree(result.bug), pristine_tree(result.bug.patch_target),
            directory / result.bug.name / "explorer", seconds,
        )  # fmt: skip
        say(f"  {result.bug.name}: the explorer: {found.outcome} ({found.seconds:.0f} s)")
        result.explorer = found.to_json()
        if found.outcome == "detected":
            result.replay.outcome = "detected"
            result.replay.caught_by = {f"explorer: {k}": v for k, v in found.caught_by.items()}


def run_peer_tests(results: list[BugResult], args: argparse.Namespace, say: Say) -> None:
    """Each result's ``peer`` entry: vLLM's own tests of its patch target, on its tree."""
    from kvconform.peer import prepare
    from kvconform.peer.environment import installed_vllm_version
    from kvconform.realbugs.peer import peer_entry

    tests = Path(args.peer_tests) if args.peer_tests else None
    installed = installed_vllm_version()
    for release in sorted({r.bug.patch_target for r in results}):
        pristine = pristine_tree(release)
        suite = prepare(
            release, reference_tree=None if release == installed else pristine, tests=tests
        )
        say(f"vLLM {release}'s own tests against its bugs (docs/peer-tests.md)")
        for result in (r for r in results if r.bug.patch_target == release):
            try:
                tree = patched_tree(result.bug)
            except PatchFailed as exc:
                result.peer = {"verdict": "broken", "first_failure": str(exc)}
                continue
            result.peer = peer_entry(suite, result.bug, tree, pristine)
            say(
                f"  peer {result.bug.name}: {result.peer['verdict']} "
                f"(kvconform: {result.replay.outcome}; {result.peer['tests_run']} tests, "
                f"{result.peer['seconds']:.0f} s)"
            )


class RealbugsCommand(Subcommand):
    name = "realbugs"
    help = (
        "replay real vLLM bugs (realbugs/catalogue.yaml) through the corpus: detected or missed"
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        add_arguments(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return int(realbugs(args, cli.say))


COMMAND = RealbugsCommand()
