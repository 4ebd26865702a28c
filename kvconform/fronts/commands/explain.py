"""``kvconform explain``: run one scenario and show every step, request and group."""

from __future__ import annotations

import argparse
import shlex

from kvconform import __version__
from kvconform.errors import ExitStatus
from kvconform.fronts.options import run_request, say
from kvconform.harness import runner
from kvconform.harness.checks import DEFAULT_CHECKS
from kvconform.harness.session import Session, vllm_to_load
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.model.wording import count


class ExplainCommand(Subcommand):
    name = "explain"
    help = "run one scenario and show every step, request and group"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument(
            "scenario",
            help="FILE::ID (as every rerun prints it), a scenario file (of a matrix file, the "
            "variants that do not pass), or a scenario id or name under scenarios/",
        )
        cli.add_vllm_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_explain(args)


COMMAND = ExplainCommand()


def cmd_explain(args: argparse.Namespace) -> int:
    from kvconform.fronts.explain import explain, find_targets, to_draw

    # The first line comes at once: finding the scenario and vLLM's import take seconds.
    say(
        f"kvconform {__version__}: explaining {args.scenario}; loading "
        f"{vllm_to_load(args.vllm_src, args.vllm_release)}"
    )
    targets = find_targets(args.scenario)
    for err in targets.errors:
        say(f"ERROR {err}")
    if not targets.scenarios:
        return ExitStatus.BAD_INPUT if targets.errors else ExitStatus.NO_SELECTION
    session = Session(run_request(argparse.Namespace(**vars(args), paths=()), DEFAULT_CHECKS))
    results = [session.run_scenario(scenario) for scenario in targets.scenarios]
    drawn = to_draw(targets, results)
    if len(results) > 1:
        say(
            f"{count(len(results), 'scenario')}: "
            + ", ".join(f"{r.id} {r.verdict.value}" for r in results)
        )
        if not drawn:
            say(
                "none of them fails; name one to see its steps: kvconform explain "
                f"{shlex.quote(results[0].file + '::' + results[0].id)}"
            )
    for index in drawn:
        say("")
        say(explain(targets.scenarios[index], results[index], session.vllm.version))
    return runner.exit_status(results, len(targets.errors))
