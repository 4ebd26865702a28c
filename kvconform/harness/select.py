"""``-k EXPR``: pick scenarios the way pytest's ``-k`` picks tests.

An expression of names joined by ``and``, ``or``, ``not`` and parentheses. A
name matches a scenario when it is a case-insensitive substring of the
scenario's id, one of its tags or its file's stem, so ``-k 'dflash and not
mamba'`` and ``-k 'eagle-chunked[eagle-k3]'`` both work.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvconform.errors import UsageError
from kvconform.model.scenario import Scenario

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
Matcher = Callable[[str], bool]


def compile_expression(expression: str) -> Callable[[Scenario], bool]:
    tokens = _TOKEN.findall(expression)
    if not tokens:
        raise UsageError(f"-k: empty expression {expression!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise UsageError(f"-k: expression {expression!r} ends too early")
        pos += 1
        return tokens[pos - 1]

    def either(a: Matcher, b: Matcher) -> Matcher:
        return lambda text: a(text) or b(text)

    def both(a: Matcher, b: Matcher) -> Matcher:
        return lambda text: a(text) and b(text)

    def parse_or() -> Matcher:
        left = parse_and()
        while peek() == "or":
            take()
            left = either(left, parse_and())
        return left

    def parse_and() -> Matcher:
        left = parse_not()
        while peek() == "and":
            take()
            left = both(left, parse_not())
        return left

    def parse_not() -> Matcher:
        token = take()
        if token == "not":
            inner = parse_not()
            return lambda text: not inner(text)
        if token == "(":
            inner = parse_or()
            if take() != ")":
                raise UsageError(f"-k: missing ')' in {expression!r}")
            return inner
        if token in (")", "and", "or"):
            raise UsageError(f"-k: unexpected {token!r} in {expression!r}")
        needle = token.lower()
        return lambda text: needle in text

    matcher = parse_or()
    if pos != len(tokens):
        raise UsageError(f"-k: unexpected {tokens[pos]!r} in {expression!r}")

    def matches(scenario: Scenario) -> bool:
        stem = scenario.file.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        return matcher(" ".join((scenario.id, *scenario.tags, stem)).lower())

    return matches
