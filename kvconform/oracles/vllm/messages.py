"""How vLLM's errors read: the one line of an error that says why.

vLLM's configs are pydantic dataclasses, so a refused setting arrives as a
``ValidationError`` whose text is a header (``1 validation error for
SpeculativeConfig``), the field, the reason (``Value error, ...`` for a
validator's own ``ValueError``) with pydantic's ``[type=...]`` suffix, and last a
link to pydantic's documentation. A report wants the reason. Scheduler mode
reads it from the exception it caught; engine mode from the engine child's
output, where it is the last exception of a Python traceback, followed, at
times, by lines the process printed while exiting.
"""

from __future__ import annotations

import re

__all__ = ["first_line"]

_TRACEBACK = "Traceback (most recent call last):"
_PYDANTIC_LINK = "For further information visit https://errors.pydantic.dev/"
_HEADER = re.compile(r"(?:^|: )\d+ validation errors? for \S+$")
# What a validator's exception becomes in pydantic's text.
_PREFIXES = ("Value error, ", "Assertion failed, ")
# A reason longer than this is cut (vLLM lists every supported architecture in one).
LONGEST = 400


def first_line(error: BaseException | str) -> str:
    """The line of ``error`` (an exception, or a process's output) that says why it failed.

    For a pydantic ``ValidationError``: the first error's reason, without pydantic's
    ``Value error,`` prefix, ``[type=...]`` suffix and documentation link, after its
    field when it has one. For a traceback: the last exception's line
    (``Type: message``), the frames and whatever was printed after it skipped.
    Otherwise the first non-empty line; an exception with no message is its type's name.
    """
    text = str(error)
    lines = [line.rstrip() for line in text.splitlines()]
    if _TRACEBACK in text:
        lines = _last_exception(lines)
    lines = [line for line in lines if line.strip() and _PYDANTIC_LINK not in line]
    for i, line in enumerate(lines):
        if " [type=" not in line:
            continue
        reason = line.split(" [type=")[0].strip()
        for prefix in _PREFIXES:
            reason = reason.removeprefix(prefix)
        field = lines[i - 1].strip() if i > 0 else ""
        if field and not _HEADER.search(field) and " [type=" not in field:
            reason = f"{field}: {reason}"
        return _short(reason)
    if lines:
        return _short(lines[0].strip())
    return type(error).__name__ if isinstance(error, BaseException) else ""


def _last_exception(lines: list[str]) -> list[str]:
    """The lines from the last traceback's exception line on (its frames dropped)."""
    start = max(i for i, line in enumerate(lines) if line.strip() == _TRACEBACK) + 1
    for i in range(start, len(lines)):
        # Frames and their source lines are indented; the exception line is not.
        if lines[i] and not lines[i][0].isspace():
            return lines[i:]
    return lines[start:]


def _short(line: str) -> str:
    return line if len(line) <= LONGEST else line[: LONGEST - 2].rstrip() + " …"
