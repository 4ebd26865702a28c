"""The campaign's inputs kept in the repository: target functions and known equivalent mutants.

``scenarios/mutation-targets.yaml`` lists the vLLM functions whose mutants the
campaign makes; users extend it with their own. Each entry::

    - module: vllm.v1.worker.gpu.warmup     # a module of vLLM's Python tree
      function: _reserved_block_count        # a function or Class.method defined there
      focus: [block_count]                   # optional: only statements naming these
      why: the warmup's prediction of what allocate_slots holds

``scenarios/mutation-equivalents.yaml`` lists mutants that no scenario can kill
because they do not change what vLLM reserves, each with the argument::

    - id: vllm.v1.worker.gpu.warmup:_reserved_block_count:core/NumberReplacer:3
      reason: ...

A target a vLLM release lacks is reported as missing, not an error; a malformed
file is a :class:`~kvconform.errors.ScenarioError` naming file, line and field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.yamlio import LineDict, LineList, load_yaml

DEFAULT_TARGETS = "scenarios/mutation-targets.yaml"
DEFAULT_EQUIVALENTS = "scenarios/mutation-equivalents.yaml"


@dataclass(frozen=True)
class Target:
    module: str
    function: str
    focus: tuple[str, ...] = ()
    why: str = ""
    line: int | None = None

    @property
    def key(self) -> str:
        return f"{self.module}:{self.function}"


@dataclass(frozen=True)
class Equivalent:
    id: str
    reason: str
    line: int | None = None


def _entries(path: Path, top: str) -> tuple[str, LineList]:
    text = path.read_text(encoding="utf-8")
    data = load_yaml(text, str(path))
    if data is None:
        return text, LineList()
    if not isinstance(data, LineDict) or top not in data:
        raise ScenarioError(Location(str(path), 1, top), f"expected a mapping with a {top!r} list")
    entries = data[top]
    if not isinstance(entries, LineList):
        raise ScenarioError(Location(str(path), data.line_of(top), top), "must be a list")
    return text, entries


def _string(entry: LineDict, key: str, where: Location, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(where.at(key, entry.line_of(key)), "must be a non-empty string")
    return value.strip()


def _check_keys(entry: Any, allowed: set[str], where: Location) -> LineDict:
    if not isinstance(entry, LineDict):
        raise ScenarioError(where, "each entry must be a mapping")
    for key in entry:
        if key not in allowed:
            raise ScenarioError(
                where.at(key, entry.line_of(key)),
                f"unknown field (expected one of {', '.join(sorted(allowed))})",
            )
    return entry


def load_targets(path: str | Path) -> list[Target]:
    path = Path(path)
    _, entries = _entries(path, "targets")
    targets: list[Target] = []
    seen: dict[str, int | None] = {}
    for index, raw in enumerate(entries):
        where = Location(str(path), entries.line_of(index))
        entry = _check_keys(raw, {"module", "function", "focus", "why"}, where)
        focus = entry.get("focus", [])
        if not isinstance(focus, list) or not all(isinstance(f, str) and f for f in focus):
            raise ScenarioError(
                where.at("focus", entry.line_of("focus")), "must be a list of identifiers"
            )
        target = Target(
            _string(entry, "module", where),
            _string(entry, "function", where),
            tuple(focus),
            _string(entry, "why", where, required=False),
            entry.line,
        )
        if target.key in seen:
            raise ScenarioError(
                where.at("function", entry.line_of("function")),
                f"{target.key} is listed twice (first on line {seen[target.key]})",
            )
        seen[target.key] = entry.line
        targets.append(target)
    return targets


def load_equivalents(path: str | Path) -> dict[str, Equivalent]:
    path = Path(path)
    if not path.exists():
        return {}
    _, entries = _entries(path, "equivalents")
    found: dict[str, Equivalent] = {}
    for index, raw in enumerate(entries):
        where = Location(str(path), entries.line_of(index))
        entry = _check_keys(raw, {"id", "reason"}, where)
        mutant_id = _string(entry, "id", where)
        if mutant_id.count(":") != 3:
            raise ScenarioError(
                where.at("id", entry.line_of("id")),
                "a mutant id is module:function:operator:occurrence",
            )
        if mutant_id in found:
            raise ScenarioError(where.at("id", entry.line_of("id")), f"{mutant_id} is listed twice")
        found[mutant_id] = Equivalent(mutant_id, _string(entry, "reason", where), entry.line)
    return found
