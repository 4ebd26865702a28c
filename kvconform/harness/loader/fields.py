"""Reading a scenario file's fields: one problem per mistake, the rest still read.

:class:`Fields` reads a mapping field by field (integers, flags, texts) and
reports what is left over as unknown, naming the field probably meant. The
problems of the file being loaded are collected (:data:`PROBLEMS`,
:func:`report`), so that one mistake never hides the next; :func:`attempt`
reads a part and records its problem instead of raising, and :class:`Abandoned`
marks a part left unread because a part it needs is broken.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from kvconform.errors import Abandoned, FileErrors, Location, ScenarioError, did_you_mean
from kvconform.harness.loader.budget import check_count
from kvconform.harness.yamlio import LineDict

# The problems of the file being loaded; None outside load_text (then the first raises).
PROBLEMS: contextvars.ContextVar[list[ScenarioError] | None] = contextvars.ContextVar(
    "kvconform_loader_problems", default=None
)


def report(error: ScenarioError) -> None:
    """Record a problem and go on reading, or raise it when nothing collects."""
    problems = PROBLEMS.get()
    if problems is None:
        raise error
    problems.append(error)


def attempt(read: Callable[..., Any], *args: Any, fallback: Any = None) -> tuple[Any, bool]:
    """``(read(*args), True)``; ``(fallback, False)``, the problem recorded, if it raises."""
    try:
        return read(*args), True
    except Abandoned:
        pass
    except FileErrors as errors:
        for error in errors.errors:
            report(error)
    except ScenarioError as error:
        report(error)
    return fallback, False


def suggestion(word: str, candidates: Iterable[str]) -> str:
    meant = did_you_mean(word, candidates)
    return f" (did you mean {meant!r}?)" if meant else ""


class Fields:
    """Reads a mapping field by field and complains about what is left over."""

    def __init__(self, mapping: Any, where: Location, path: str) -> None:
        if mapping is None:
            raise ScenarioError(where.at(path), "is empty: nothing follows the colon")
        if not isinstance(mapping, LineDict):
            raise ScenarioError(where.at(path), f"must be a mapping, not {as_written(mapping)}")
        self.mapping = mapping
        self.where = where
        self.path = path
        # Every field allowed here: those read, and those allow() names without reading.
        self.known: set[str] = set()

    def allow(self, *keys: str) -> None:
        """Fields allowed here that this reading does not look at (listed as known)."""
        self.known.update(keys)

    def unknown(self) -> list[str]:
        return [k for k in self.mapping if k not in self.known]

    def required(self, key: str, what: str = "is required") -> ScenarioError:
        """``key`` is missing; name the unknown field that was probably meant for it."""
        for typo in self.unknown():
            if did_you_mean(typo, [key]):
                line = self.mapping.line_of(typo)
                return ScenarioError(
                    self.at(key),
                    f"{what}; line {line} has the unknown field {typo!r}: did you mean {key!r}?",
                )
        return ScenarioError(self.at(key), what)

    def at(self, key: str) -> Location:
        return self.where.at(f"{self.path}.{key}" if self.path else key, self.mapping.line_of(key))

    def raw(self, key: str, default: Any = None) -> Any:
        self.known.add(key)
        return self.mapping.get(key, default)

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 1, limit: str | None = None
    ) -> int:
        """An integer of at least ``minimum``; ``limit`` names the input limit it counts
        against (:class:`~kvconform.harness.loader.budget.Limits`: tokens, blocks)."""
        value = self.raw(key, default)
        if value is None:
            raise self.required(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(self.at(key), f"must be an integer, not {as_written(value)}")
        if value < minimum:
            raise ScenarioError(self.at(key), f"must be at least {minimum}, not {value}")
        if limit is not None:
            check_count(value, self.at(key), f"the {limit} it names", limit)
        return value

    def optional_int(
        self, key: str, *, minimum: int = 0, limit: str | None = None
    ) -> int | None:
        self.known.add(key)
        if self.mapping.get(key) is None:
            return None
        return self.integer(key, minimum=minimum, limit=limit)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ScenarioError(self.at(key), f"must be true or false, not {as_written(value)}")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, default)
        if value is None:
            raise self.required(key)
        if not isinstance(value, str) or not value:
            raise ScenarioError(self.at(key), f"must be a non-empty string, not {value!r}")
        return value

    def optional_text(self, key: str) -> str | None:
        """None where the key is absent; otherwise a non-empty string (a request's name)."""
        if self.raw(key) is None:
            return None
        return self.text(key)

    def done(self) -> None:
        """Every field not allowed here is a problem (each recorded, reading goes on)."""
        known = ", ".join(sorted(self.known))
        for key in self.unknown():
            report(
                ScenarioError(
                    self.at(key),
                    f"unknown field{suggestion(key, self.known)} (known here: {known})",
                )
            )


def as_written(value: Any) -> str:
    """A value as the file's author wrote it, not as Python prints it."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def empty_mapping() -> LineDict:
    empty = LineDict()
    empty.line, empty.key_lines = None, {}
    return empty


def releases(fields: Fields) -> str | None:
    """The optional ``vllm`` field: a version specifier naming vLLM releases."""
    raw = fields.raw("vllm")
    if raw is None:
        return None
    try:
        SpecifierSet(str(raw))
    except InvalidSpecifier:
        raise ScenarioError(
            fields.at("vllm"), f"not a version specifier: {raw!r} (e.g. '>=0.33.0')"
        ) from None
    return str(raw)
