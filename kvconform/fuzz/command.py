"""``kvconform fuzz``: search generated trajectories for divergences and print the findings.

The application logic of the command (budget and shard, expectations, the vLLM,
the summary and the findings); the command line hands in how to print and its
progress display. The search itself is :func:`kvconform.fuzz.runner.run_fuzz`.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvconform import __version__
from kvconform.errors import ExitStatus, UsageError
from kvconform.fuzz import DEFAULT_EXAMPLES, DEFAULT_MAX_FINDINGS, NIGHTLY_EXAMPLES
from kvconform.harness.expectations import (
    DEFAULT_FILE,
    DEFAULT_SCENARIOS,
    find_expectations,
    load_expectations,
)
from kvconform.harness.methods_file import use_methods_for
from kvconform.harness.select import shard_from
from kvconform.harness.session import load_vllm, vllm_to_load
from kvconform.harness.subcommand import CommandLine, Subcommand

DEFAULT_FUZZ_DIR = "build/fuzz"


def fuzz(
    args: argparse.Namespace, say: Callable[[str], None], open_progress: Callable[..., Any]
) -> int:
    """The whole fuzz run; ``say`` prints, ``open_progress`` is the front's progress display."""
    try:
        from kvconform.fuzz.findings import first_message
        from kvconform.fuzz.runner import run_fuzz
    except ImportError as exc:
        if exc.name != "hypothesis":
            raise
        raise UsageError("kvconform fuzz needs Hypothesis: pip install 'kvconform[fuzz]'") from None

    if args.examples < 1:
        raise UsageError("--examples must be at least 1")
    shard = shard_from(args.shard)
    if shard is not None:
        from kvconform.fuzz import shard_budget

        budget = args.examples
        args.examples, args.seed = shard_budget(budget, args.seed, shard.index, shard.count)
        say(
            f"shard {shard} ({shard.source}): {args.examples} of {budget} examples, "
            f"seed {args.seed}"
        )
        if args.examples < 1:
            say("no examples left to this shard; exit 0")
            return ExitStatus.CONFORM
    if args.max_findings < 1:
        raise UsageError("--max-findings must be at least 1")
    exp_path = Path(args.expectations) if args.expectations else find_expectations([])
    # Methods a methods file beside the corpus declares are drawn with their rule; the file
    # goes beside the reproducers too, so that each reruns where it is written.
    methods_file, methods_error = use_methods_for([])
    if methods_error is not None:
        raise methods_error
    if methods_file is not None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(methods_file, Path(args.out) / methods_file.name)
        say(f"methods file {methods_file}: its entries join the registry (copied to {args.out})")
    expectations = load_expectations(exp_path) if exp_path is not None else []
    say(f"kvconform {__version__}: loading {vllm_to_load(args.vllm_src, args.vllm_release)}")
    vllm = load_vllm(args.vllm_src, getattr(args, "vllm_release", None))
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
    say("")
    for line in stats.summary_lines():
        say(line)
    say(f"  drew from {stats.space}")
    for type_name, why in sorted(stats.excluded.items()):
        say(f"  not fuzzed: {type_name}: {why}")
    for type_name, how in sorted(stats.diverged.items()):
        say(f"  probe diverged, fuzzed anyway: {type_name}: {how}")
    if not stats.findings:
        say("no findings; exit 0")
        return ExitStatus.CONFORM
    say(f"{len(stats.findings)} finding(s), reproducers in {args.out}:")
    for finding in stats.findings:
        steps = f"{finding.steps} step{'s' if finding.steps != 1 else ''}"
        say(f"  {finding.number}. {finding.signature}: {finding.path} ({steps})")
        say(f"     {' '.join(first_message(finding.result, finding.signature).split())[:300]}")
    if len(stats.findings) >= args.max_findings:
        say(f"stopped at --max-findings {args.max_findings}")
    say("exit 1")
    return ExitStatus.NONCONFORMANCE


class FuzzCommand(Subcommand):
    name = "fuzz"
    help = "search generated trajectories for divergences, shrunk to YAML reproducers"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument(
            "--examples",
            type=int,
            default=DEFAULT_EXAMPLES,
            metavar="N",
            help=f"scenarios to generate (default {DEFAULT_EXAMPLES}; the nightly job runs "
            f"{NIGHTLY_EXAMPLES})",
        )
        parser.add_argument(
            "--seed", type=int, default=0, metavar="S", help="the same seed repeats the run (default 0)"
        )
        parser.add_argument(
            "--out",
            default=DEFAULT_FUZZ_DIR,
            metavar="DIR",
            help=f"where reproducers go (default {DEFAULT_FUZZ_DIR})",
        )
        parser.add_argument(
            "--max-findings",
            type=int,
            default=DEFAULT_MAX_FINDINGS,
            metavar="N",
            help=f"stop after N distinct findings (default {DEFAULT_MAX_FINDINGS})",
        )
        parser.add_argument(
            "--expectations",
            metavar="FILE",
            help="known divergences; group types whose probe diverges as listed are not drawn "
            f"(default: {DEFAULT_SCENARIOS}/{DEFAULT_FILE})",
        )
        cli.add_shard_option(parser, "run shard I of N: 1/N of the examples, with a seed of its own")
        cli.add_vllm_options(parser)
        cli.add_progress_option(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return fuzz(args, cli.say, cli.open_progress)


COMMAND = FuzzCommand()
