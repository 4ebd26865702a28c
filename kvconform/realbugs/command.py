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


def realbugs(args: argparse.Namespace, say: Say) -> ExitStatus:
    started = time.perf_counter()
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
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
    if args.peer_tests is not None:
        run_peer_tests(results, args, say)
    report = RealBugsReport(
        results, baselines, shlex.join(["kvconform", "realbugs", *args.paths]),
        time.perf_counter() - started,
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
    if catalogue.errors:
        return ExitStatus.BAD_INPUT
    if counts["missed"]:
        return ExitStatus.NONCONFORMANCE
    if counts["broken"]:
        return ExitStatus.NOT_EXERCISED
    return ExitStatus.CONFORM


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
