"""The budget of one scenario document: what a file may ask for before anything is expanded.

A YAML file is small, but what it describes need not be: an alias bomb (each
list made of aliases to the one before it) or ``repeat: 1000000000`` would make
the loader build or walk billions of objects before any field could be judged,
and the run would hang and grow for minutes. So the document's size is counted
where it is cheap, before it is expanded:

* the file's bytes, before it is decoded;
* the YAML nodes, each alias counted as the nodes it stands for, and the nesting
  depth, on PyYAML's event stream (nothing is composed or constructed: an alias
  adds the size its anchor's node was counted at, so a bomb is counted in one pass
  without being expanded);
* the combinations of ``matrix``, as the product of its lists' lengths;
* the steps after ``repeat``, as the sum of the products of the repeat counts;
* the requests, and the tokens one request or ``max_model_len`` may name, and the
  pool's blocks (vLLM builds a Python object per token and per block).

Past a limit the file is one input error (exit 2) naming its file, line, field and
the limit; the other files still run. :class:`Limits` holds the defaults, which
``docs/cli.md`` documents; ``kvconform run --input-limit NAME=N`` raises one for a
deliberate stress scenario (:data:`LIMITS`, set once per process by the front).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, fields, replace
from typing import Any

import yaml

from kvconform.errors import Location, OverBudget, ScenarioError, UsageError


@dataclass(frozen=True)
class Limits:
    """The most one scenario document may ask for (``docs/cli.md``, "Input limits")."""

    bytes: int = 4 * 1024 * 1024  # the file, before it is decoded
    yaml_nodes: int = 200_000  # scalars, lists and mappings, each alias counted expanded
    yaml_depth: int = 64  # lists and mappings inside one another
    matrix_cases: int = 1_000  # combinations of one file's matrix
    steps: int = 20_000  # a trajectory's steps after repeat
    requests: int = 1_000  # requests of one scenario
    tokens: int = 1_000_000  # prompt, encoder or output tokens of a request; max_model_len
    blocks: int = 200_000  # the pool's blocks (model.num_blocks and host pools)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def raised(self, settings: list[str]) -> Limits:
        """These limits with ``NAME=N`` settings applied (``--input-limit``)."""
        limits = self
        for setting in settings:
            name, _, value = setting.partition("=")
            name = name.strip().replace("-", "_")
            if name not in self.names():
                raise UsageError(
                    f"--input-limit {setting}: no limit {name!r}; limits: {', '.join(self.names())}"
                )
            try:
                number = int(value)
            except ValueError:
                number = 0
            if number < 1:
                raise UsageError(f"--input-limit {setting}: N must be a positive integer")
            limits = replace(limits, **{name: number})
        return limits


LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar(
    "kvconform_input_limits", default=Limits()  # noqa: B039 - frozen, never mutated
)


def over(where: Location, what: str, count: int, name: str) -> OverBudget:
    limit = getattr(LIMITS.get(), name)
    return OverBudget(
        where,
        f"{what} come to {count:,}, past the limit of {limit:,} ({name}); a deliberate "
        f"stress scenario raises it with kvconform run --input-limit {name}=N",
    )


def check_bytes(size: int, file: str) -> None:
    if size > LIMITS.get().bytes:
        raise over(Location(file, 1), "the file's bytes", size, "bytes")


def check_count(count: int, where: Location, what: str, name: str) -> None:
    """``count`` of ``what`` within the limit ``name``, or an :class:`OverBudget` at ``where``."""
    if count > getattr(LIMITS.get(), name):
        raise over(where, what, count, name)


class _Frame:
    """A list or mapping being counted: its size so far and the path to it."""

    __slots__ = ("anchor", "is_mapping", "key", "next_is_key", "index", "size", "path")

    def __init__(self, anchor: str | None, is_mapping: bool, path: str) -> None:
        self.anchor, self.is_mapping, self.path = anchor, is_mapping, path
        self.key: str | None = None
        self.next_is_key = True
        self.index = 0
        self.size = 1

    def child_path(self) -> str:
        if self.is_mapping:
            part = self.key if self.key is not None else "?"
            return f"{self.path}.{part}" if self.path else part
        return f"{self.path}[{self.index}]"

    def took(self, size: int, scalar: Any = None) -> None:
        """A child of ``size`` nodes ends; a mapping's key names the next value."""
        self.size += size
        if self.is_mapping:
            if self.next_is_key:
                self.key = scalar if isinstance(scalar, str) else None
            self.next_is_key = not self.next_is_key
        else:
            self.index += 1


def check_yaml(text: str, file: str, loader: type) -> None:
    """The document's nodes (aliases expanded, by count only) and depth within the limits.

    Reads PyYAML's events, never a node graph or an object: an alias adds the size
    its anchor was counted at. A syntax error is left to the loader, which reports it
    with its line; a recursive alias (an anchor used inside itself) is refused here.
    """
    limits = LIMITS.get()
    stack: list[_Frame] = []
    sizes: dict[str, int] = {}
    total = 0

    def location(event: Any, path: str) -> Location:
        return Location(file, event.start_mark.line + 1, path or None)

    def ended(event: Any, size: int, anchor: str | None, scalar: Any = None) -> None:
        nonlocal total
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            parent = stack[-1]
            parent.took(size, scalar)
            count = sum(frame.size for frame in stack)
        else:
            total += size
            count = total
        if count > limits.yaml_nodes:
            path = stack[-1].path if stack else ""
            raise over(location(event, path), "the YAML nodes (aliases expanded)", count, "yaml_nodes")

    try:
        for event in yaml.parse(text, Loader=loader):
            path = stack[-1].child_path() if stack else ""
            if isinstance(event, yaml.ScalarEvent):
                ended(event, 1, event.anchor, event.value)
            elif isinstance(event, yaml.AliasEvent):
                if any(frame.anchor == event.anchor for frame in stack):
                    raise ScenarioError(
                        location(event, path),
                        f"the alias *{event.anchor} is used inside its own anchor "
                        f"&{event.anchor}: a recursive structure no scenario field takes",
                    )
                ended(event, sizes.get(event.anchor or "", 1), None)
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= limits.yaml_depth:
                    raise over(
                        location(event, path),
                        "lists and mappings nested in one another",
                        len(stack) + 1,
                        "yaml_depth",
                    )
                stack.append(_Frame(event.anchor, isinstance(event, yaml.MappingStartEvent), path))
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                frame = stack.pop()
                ended(event, frame.size, frame.anchor)
    except yaml.YAMLError:
        return  # the loader reports it, with its line
