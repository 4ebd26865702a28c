"""What one probe means to a bisection: old, new, skip or abort.

A bisection looks for the first *new* candidate after *old* ones. Without
``--find-fix`` old means "conforms" and new "does not" (a regression hunt);
with ``--find-fix`` the two swap (looking for the fix). A vLLM that cannot be
exercised is skipped, as ``git bisect skip`` does; bad input aborts, because
every candidate would fail the same way.

The run statuses are kvconform's own (:class:`~kvconform.errors.ExitStatus`).
``git bisect
run`` reads a script's exit code as: 0 good (old), 125 skip, 1-127 otherwise
bad (new), and anything above 127 aborts the bisection -- hence
:data:`ABORT_CODE`.
"""

from __future__ import annotations

import enum

from kvconform.errors import ExitStatus

# git bisect run's reading of a script's exit code.
OLD_CODE, NEW_CODE, SKIP_CODE, ABORT_CODE = 0, 1, 125, 128


class Outcome(str, enum.Enum):
    OLD = "old"
    NEW = "new"
    SKIP = "skip"
    ABORT = "abort"


_GIT_CODES = {
    Outcome.OLD: OLD_CODE,
    Outcome.NEW: NEW_CODE,
    Outcome.SKIP: SKIP_CODE,
    Outcome.ABORT: ABORT_CODE,
}


def outcome_of(run_status: int | None, find_fix: bool) -> Outcome:
    """The meaning of a ``kvconform run`` exit status in a bisection."""
    if run_status == ExitStatus.CONFORM:
        return Outcome.NEW if find_fix else Outcome.OLD
    if run_status == ExitStatus.NONCONFORMANCE:
        return Outcome.OLD if find_fix else Outcome.NEW
    if run_status == ExitStatus.NOT_EXERCISED:
        return Outcome.SKIP
    return Outcome.ABORT  # bad input, no report (kvconform failed), an interrupt


def git_code(run_status: int | None, find_fix: bool) -> int:
    """The exit code ``git bisect run`` understands for a run status."""
    return _GIT_CODES[outcome_of(run_status, find_fix)]


def describe_status(run_status: int | None) -> str:
    names: dict[int, str] = {
        ExitStatus.CONFORM: "conform",
        ExitStatus.NONCONFORMANCE: "nonconform",
        ExitStatus.BAD_INPUT: "bad input",
        ExitStatus.NOT_EXERCISED: "not exercisable",
        ExitStatus.NO_SELECTION: "nothing selected",
    }
    return names.get(run_status if run_status is not None else -1, f"exit {run_status}")


def terms(find_fix: bool) -> tuple[str, str]:
    """(old, new) as git bisect's terms: good/bad, or broken/fixed when finding a fix."""
    return ("broken", "fixed") if find_fix else ("good", "bad")
