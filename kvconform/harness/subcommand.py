"""The one interface of a ``kvconform`` subcommand (docs/architecture.md, "Adding a subcommand").

As each pytest plugin adds its options through one hook (``pytest_addoption``) and
pytest only collects the plugins, each subcommand is a :class:`Subcommand` in a
module of its own (``COMMAND``), which adds its options and runs through this
interface; ``kvconform.fronts.cli`` only collects the registered ones
(``SUBCOMMANDS``, in the order ``kvconform --help`` lists them) and dispatches.

Most subcommand modules sit below the fronts in the layers (``kvconform.bisect``,
``kvconform.matrix``, ...), so they cannot import the fronts; what the command line
shares with every subcommand (the options several commands take, its way of
printing, its progress display) reaches them as a :class:`CommandLine` argument.
This module lives below every package that holds a subcommand, so that each can
import it.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CommandLine(Protocol):
    """What the command line lends each subcommand (``kvconform.fronts.options.FRONT``)."""

    def say(self, text: str = "") -> None:
        """Print a line now (flushed: a CI log shows it at once)."""
        ...

    def open_progress(
        self, total: int | None, what: str, **options: Any
    ) -> AbstractContextManager[Any]:
        """The front's progress display (``kvconform.fronts.progress.open_progress``)."""
        ...

    # The options several subcommands share, each worded once (docs/cli.md).
    def add_selection_options(self, parser: argparse.ArgumentParser) -> None: ...

    def add_vllm_options(self, parser: argparse.ArgumentParser) -> None: ...

    def add_checks_option(self, parser: argparse.ArgumentParser, what: str = "") -> None: ...

    def add_verbosity_options(self, parser: argparse.ArgumentParser) -> None: ...

    def add_expectation_options(self, parser: argparse.ArgumentParser) -> None: ...

    def add_methods_file_option(self, parser: argparse.ArgumentParser) -> None: ...

    def add_input_limit_option(self, parser: argparse.ArgumentParser) -> None: ...

    def add_shard_option(self, parser: argparse.ArgumentParser, what: str) -> None: ...

    def add_progress_option(self, parser: argparse.ArgumentParser) -> None: ...


@runtime_checkable
class Subcommand(Protocol):
    """One ``kvconform`` subcommand. A module holding one defines a class deriving from
    this one (which gives it the defaults below) and ``COMMAND``, its instance."""

    # The word after ``kvconform``, and argparse's help and description of it.
    name: str
    help: str
    description: str | None = None

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        """Add this subcommand's options (and subcommands of its own) to its ``parser``."""
        ...

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        """Do the work; the exit status (``kvconform.errors.ExitStatus``, or the codes
        this subcommand documents)."""
        ...

    def exit_code(self, status: int, args: argparse.Namespace | None) -> int:
        """The exit code for a status the command line decided instead of :meth:`run`: a
        user error raised out of it (``KvconformError.exit_status``) or a usage error
        argparse found (2; ``args`` is None then). The status itself, unless the
        subcommand has codes of its own (``check``: git bisect's)."""
        return status
