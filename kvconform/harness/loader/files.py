"""Scenario files: finding them, reading them, and one result per run of the loader.

:func:`load_paths` returns the scenarios of every good file and every problem
of every bad one, so one broken file never hides the others; a file that is
not UTF-8 or cannot be read is one problem with its file (and byte offset).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvconform.errors import FileErrors, Location, ScenarioError
from kvconform.harness.loader.budget import LIMITS, Limits, check_bytes, check_yaml
from kvconform.harness.loader.document import parse
from kvconform.harness.loader.fields import PROBLEMS, Abandoned, attempt
from kvconform.harness.loader.matrix import expand_matrix
from kvconform.harness.yamlio import SAFE_LOADER, LineDict, load_yaml
from kvconform.model.scenario import (
    Scenario,
)

SCENARIO_SUFFIXES = (".yaml", ".yml")
# The problems listed for one file; past it, one more says how many are left.
MAX_FILE_ERRORS = 20


@dataclass
class LoadResult:
    scenarios: list[Scenario]
    errors: list[ScenarioError]


def discover(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files under ``paths`` (files are taken as given), sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in SCENARIO_SUFFIXES and is_scenario_file(p)
            )
        else:
            found.append(path)
    return found


def is_scenario_file(path: Path) -> bool:
    """YAML files in a scenario tree, minus expectations, methods files, mutation-campaign
    and explorer inputs (``explore-known.yaml``) and private files."""
    return not (
        path.name.startswith(("_", "."))
        or path.stem.startswith(("expectations", "mutation-", "explore-"))
        or path.stem == "methods"
    )


def load_paths(paths: Sequence[str | Path], limits: Limits | None = None) -> LoadResult:
    """The scenarios of every good file under ``paths``; every problem of the others.

    ``limits``: the budget of one document (:mod:`~kvconform.harness.loader.budget`),
    default the process's (``--input-limit``).
    """
    if limits is not None:
        token = LIMITS.set(limits)
        try:
            return load_paths(paths)
        finally:
            LIMITS.reset(token)
    result = LoadResult([], [])
    seen: dict[str, str] = {}
    for path in discover(paths):
        try:
            scenarios = load_file(path)
        except FileErrors as exc:
            result.errors.extend(exc.errors)
            continue
        except ScenarioError as exc:
            result.errors.append(exc)
            continue
        for scenario in scenarios:
            if scenario.id in seen:
                result.errors.append(
                    ScenarioError(
                        scenario.where.at("name"),
                        f"scenario id {scenario.id!r} is already used by {seen[scenario.id]}",
                    )
                )
                continue
            seen[scenario.id] = scenario.file
            result.scenarios.append(scenario)
    return result


def load_file(path: str | Path) -> list[Scenario]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(Location(str(path)), f"cannot read: {exc.strerror}") from None
    check_bytes(len(data), str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(
            Location(str(path), line),
            f"is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be "
            "decoded (save the file as UTF-8)",
        ) from None
    return load_text(text, str(path), default_name=path.stem)


def load_text(text: str, file: str, default_name: str = "scenario") -> list[Scenario]:
    """The scenarios of one file's text; its one problem, or :class:`FileErrors`."""
    problems: list[ScenarioError] = []
    token = PROBLEMS.set(problems)
    scenarios: list[Scenario] = []
    try:
        scenarios = _load(text, file, default_name)
    except Abandoned:
        pass
    except ScenarioError as error:
        problems.append(error)
    finally:
        PROBLEMS.reset(token)
    if not problems:
        return scenarios
    unique: dict[tuple[str, int | None, str | None], ScenarioError] = {}
    for problem in problems:  # a matrix repeats a problem in every combination
        where = problem.where
        unique.setdefault((where.file, where.line, where.field), problem)
    ordered = sorted(unique.values(), key=lambda e: e.where.line or 0)
    if len(ordered) > MAX_FILE_ERRORS:
        rest = ordered[MAX_FILE_ERRORS:]
        ordered = ordered[:MAX_FILE_ERRORS] + [
            ScenarioError(
                rest[0].where,
                f"and {len(rest)} more problems in this file from here on (the first "
                f"{MAX_FILE_ERRORS} are listed); fix those and load it again",
            )
        ]
    if len(ordered) == 1:
        raise ordered[0]
    raise FileErrors(ordered)


def _load(text: str, file: str, default_name: str) -> list[Scenario]:
    # Counted on the event stream first: an alias bomb must not reach the constructor.
    check_yaml(text, file, SAFE_LOADER)
    doc = load_yaml(text, file)
    where = Location(file, getattr(doc, "line", None) or 1)
    if not isinstance(doc, LineDict):
        raise ScenarioError(where, "a scenario file must be a mapping at the top level")
    matrix = doc.pop("matrix", None)
    if matrix is None:
        return [parse(doc, file, default_name, ())]
    scenarios = []
    for variant, params in expand_matrix(doc, matrix, Location(file, doc.line_of("matrix"))):
        scenario, ok = attempt(parse, variant, file, default_name, params)
        if ok:
            scenarios.append(scenario)
    return scenarios
