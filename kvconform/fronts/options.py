"""What kvconform's command line shares with every subcommand (``kvconform.harness.subcommand``).

The options several subcommands take, each worded once; how a front prints; the
session's request built from those options. :data:`FRONT` lends them to each
subcommand as its :class:`~kvconform.harness.subcommand.CommandLine`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from kvconform.fronts.progress import Progress, add_progress_option, open_progress
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.loader.budget import Limits
from kvconform.harness.select import Shard
from kvconform.harness.session import RunRequest, load_vllm
from kvconform.harness.subcommand import CommandLine
from kvconform.oracles.vllm import Vllm


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



def verbosity_of(args: argparse.Namespace) -> int:
    """``-v`` / ``-q`` as a number: 1 a line per scenario, 0 a character, -1 the summary."""
    return int(getattr(args, "verbose", 0) or 0) - int(getattr(args, "quiet", 0) or 0)


class Front(CommandLine):
    """The command line as a subcommand sees it: this module's options, ``say`` and the
    progress display of :mod:`kvconform.fronts.progress`."""

    def say(self, text: str = "") -> None:
        say(text)

    def open_progress(self, total: int | None, what: str, **options: Any) -> Progress:
        return open_progress(total, what, **options)

    def add_selection_options(self, parser: argparse.ArgumentParser) -> None:
        add_selection_options(parser)

    def add_vllm_options(self, parser: argparse.ArgumentParser) -> None:
        add_vllm_options(parser)

    def add_checks_option(self, parser: argparse.ArgumentParser, what: str = "") -> None:
        add_checks_option(parser, what)

    def add_verbosity_options(self, parser: argparse.ArgumentParser) -> None:
        add_verbosity_options(parser)

    def add_expectation_options(self, parser: argparse.ArgumentParser) -> None:
        add_expectation_options(parser)

    def add_methods_file_option(self, parser: argparse.ArgumentParser) -> None:
        add_methods_file_option(parser)

    def add_input_limit_option(self, parser: argparse.ArgumentParser) -> None:
        add_input_limit_option(parser)

    def add_shard_option(self, parser: argparse.ArgumentParser, what: str) -> None:
        add_shard_option(parser, what)

    def add_progress_option(self, parser: argparse.ArgumentParser) -> None:
        add_progress_option(parser)


FRONT = Front()
