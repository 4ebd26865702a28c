"""What a peer run against a mutated vLLM tree says: killed, survived, broken or timeout.

The run is ``pytest -x`` over the test files that reach the mutated code,
with the baseline's failures deselected, so on the unmodified tree it passes.
Against a mutated tree:

``killed``
    a test failed (in its setup, call or teardown): vLLM's tests noticed.
``survived``
    every selected test passed or skipped.
``broken``
    the tree could not be tested: a test file failed to import or collect, the
    first failure is an ``ImportError``/``SyntaxError`` (a mutant that does not
    load is no evidence about the tests), or pytest itself failed to start.
``timeout``
    the run ended by its time limit before any test failed, or the first
    failure is pytest-timeout ending a test that hung.

The first failure (node id and the first line of its message) is kept for the
report; :func:`decide` is a pure function of the run's records.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

_UNLOADABLE = re.compile(
    r"^(E\s+)?(ImportError|ModuleNotFoundError|SyntaxError|IndentationError|TabError)\b"
)

_TIMED_OUT = re.compile(r"^(Failed: )?Timeout( >| \()")


class Verdict(str, enum.Enum):
    KILLED = "killed"
    SURVIVED = "survived"
    BROKEN = "broken"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Failure:
    nodeid: str
    message: str

    def __str__(self) -> str:
        return f"{self.nodeid}: {self.message}" if self.message else self.nodeid


def first_failure(records: list[dict[str, Any]]) -> tuple[str, Failure] | None:
    """("collect" | "test", the failure) of the first failing record, or None."""
    for record in records:
        if record.get("outcome") == "failed":
            return record["kind"], Failure(record["nodeid"], record.get("message", ""))
    return None


def decide(
    records: list[dict[str, Any]], returncode: int | None, output_tail: str = ""
) -> tuple[Verdict, Failure | None]:
    """The verdict of one run and its first failure (None when nothing failed)."""
    found = first_failure(records)
    if found is not None:
        kind, failure = found
        if _TIMED_OUT.match(failure.message):  # pytest-timeout ended a test that hung
            return Verdict.TIMEOUT, failure
        if kind == "collect" or _UNLOADABLE.match(failure.message):
            return Verdict.BROKEN, failure
        return Verdict.KILLED, failure
    if returncode is None:
        return Verdict.TIMEOUT, None
    if returncode in (0, 5):  # 5: every test deselected or none collected
        return Verdict.SURVIVED, None
    lines = [line for line in output_tail.splitlines() if line.strip()]
    return Verdict.BROKEN, Failure("pytest", lines[-1] if lines else f"exit status {returncode}")


# The four cells of "who catches it", kvconform beside vLLM's own tests, in report order
# (kvconform mutate --peer-tests and kvconform realbugs --peer-tests).
CATCH_CELLS = ("both", "kvconform only", "vLLM's tests only", "neither")


def catch_cell(ours: bool, theirs: bool) -> str:
    """The cell of :data:`CATCH_CELLS` for one mutant or bug: caught by kvconform
    (``ours``), by vLLM's own tests (``theirs``)."""
    if ours:
        return "both" if theirs else "kvconform only"
    return "vLLM's tests only" if theirs else "neither"
