"""``kvconform bisect``: pick the mode from the arguments and print as it goes."""

from __future__ import annotations

import argparse

from kvconform.errors import UsageError
from kvconform.harness.subcommand import CommandLine, Subcommand


def say(text: str = "") -> None:
    print(text, flush=True)


def bisect(args: argparse.Namespace) -> int:
    if args.releases:
        if args.good or args.bad:
            raise UsageError("--good/--bad go with --repo; --releases takes A..B")
        from kvconform.bisect.releases_mode import bisect_releases

        return bisect_releases(args, say)
    if args.pre:
        raise UsageError("--pre goes with --releases")
    from kvconform.bisect.git_mode import bisect_commits

    return bisect_commits(args, say)


class BisectCommand(Subcommand):
    name = "bisect"
    help = "find the release or commit where conformance changed"
    description = (
        "Bisect over PyPI releases (--releases A..B) or over the commits of a "
        "vLLM git checkout (--repo DIR --good REV --bad REV). See docs/bisect.md."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_selection_options(parser)
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument(
            "--releases", metavar="A..B", help="bisect the PyPI releases of vllm from A to B"
        )
        target.add_argument("--repo", metavar="DIR", help="bisect the commits of a vLLM checkout")
        parser.add_argument("--good", metavar="REV", help="with --repo: a commit that conforms")
        parser.add_argument("--bad", metavar="REV", help="with --repo: a commit that does not")
        parser.add_argument(
            "--find-fix",
            action="store_true",
            help="look for the first conforming release or commit after nonconforming ones",
        )
        parser.add_argument("--pre", action="store_true", help="with --releases: include pre-releases")
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="forget a saved bisection and cached probe results; list releases anew",
        )
        cli.add_checks_option(parser, "; every probe runs them (as the nightly that saw the failure did)")
        cli.add_expectation_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return bisect(args)


COMMAND = BisectCommand()
