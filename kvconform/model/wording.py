"""Counts and messages as the console prints them: "1 scenario", and prose shortened, never a number.

A failure message carries its figures ("holds 6 blocks, below the floor of 7 =
cdiv(min(96 + 1 + 3, 1024), 16)") and its prose (the floor rule's reason). Where a
line must be short (a summary line, a folded skip), :func:`shorten` drops the prose
first: parenthesised asides without a digit, then a digitless tail; it never cuts
through the figures, so a line may stay longer than asked when the figures need it.
"""

from __future__ import annotations

import re

__all__ = ["count", "plural", "shorten"]

_IRREGULAR = {"was": "were", "is": "are", "does": "do", "entry": "entries", "its": "their"}


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for one, its plural otherwise ("1 scenario", "2 scenarios"): ``many`` where
    given, else the irregular forms kvconform uses, else an ``s``."""
    if n == 1:
        return noun
    if many is not None:
        return many
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    head, _, last = noun.rpartition(" ")
    if last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "o", "u"):
        last = last[:-1] + "ies"
    else:
        last += "s"
    return f"{head} {last}" if head else last


def count(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and its noun, with a thousands separator: "1 scenario", "1,204 records"."""
    return f"{n:,} {plural(n, noun, many)}"


_DIGIT = re.compile(r"\d")
_ELLIPSIS = " ..."


def _asides(text: str) -> list[tuple[int, int]]:
    """The spans of the outermost balanced ``( ... )`` asides, in order."""
    spans, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            if depth == 0:
                start = index
            depth += 1
        elif char == ")" and depth:
            depth -= 1
            if depth == 0:
                spans.append((start, index + 1))
    return spans


def shorten(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters where the prose allows, every figure kept.

    First the asides in parentheses that hold no digit go, the last first (with the
    space before them); then the words after the last figure, at a clause boundary
    (``", "``, ``"; "``, ``": "``), marked with `` ...``. A text whose figures alone pass
    the limit is returned with its figures whole.
    """
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    for start, end in reversed(_asides(text)):
        if _DIGIT.search(text, start, end) is None:
            cut = start - 1 if start and text[start - 1] == " " else start
            text = text[:cut] + text[end:]
            if len(text) <= limit:
                return text
    last_digit = max((m.end() for m in _DIGIT.finditer(text)), default=0)
    room = limit - len(_ELLIPSIS)
    boundaries = [
        m.start() for m in re.finditer(r"[,;:] ", text) if last_digit <= m.start() <= room
    ]
    if boundaries:
        return text[: boundaries[-1]] + _ELLIPSIS
    if last_digit <= room:
        space = text.rfind(" ", last_digit, room + 1)
        if space > 0:
            return text[:space] + _ELLIPSIS
    return text
