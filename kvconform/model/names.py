"""Names that are strings everywhere: the base of the kind and party enums.

A scenario's kind and a party are closed sets of names (:mod:`kvconform.model.kinds`,
:mod:`kvconform.model.parties`), so they are enums; but they are also written into
recordings, report.json and the reports' text, read back from them as plain strings,
and compared with such strings. :class:`Name` is :class:`enum.StrEnum` (a ``str``
whose ``str()``, ``format()``, hash and equality are its value's): ``Party.LIVE ==
"live"``, ``f"{Party.LIVE}"`` is ``live`` and ``{"live": 1}[Party.LIVE]`` is 1, so
every file kvconform writes stays byte-identical (and, unlike ``StrEnum``, its ``repr`` is
the string's, for messages that quote a name). Python 3.10 (the oldest that
pyproject.toml's ``requires-python`` admits) has no ``StrEnum``: there the class is
built the way 3.11 builds it.
"""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """Python 3.11's ``enum.StrEnum``: members are their values, as strings."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last: list[str]) -> str:
            return name.lower()


class Name(StrEnum):
    """A closed set of names written as plain strings (a recording stores the value,
    never the enum: :mod:`kvconform.model.recording`).

    Its ``repr`` is its string's too (``'live'``, not ``<Party.LIVE: 'live'>``): messages
    quote names with ``!r`` ("did you mean 'scheduler'?"), and they read as before.
    """

    __repr__ = str.__repr__
