"""Every ``kvconform`` subcommand goes through the one interface (kvconform/harness/subcommand.py).

A subcommand is a ``Subcommand`` in a module of its own (``COMMAND``), listed in
``SUBCOMMANDS`` of kvconform/fronts/cli.py, which only collects and dispatches
(docs/architecture.md, "Adding a subcommand"). These tests fail when a subcommand
is wired another way: a subparser the registry does not know, a module that sets
its own dispatch or adds parsers outside its ``add_options``, a ``Subcommand`` or a
``command.py`` module that is not registered.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
from functools import cache
from pathlib import Path

import pytest

from kvconform.fronts.cli import SUBCOMMANDS, build_parser, main
from kvconform.harness.subcommand import CommandLine, Subcommand

ROOT = Path(__file__).resolve().parents[1]
CLI = "kvconform/fronts/cli.py"
# Programs of their own (python -m kvconform.peer ...), not subcommands of kvconform.
OTHER_PROGRAMS = {"kvconform/peer/__main__.py"}
# The calls that wire a parser: only cli.py makes them, or a Subcommand for its own
# subcommands (`kvconform engine record`).
WIRING = {"add_subparsers", "add_parser", "set_defaults"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_parser_holds_exactly_the_registered_subcommands_in_order() -> None:
    parsers = _subparsers(build_parser())
    assert list(parsers) == [command.name for command in SUBCOMMANDS]
    for command in SUBCOMMANDS:
        # cli.py dispatches to the registered object; nothing else set its own.
        assert parsers[command.name].get_default("subcommand") is command, command.name
        assert parsers[command.name].get_default("handler") is None, command.name


def test_every_registered_subcommand_has_the_interface() -> None:
    names = [command.name for command in SUBCOMMANDS]
    assert len(set(names)) == len(names), names
    for command in SUBCOMMANDS:
        assert isinstance(command, Subcommand), command
        assert command.name and command.help, command
        for method in ("add_options", "run", "exit_code"):
            mine = inspect.signature(getattr(command, method))
            theirs = inspect.signature(getattr(Subcommand, method))
            assert list(mine.parameters) == list(theirs.parameters)[1:], (command.name, method)


def _subcommand_classes(tree: ast.Module) -> list[ast.ClassDef]:
    return [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id == "Subcommand" for b in node.bases)
    ]


def _wiring_outside(tree: ast.Module, allowed: list[ast.ClassDef]) -> list[tuple[int, str]]:
    """Calls of :data:`WIRING` methods in ``tree`` outside the classes ``allowed``."""
    inside = {id(node) for cls in allowed for node in ast.walk(cls)}
    return [
        (node.lineno, node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WIRING
        and id(node) not in inside
    ]


@cache
def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "kvconform").rglob("*.py"))
    }


def test_no_module_wires_a_subcommand_around_the_interface() -> None:
    wired = {
        file: found
        for file, tree in _modules().items()
        if file != CLI and file not in OTHER_PROGRAMS
        if (found := _wiring_outside(tree, _subcommand_classes(tree)))
    }
    assert wired == {}, (
        "these modules wire parsers themselves; a subcommand adds its options in its "
        f"Subcommand's add_options and is listed in SUBCOMMANDS of {CLI}: {wired}"
    )


def test_every_subcommand_module_is_registered() -> None:
    registered = {type(command).__module__ for command in SUBCOMMANDS}
    modules = {
        file.removesuffix(".py").replace("/", "."): tree
        for file, tree in _modules().items()
        if _subcommand_classes(tree)
        or file.endswith("/command.py")
        or file.startswith("kvconform/fronts/commands/")
        and not file.endswith("__init__.py")
    }
    assert set(modules) == registered, (
        f"subcommand modules not in SUBCOMMANDS of {CLI} (or registered without a "
        f"Subcommand): {sorted(set(modules) ^ registered)}"
    )
    for name, tree in modules.items():
        (cls,) = _subcommand_classes(tree)  # one subcommand per module
        command = importlib.import_module(name).COMMAND
        assert type(command).__name__ == cls.name, name


def test_the_scans_see_a_bypass(tmp_path: Path) -> None:
    # The scans above must be able to fail: a module adding its parser and handler itself.
    bypass = ast.parse(
        "def add(sub):\n"
        "    parser = sub.add_parser('explore')\n"
        "    parser.set_defaults(handler=run)\n"
        "class ExploreCommand(Subcommand):\n"
        "    def add_options(self, parser, cli):\n"
        "        parser.add_subparsers(dest='x')\n"
    )
    assert _wiring_outside(bypass, _subcommand_classes(bypass)) == [
        (2, "add_parser"),
        (3, "set_defaults"),
    ]


class _Recorded(Subcommand):
    """A subcommand that records what the command line hands it."""

    name = "recorded"
    help = "a test's subcommand"

    def __init__(self) -> None:
        self.seen: list[object] = []

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        cli.add_verbosity_options(parser)
        parser.add_argument("--flag", action="store_true")

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        self.seen.append((args.flag, args.verbose))
        return 7


def test_a_registered_subcommand_is_parsed_and_run_by_main(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the docs promise a new subcommand (explore): one entry, and main runs it.
    from kvconform.fronts import cli

    recorded = _Recorded()
    monkeypatch.setattr(cli, "SUBCOMMANDS", (*SUBCOMMANDS, recorded))
    assert main(["recorded", "--flag", "-v"]) == 7
    assert recorded.seen == [(True, 1)]
    assert main(["recorded", "--no-such-option"]) == 2  # argparse's usage error


def test_check_keeps_git_bisects_codes_for_usage_errors() -> None:
    # Through exit_code: under `git bisect run`, 2 would mark the commit bad.
    assert main(["check", "--no-such-option"]) == 128
    assert main(["run", "--no-such-option"]) == 2
