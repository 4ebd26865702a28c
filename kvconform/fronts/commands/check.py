"""``kvconform check``: ``run`` with git bisect's exit codes."""

from __future__ import annotations

import argparse

from kvconform.bisect.outcome import git_code
from kvconform.errors import KvconformError
from kvconform.fronts.commands.run import cmd_run
from kvconform.fronts.options import say
from kvconform.harness.subcommand import CommandLine, Subcommand


class CheckCommand(Subcommand):
    name = "check"
    help = "run scenarios and exit like a `git bisect run` script (0 good, 1 bad, 125 skip)"
    description = (
        "Run the selected scenarios against one vLLM and exit with git bisect's "
        "codes: 0 conform, 1 nonconformance (whatever input errors came with it), 125 vLLM "
        "could not be exercised (skip), 128 bad input with nothing failed, or usage (aborts "
        "git bisect). With --find-fix, 0 and 1 swap. Usable as "
        "`git bisect run kvconform check --vllm-src . /abs/path/scenarios/...`. Known "
        "divergences in the nearest expectations.yaml count as conforming, as in `run`."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_selection_options(parser)
        cli.add_vllm_options(parser)
        parser.add_argument(
            "--find-fix", action="store_true", help="exit 0 on nonconformance and 1 on conformance"
        )
        parser.add_argument("--report-dir", metavar="DIR", help="write reports here (default: none)")
        cli.add_checks_option(parser)
        cli.add_expectation_options(parser)
        cli.add_verbosity_options(parser)
        cli.add_progress_option(parser)
        cli.add_input_limit_option(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_check(args)

    def exit_code(self, status: int, args: argparse.Namespace | None) -> int:
        # Under `git bisect run`, 2 (bad input, usage) would mark the commit bad: abort.
        return git_code(status, bool(getattr(args, "find_fix", False)))


COMMAND = CheckCommand()


def cmd_check(args: argparse.Namespace) -> int:
    """``run`` with git-bisect exit codes: 0 old, 1 new, 125 skip, 128 abort."""
    args.update_expectations = False
    try:
        status = cmd_run(args)
    except KvconformError as exc:
        say(f"ERROR {exc}")
        status = exc.exit_status
    code = git_code(status, args.find_fix)
    say(
        f"check: exit {code} for git bisect (run status {status}{', --find-fix' if args.find_fix else ''})"
    )
    return code
