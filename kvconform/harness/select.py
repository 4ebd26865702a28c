"""Picking scenarios: ``-k EXPR``, ``FILE::ID`` and ``--shard I/N``.

``-k`` works the way pytest's ``-k`` picks tests: an expression of names joined
by ``and``, ``or``, ``not`` and parentheses. A name matches a scenario when it is
a case-insensitive substring of the scenario's id, one of its tags, its
speculative method or its file's stem, so ``-k 'dflash and not mamba'`` and
``-k 'eagle-chunked[eagle-k3]'`` both work.

``FILE::ID`` (pytest's node-id syntax) names one scenario of a file exactly, by
its id; the rerun commands every report prints use it, because a ``-k`` substring
of one matrix case's id can match its neighbours too.

``--shard I/N`` keeps the scenarios whose id hashes to shard ``I`` of ``N``
(1-based). The hash is SHA-256 of the id, so every machine of a CI job's
parallel steps puts a scenario in the same shard whatever order it loaded the
files in, and a new scenario moves no other one. Buildkite's
``BUILDKITE_PARALLEL_JOB`` (0-based) and ``BUILDKITE_PARALLEL_JOB_COUNT`` give the
shard when ``--shard`` is not given.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvconform.errors import ScenarioError, UsageError
from kvconform.harness.loader import load_paths
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
        method = (scenario.speculative.method,) if scenario.speculative else ()
        return matcher(" ".join((scenario.id, *scenario.tags, *method, stem)).lower())

    return matches


# -- FILE::ID ---------------------------------------------------------------------------

NODE_SEPARATOR = "::"


def split_node(path: str) -> tuple[str, str | None]:
    """``("a.yaml", "id")`` for ``a.yaml::id``; ``(path, None)`` for a plain path."""
    file, sep, scenario_id = path.partition(NODE_SEPARATOR)
    return (file, scenario_id) if sep else (path, None)


# -- shards -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based), and where that came from."""

    index: int
    count: int
    source: str = "--shard"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, scenario_id: str) -> bool:
        return shard_of(scenario_id, self.count) == self.index


def shard_of(key: str, count: int) -> int:
    """The shard (1-based) a scenario id falls in: the same on every machine."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def parse_shard(text: str, option: str = "--shard") -> Shard:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise UsageError(f"{option}: expected I/N (e.g. 2/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"{option}: shard {index}/{count}: I must be between 1 and N")
    return Shard(index, count, option)


def shard_from(text: str | None, environ: Mapping[str, str] | None = None) -> Shard | None:
    """The shard ``--shard`` names, else Buildkite's parallel job, else none."""
    if text:
        return parse_shard(text)
    env = os.environ if environ is None else environ
    job, count = env.get("BUILDKITE_PARALLEL_JOB"), env.get("BUILDKITE_PARALLEL_JOB_COUNT")
    if job is None or count is None:
        return None
    if not (job.strip().isdigit() and count.strip().isdigit()):
        raise UsageError(
            f"BUILDKITE_PARALLEL_JOB={job!r} / BUILDKITE_PARALLEL_JOB_COUNT={count!r}: "
            "expected two integers"
        )
    # Buildkite counts jobs from 0; shards count from 1.
    shard = parse_shard(f"{int(job) + 1}/{int(count)}", "BUILDKITE_PARALLEL_JOB")
    return Shard(shard.index, shard.count, "BUILDKITE_PARALLEL_JOB")


# -- the selection ----------------------------------------------------------------------


@dataclass
class Selection:
    """What a run selected, and how much it matched on the way (for exit 5's message)."""

    scenarios: list[Scenario]
    input_errors: list[ScenarioError] = field(default_factory=list)
    loaded: int = 0  # scenarios in the files, after FILE::ID, before -k and the shard
    matched: int = 0  # after -k, before the shard
    why_empty: str = ""  # what selected nothing, when nothing was selected
    notes: list[str] = field(default_factory=list)  # how it was narrowed (--impacted-by)

    @property
    def nothing_matched(self) -> bool:
        """Nothing to run, and not because a shard drew none or every file failed."""
        return self.matched == 0 and not self.input_errors


def select_scenarios(
    paths: Sequence[str], expression: str | None, shard: Shard | None
) -> Selection:
    """The scenarios of ``paths`` (files, folders, ``FILE::ID``), ``-k`` and the shard."""
    nodes = [split_node(path) for path in paths]
    for path, _ in nodes:
        if not Path(path).exists():
            raise UsageError(f"no such file or folder: {path}")
    plain = [path for path, scenario_id in nodes if scenario_id is None]
    loaded = load_paths(plain) if plain else None
    scenarios = list(loaded.scenarios) if loaded else []
    errors = list(loaded.errors) if loaded else []
    missing: list[str] = []
    for path, scenario_id in nodes:
        if scenario_id is None:
            continue
        one = load_paths([path])
        errors += one.errors
        chosen = [s for s in one.scenarios if s.id == scenario_id]
        if not chosen and not one.errors:
            missing.append(f"{path} has no scenario {scenario_id!r}")
        known = {s.id for s in scenarios}
        scenarios += [s for s in chosen if s.id not in known]
    total = len(scenarios)
    if expression:
        matches = compile_expression(expression)
        scenarios = [s for s in scenarios if matches(s)]
    matched = len(scenarios)
    if shard is not None:
        scenarios = [s for s in scenarios if shard.holds(s.id)]
    where = ", ".join(paths)
    why = ""
    if missing:
        why = "; ".join(missing)
    elif total == 0:
        why = f"no scenario in {where}"
    elif matched == 0:
        why = f"-k {expression!r} matched none of the {total} scenarios in {where}"
    elif not scenarios and shard is not None:
        why = f"shard {shard} holds none of the {matched} selected scenarios"
    return Selection(scenarios, errors, total, matched, why)
