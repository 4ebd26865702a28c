"""``kvconform doctor``: what the installed vLLM offers and what kvconform can exercise."""

from __future__ import annotations

import argparse

from kvconform.fronts.commands.methods import use_methods_file
from kvconform.fronts.options import say, vllm_from_args
from kvconform.harness.subcommand import CommandLine, Subcommand


class DoctorCommand(Subcommand):
    name = "doctor"
    help = "what the installed vLLM offers and what kvconform can exercise"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_methods_file_option(parser)
        cli.add_vllm_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        from kvconform.fronts.doctor import doctor

        methods_file = use_methods_file(args)
        return doctor(vllm_from_args(args), say, methods_file)


COMMAND = DoctorCommand()
