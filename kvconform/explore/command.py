"""``kvconform explore``: search generated scheduler workloads and print the findings.

The command's options (:func:`add_arguments`) and its application logic
(:func:`explore`): the argument checks, the vLLM, the search
(:func:`kvconform.explore.runner.run_explore`), the statistics, and the findings
gathered into root-cause groups as ``kvconform run`` gathers a run's failures.
Exit status as ``kvconform run``: 0 nothing found, 1 findings, 2 bad usage,
3 vLLM could not be exercised.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvconform import __version__
from kvconform.errors import ExitStatus, UsageError
from kvconform.explore import DEFAULT_BUDGET, DEFAULT_MAX_FINDINGS, NIGHTLY_BUDGET, PR_BUDGET
from kvconform.harness.subcommand import CommandLine, Subcommand

DEFAULT_EXPLORE_DIR = "build/explore"
# The most workers: each holds a vLLM scheduler and its own Hypothesis search.
MAX_JOBS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        metavar="SECONDS",
        help=f"seconds of search, set-up and the last shrinking apart (default {DEFAULT_BUDGET}; "
        f"make explore {PR_BUDGET}, the nightly job {NIGHTLY_BUDGET})",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="the same seed repeats the search"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="search in N processes, each with a seed of its own (default 1)",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_EXPLORE_DIR,
        metavar="DIR",
        help=f"where reproducers and explore-summary.json go (default {DEFAULT_EXPLORE_DIR})",
    )
    parser.add_argument(
        "--max-findings",
        type=int,
        default=DEFAULT_MAX_FINDINGS,
        metavar="N",
        help=f"stop after N distinct findings per job (default {DEFAULT_MAX_FINDINGS})",
    )
    parser.add_argument(
        "--known",
        metavar="FILE",
        help="an explore-summary.json of an earlier run: its findings' signatures are not "
        "searched for again (kvconform realbugs --explorer-only passes the unpatched release's)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Usage errors, before vLLM is loaded."""
    if not args.budget > 0:
        raise UsageError(f"--budget must be a positive number of seconds, not {args.budget:g}")
    if not 1 <= args.jobs <= MAX_JOBS:
        raise UsageError(f"--jobs must be between 1 and {MAX_JOBS}, not {args.jobs}")
    if args.max_findings < 1:
        raise UsageError("--max-findings must be at least 1")
    if args.seed < 0:
        raise UsageError(f"--seed must be at least 0, not {args.seed}")
    if args.known is not None and not Path(args.known).is_file():
        raise UsageError(f"--known: no such file {args.known}")


def explore(
    args: argparse.Namespace, say: Callable[[str], None], open_progress: Callable[..., Any]
) -> int:
    """The whole explorer run; ``say`` prints, ``open_progress`` is the front's progress display."""
    try:
        from kvconform.explore.runner import known_signatures, run_explore
    except ImportError as exc:
        if exc.name != "hypothesis":
            raise
        raise UsageError(
            "kvconform explore needs Hypothesis: pip install 'kvconform[fuzz]'"
        ) from None
    from kvconform.harness.root_causes import find_root_causes
    from kvconform.harness.session import load_vllm, vllm_to_load

    check_arguments(args)
    try:
        known = known_signatures(Path(args.known)) if args.known else ()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--known {args.known}: not an explore-summary.json ({exc})") from None
    release = getattr(args, "vllm_release", None)
    say(f"kvconform {__version__}: loading {vllm_to_load(args.vllm_src, release)}")
    vllm = load_vllm(args.vllm_src, release)
    command = ["kvconform", "explore", "--budget", f"{args.budget:g}", "--seed", str(args.seed)]
    command += ["--jobs", str(args.jobs), "--out", args.out]
    if args.known:
        command += ["--known", args.known]
    if args.vllm_src:
        command += ["--vllm-src", args.vllm_src]
    if release:
        command += ["--vllm-release", release]
    say(
        f"kvconform {__version__}: exploring vLLM {vllm.version} ({vllm.source.describe()}) "
        f"for {args.budget:g} s, seed {args.seed}, {args.jobs} job(s)"
    )
    run = run_explore(
        vllm,
        args.budget,
        args.seed,
        args.out,
        jobs=args.jobs,
        command=shlex.join(command),
        progress=say,
        max_findings=args.max_findings,
        known=known,
    )
    stats = run.stats
    say("")
    for line in stats.summary_lines():
        say(line)
    say(f"  drew from {stats.space}")
    for name, why in sorted(stats.excluded.items()):
        say(f"  not drawn: {name}: {why}")
    if not run.reproduced:
        say("no findings; exit 0")
        return ExitStatus.CONFORM
    say(f"{len(run.reproduced)} finding(s), reproducers in {args.out}:")
    from kvconform.fuzz.findings import first_message

    for path, signature, result in run.reproduced:
        say(f"  {signature}: {path}")
        say(f"     {' '.join(first_message(result, signature).split())[:300]}")
    causes = find_root_causes([result for _, _, result in run.reproduced])
    if causes:
        say(f"root causes ({len(causes)}):")
        for cause in causes:
            say(f"  {cause.sentence()}")
    crashes = [(p, s) for p, s, _ in run.reproduced if s.check == "crash"]
    for path, signature in crashes:
        say(f"  vLLM raised {signature.subject} at {signature.detail or '?'}: {path}")
    say("exit 1")
    return ExitStatus.NONCONFORMANCE


class ExploreCommand(Subcommand):
    name = "explore"
    help = "search generated scheduler workloads, shrunk to YAML scheduler scenarios"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        add_arguments(parser)
        cli.add_vllm_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return int(explore(args, cli.say, cli.open_progress))


COMMAND = ExploreCommand()
