"""``kvconform methods``: vLLM's speculative methods and their lookahead, beside kvconform's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from kvconform.errors import ExitStatus, UsageError
from kvconform.fronts.options import say, vllm_from_args
from kvconform.harness.expectations import DEFAULT_SCENARIOS
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.model.methods import REGISTRY_FILE as BUILTIN_SOURCE


class MethodsCommand(Subcommand):
    name = "methods"
    help = "list vLLM's speculative methods and their lookahead"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument(
            "-k", type=int, default=3, help="num_speculative_tokens to evaluate (default 3)"
        )
        cli.add_methods_file_option(parser)
        cli.add_vllm_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_methods(args)


COMMAND = MethodsCommand()


def use_methods_file(args: argparse.Namespace) -> Path | None:
    """The methods file of ``methods`` and ``doctor`` (``--methods FILE``, else the
    nearest methods.yaml above scenarios/), its entries added to the registry."""
    from kvconform.harness.methods_file import use_methods_for

    explicit = getattr(args, "methods", None)
    if explicit is not None and not Path(explicit).is_file():
        raise UsageError(f"--methods: no such file: {explicit}")
    path, error = use_methods_for([DEFAULT_SCENARIOS], explicit)
    if error is not None:
        raise error
    return path


def aligned(
    header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: tuple[int, ...] = ()
) -> list[str]:
    """A plain-text table: each column as wide as its longest cell (the header's included),
    two spaces between columns, the columns in ``right`` aligned right, the last left ragged."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in (header, *rows):
        cells = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        cells[-1] = row[-1]
        lines.append("  ".join(cells).rstrip())
    return lines


def cmd_methods(args: argparse.Namespace) -> int:
    from kvconform.model.methods import METHODS, how_to_add, method_for

    methods_file = use_methods_file(args)
    vllm = vllm_from_args(args)
    k = args.k
    aliases = vllm.method_aliases()
    say(f"Speculative methods declared by vLLM {vllm.version} (lookahead for k={k}):")
    if methods_file is not None:
        say(f"(kvconform's registry plus the methods file {methods_file})")
    rows: list[tuple[str, ...]] = []
    status_code = ExitStatus.CONFORM
    missing: list[str] = []
    for method in vllm.declared_methods():
        canonical = aliases.get(method, method)
        theirs = vllm.lookahead(canonical, k)
        entry = method_for(canonical)
        ours = None if entry is None else entry.lookahead(k, True)
        if entry is None:
            status, status_code = "NO ENTRY", ExitStatus.NONCONFORMANCE
            if canonical not in missing:
                missing.append(canonical)
        elif theirs is None:
            status = "vLLM: n/a"
        elif theirs != ours:
            status, status_code = "MISMATCH", ExitStatus.NONCONFORMANCE
        else:
            status = "ok"
        shown = method if canonical == method else f"{method} (= {canonical})"
        formula = "? (no entry)"
        if entry is not None:
            formula = entry.rule.formula + (
                f"  [{entry.source}]" if entry.source != BUILTIN_SOURCE else ""
            )
        rows.append(
            (shown, "-" if theirs is None else str(theirs), "-" if ours is None else str(ours),
             status, formula)
        )  # fmt: skip
    for line in aligned(("method", "vLLM", "kvconform", "status", "rule"), rows, right=(1, 2)):
        say(line)
    declared = {aliases.get(m, m) for m in vllm.declared_methods()}
    for name, entry in METHODS.items():
        if entry.source != BUILTIN_SOURCE and name not in declared:
            say(f"note: {name} [{entry.source}] is not a method vLLM {vllm.version} declares")
    for name in missing:
        say("")
        for line in how_to_add(name, str(methods_file) if methods_file else None):
            say(line)
    return status_code
