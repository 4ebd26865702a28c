"""``kvconform explore``: search generated scheduler workloads and print the findings.

The command's options (:func:`add_arguments`) and its application logic
(:func:`explore`): the argument checks, the vLLM, the search
(:func:`kvconform.explore.runner.run_explore`), the statistics, and the findings
gathered into root-cause groups as ``kvconform run`` gathers a run's failures.
Exit status as ``kvconform run``: 0 nothing found (or only findings the file of
triaged findings lists for this vLLM, :mod:`kvconform.explore.known`), 1 new
findings, 2 bad usage or a bad file of known findings, 3 vLLM could not be exercised.
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
from kvconform.explore.known import DEFAULT_KNOWN_FINDINGS
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
        "searched for again (the unpatched release's summary, say, to skip its standing failures)",
    )
    parser.add_argument(
        "--baseline-src",
        metavar="TREE",
        help="a vLLM Python tree (the folder holding vllm/) to compare with, differential "
        "testing: each new failure is run there first, and a signature it shows there too is "
        "the baseline's (listed, not shrunk, not searched for again); a candidate shrinks only "
        "while the baseline does not show it (kvconform realbugs --explorer-only passes the "
        "unpatched release)",
    )
    parser.add_argument(
        "--known-findings",
        metavar="FILE",
        help="triaged findings, reported as 'known (finding #N)' without making the exit 1 "
        f"(default {DEFAULT_KNOWN_FINDINGS}, where it exists)",
    )
    parser.add_argument(
        "--no-known-findings",
        action="store_true",
        help="read no file of triaged findings: every finding makes the exit 1",
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
    if args.baseline_src is not None and not (Path(args.baseline_src) / "vllm").is_dir():
        raise UsageError(
            f"--baseline-src: {args.baseline_src} is not a vLLM Python tree (no vllm/ folder in it)"
        )
    if args.known_findings is not None:
        if args.no_known_findings:
            raise UsageError("--known-findings and --no-known-findings exclude each other")
        if not Path(args.known_findings).is_file():
            raise UsageError(f"--known-findings: no such file {args.known_findings}")


def known_findings_file(args: argparse.Namespace) -> Path | None:
    """The file of triaged findings to read: --known-findings, else the default where it exists."""
    if args.no_known_findings:
        return None
    if args.known_findings is not None:
        return Path(args.known_findings)
    default = Path(DEFAULT_KNOWN_FINDINGS)
    return default if default.is_file() else None


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
    from kvconform.explore.known import load_known_findings, triaged
    from kvconform.harness.root_causes import find_root_causes
    from kvconform.harness.session import load_vllm, vllm_to_load

    check_arguments(args)
    known_file = known_findings_file(args)
    # A bad entry is a ScenarioError (file, line, field; exit 2), before vLLM is loaded.
    triaged_findings = load_known_findings(known_file) if known_file is not None else []
    try:
        known = known_signatures(Path(args.known)) if args.known else ()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--known {args.known}: not an explore-summary.json ({exc})") from None
    release = getattr(args, "vllm_release", None)
    baseline = None
    if args.baseline_src is not None and args.jobs == 1:
        from kvconform.explore.runner import baseline_log
        from kvconform.fuzz.baseline import BaselineProcess

        # Started first: its vLLM imports while this process imports its own.
        baseline = BaselineProcess(args.baseline_src, baseline_log(Path(args.out), args.seed))
    say(f"kvconform {__version__}: loading {vllm_to_load(args.vllm_src, release)}")
    try:
        vllm = load_vllm(args.vllm_src, release)
    except BaseException:
        if baseline is not None:
            baseline.close()
        raise
    command = ["kvconform", "explore", "--budget", f"{args.budget:g}", "--seed", str(args.seed)]
    command += ["--jobs", str(args.jobs), "--out", args.out]
    if args.known:
        command += ["--known", args.known]
    if args.known_findings:
        command += ["--known-findings", args.known_findings]
    if args.no_known_findings:
        command += ["--no-known-findings"]
    if args.baseline_src:
        command += ["--baseline-src", args.baseline_src]
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
        known_findings=triaged_findings,
        baseline_src=args.baseline_src,
        baseline=baseline,
    )
    stats = run.stats
    say("")
    for line in stats.summary_lines():
        say(line)
    say(f"  drew from {stats.space}")
    for name, why in sorted(stats.excluded.items()):
        say(f"  not drawn: {name}: {why}")
    if known_file is not None:
        say(f"  triaged findings from {known_file} ({len(triaged_findings)} entries)")
    if not run.reproduced:
        say("no findings; exit 0")
        return ExitStatus.CONFORM
    from kvconform.fuzz.findings import first_message

    new = [
        found for found in run.reproduced if not triaged(found[1], vllm.version, triaged_findings)
    ]
    say(f"{len(run.reproduced)} finding(s), {len(new)} new, reproducers in {args.out}:")
    for path, signature, result in run.reproduced:
        entry = triaged(signature, vllm.version, triaged_findings)
        say(f"  {signature}: {path}" + (f" -- {entry.label()}" if entry else ""))
        say(f"     {' '.join(first_message(result, signature).split())[:300]}")
    if not new:
        say("only known findings; exit 0")
        return ExitStatus.CONFORM
    causes = find_root_causes([result for _, _, result in new])
    if causes:
        say(f"root causes ({len(causes)}):")
        for cause in causes:
            say(f"  {cause.sentence()}")
    crashes = [(p, s) for p, s, _ in new if s.check == "crash"]
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
