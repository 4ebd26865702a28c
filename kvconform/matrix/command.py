"""``kvconform matrix --releases A..B [PATH...]``: the command around :mod:`.runner` and :mod:`.table`."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvconform.bisect import release_index
from kvconform.errors import ExitStatus, UsageError
from kvconform.harness.loader import discover
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.matrix.lock import write_lock
from kvconform.matrix.runner import ReleaseRun, run_release
from kvconform.matrix.table import Matrix, render_console, write_matrix
from kvconform.oracles.vllm import MINIMUM_SUPPORTED

DEFAULT_REPORT_DIR = "build/matrix"
Say = Callable[[str], None]


def add_matrix_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--releases",
        required=True,
        metavar="A..B",
        help="the PyPI releases of vllm from A to B on pip's index; A.. runs to the newest, "
        "A,B,C runs exactly those",
    )
    parser.add_argument(
        "--checks",
        default="all",
        metavar="LIST",
        help="the checks every release runs (default: all, as the nightly runs them)",
    )
    parser.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR")
    parser.add_argument(
        "--lock",
        metavar="FILE",
        help="after a run in which every supported release exits 0, write the release lock "
        "(the releases, a hash of each scenario file) to FILE: make test then runs only "
        "the scenarios changed since against each release",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="releases run at once, each in its own process (default 1)",
    )


def releases_in(text: str, say: Say) -> list[str]:
    """The releases ``A..B``, ``A..`` (to the newest) or ``A,B,...`` names, oldest first."""
    if ".." not in text:
        listed = [v.strip() for v in text.split(",") if v.strip()]
        for version in listed:
            try:
                Version(version)
            except InvalidVersion:
                raise UsageError(f"--releases: {version!r} is not a version") from None
        index = release_index.list_releases(say=say)
        for version in listed:
            release_index.releases_between(index, version, version)  # on the index, or say so
        return release_index.ordered(list(dict.fromkeys(listed)))
    open_ended = text.endswith("..") and text.count("..") == 1
    if open_ended:
        first = text[:-2]
        try:
            Version(first)
        except InvalidVersion:
            raise UsageError(f"--releases: {first!r} is not a version") from None
    else:
        first, last = release_index.parse_range(text)
    index = release_index.list_releases(say=say)
    if open_ended:
        final = [v for v in index if not (Version(v).is_prerelease or Version(v).is_devrelease)]
        last = final[-1] if final else first
        if Version(first) > Version(last):
            raise UsageError(f"--releases: {first} is newer than the newest release, {last}")
    return release_index.releases_between(index, first, last)


def run_arguments(args: argparse.Namespace) -> list[str]:
    """What every release's ``kvconform run`` gets; paths made absolute (it runs elsewhere)."""
    paths = args.paths or ["scenarios"]
    for path in paths:
        if not Path(path).exists():
            raise UsageError(f"no such file or folder: {path}")
    out = [str(Path(p).resolve()) for p in paths]
    if args.expression:
        out += ["-k", args.expression]
    out += ["--checks", args.checks]
    if args.expectations:
        out += ["--expectations", str(Path(args.expectations).resolve())]
    elif args.no_expectations:
        out += ["--no-expectations"]
    return out


def matrix(args: argparse.Namespace, say: Say) -> ExitStatus:
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    releases = releases_in(args.releases, say)
    run_args = run_arguments(args)
    directory = Path(args.report_dir).resolve()
    minimum = Version(MINIMUM_SUPPORTED)
    shown = shlex.join(run_args)
    say(
        f"kvconform matrix: {len(releases)} releases ({', '.join(releases)}), `kvconform run {shown}`"
    )

    def one(release: str) -> ReleaseRun:
        supported = Version(release) >= minimum
        row = run_release(release, run_args, directory / release, supported)
        counts = ", ".join(f"{n} {k}" for k, n in row.counts.items() if n) or "nothing ran"
        ran = f"exit {row.exit_status}" if row.exit_status is not None else row.problem
        say(f"  {release}: {counts}; {ran} ({row.duration:.0f} s)")
        return row

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, releases))
    table = Matrix(rows, MINIMUM_SUPPORTED, shown)
    say("")
    for line in render_console(table):
        say(line)
    written = write_matrix(table, directory)
    status = table.exit_status()
    say(f"matrix: exit {int(status)}; " + ", ".join(str(p) for p in written))
    if args.lock:
        supported = [row for row in rows if row.supported]
        if status is ExitStatus.CONFORM and supported and not args.expression:
            write_lock(
                Path(args.lock),
                [row.release for row in supported],
                discover(args.paths or ["scenarios"]),
            )
            say(f"release lock: {args.lock} ({', '.join(r.release for r in supported)})")
        else:
            say(f"release lock: {args.lock} left as it was (the matrix is not green)")
    return status


class MatrixCommand(Subcommand):
    name = "matrix"
    help = "run the corpus against every release from A to B; one matrix report"
    description = (
        "Run `kvconform run --checks all --vllm-release V` for each PyPI release "
        "V from A to B, each in its own process, and write matrix.json, matrix.md and "
        "matrix.html: verdict counts per release, the scenarios whose verdict changed between "
        "neighbouring releases, links to each run's report. Exits non-zero when a release at "
        "or above the minimum supported one errors or fails unexpectedly. See docs/releases.md."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_selection_options(parser)
        cli.add_expectation_options(parser)
        add_matrix_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return int(matrix(args, cli.say))


COMMAND = MatrixCommand()
