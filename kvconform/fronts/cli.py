"""The ``kvconform`` command line (``docs/cli.md``): a thin front over the subcommands.

Each subcommand is a :class:`~kvconform.harness.subcommand.Subcommand` in a module of
its own, which adds its options and runs (docs/architecture.md, "Adding a
subcommand"); this module only collects the registered ones (:data:`SUBCOMMANDS`)
and dispatches. Exit statuses are :class:`~kvconform.errors.ExitStatus`. Errors
meant for the user (a bad scenario, a vLLM lacking an API, a wrong flag) print one
message and no traceback.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvconform import __version__
from kvconform.bisect import command as bisect
from kvconform.errors import ExitStatus, KvconformError
from kvconform.fronts.commands import (
    check,
    coverage,
    doctor,
    engine,
    explain,
    export,
    judge,
    merge,
    methods,
    run,
)
from kvconform.fronts.options import FRONT, say
from kvconform.fuzz import command as fuzz
from kvconform.harness.loader.budget import LIMITS, Limits
from kvconform.harness.subcommand import Subcommand
from kvconform.matrix import command as matrix
from kvconform.mutate import command as mutate
from kvconform.realbugs import command as realbugs

# Every subcommand, in the order `kvconform --help` lists them. A new one is a module
# with a Subcommand of its own (COMMAND), added here.
SUBCOMMANDS: tuple[Subcommand, ...] = (
    run.COMMAND,
    judge.COMMAND,
    merge.COMMAND,
    coverage.COMMAND,
    check.COMMAND,
    bisect.COMMAND,
    matrix.COMMAND,
    methods.COMMAND,
    explain.COMMAND,
    export.COMMAND,
    doctor.COMMAND,
    engine.COMMAND,
    fuzz.COMMAND,
    realbugs.COMMAND,
    mutate.COMMAND,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvconform",
        description="Differential testing of vLLM's KV-cache block reservation.",
    )
    parser.add_argument("--version", action="version", version=f"kvconform {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        own = sub.add_parser(command.name, help=command.help, description=command.description)
        command.add_options(own, FRONT)
        own.set_defaults(subcommand=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage errors exit 2 already
        code = int(exc.code or 0)
        words = list(sys.argv[1:] if argv is None else argv)
        named = {command.name: command for command in SUBCOMMANDS}
        if code == 2 and words[:1] and words[0] in named:
            return named[words[0]].exit_code(code, None)
        return code
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    command: Subcommand = args.subcommand
    token = None
    try:
        if getattr(args, "input_limit", None):
            token = LIMITS.set(Limits().raised(args.input_limit))
        return int(command.run(args, FRONT))
    except KvconformError as exc:
        say(f"ERROR {exc}")
        return command.exit_code(exc.exit_status, args)
    except KeyboardInterrupt:
        say("interrupted")
        return ExitStatus.INTERRUPTED
    finally:
        if token is not None:
            LIMITS.reset(token)


def console_main() -> NoReturn:
    """The ``kvconform`` command: :func:`main`, then leave without tearing vLLM down.

    Once vLLM and torch are imported, the interpreter's own shutdown (freeing
    their modules and objects) took 5-20 s on the 2-core machine, longer than
    the whole default corpus (docs/benchmarks.md). By then the command has
    nothing left to do: every report is written and closed. So it runs the
    ``atexit`` handlers (logging's flush among them), flushes its streams and
    ends the process with ``os._exit``. In-process callers (tests, bisection)
    call :func:`main` and keep the ordinary shutdown.
    """
    status = main()
    if "torch" not in sys.modules:  # nothing heavy was imported: leave the ordinary way
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe has nothing more to say
            pass
    os._exit(status)


if __name__ == "__main__":
    console_main()
