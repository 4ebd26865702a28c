"""Known divergences: the expectations file.

A divergence that is understood, reported upstream and not yet fixed should not
turn every nightly red, and it must not be hidden either. The expectations file
(``scenarios/expectations.yaml`` by default) lists such scenarios::

    - id: sink-full-attention*        # fnmatch pattern over scenario ids
      vllm: ">=0.33.0"                # PEP 440 specifier; omitted: every version
      checks: [error]                 # what is expected to go wrong: check names,
                                      # or "error" for a crash; omitted: anything
      reason: KVCacheManager(...) raises TypeError for SinkFullAttentionSpec
      evidence: docs/findings.md#sink-full-attention-crashes

``id`` is an fnmatch pattern, or a scenario id written as it is: ``m[eagle-k1]``
matches that scenario although ``[...]`` means a character class to fnmatch.

A scenario that diverges the way some applicable entry says is ``xfailed``; one
that now passes is ``xpassed`` (shown in every report, so the entry can be
narrowed: ``kvconform run --update-expectations``, see
:mod:`kvconform.harness.expectations_update`); one that fails some *other* way
stays ``failed``. Input errors are never excused.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kvconform.errors import Location, ScenarioError
from kvconform.harness.yamlio import LineDict, load_yaml
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict

DEFAULT_FILE = "expectations.yaml"
# The folder a run without paths runs, and where a new expectations file goes.
DEFAULT_SCENARIOS = "scenarios"


def find_expectations(paths: Sequence[str | Path]) -> Path | None:
    """The nearest expectations.yaml at or above the first scenario path.

    The search stops at the repository's root (a folder holding ``.git``), so a
    checkout never picks up a file from whatever folder it was cloned into.
    """
    start = Path(paths[0] if paths else DEFAULT_SCENARIOS).resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = folder / DEFAULT_FILE
        if candidate.exists():
            return candidate
        if (folder / ".git").exists():
            break
    return None


def default_expectations_path(paths: Sequence[str | Path]) -> Path:
    """Where a new expectations file goes: beside the scenario tree that was run."""
    first = Path(paths[0] if paths else DEFAULT_SCENARIOS).resolve()
    folder = first if first.is_dir() else first.parent
    for candidate in [folder, *folder.parents]:
        if candidate.name == DEFAULT_SCENARIOS:
            return candidate / DEFAULT_FILE
        if (candidate / ".git").exists():
            break
    return folder / DEFAULT_FILE


@dataclass(frozen=True)
class Expectation:
    pattern: str
    reason: str
    evidence: str = ""
    vllm: SpecifierSet | None = None
    checks: tuple[str, ...] = ()
    line: int | None = None

    def matches(self, scenario_id: str) -> bool:
        return scenario_id == self.pattern or fnmatch.fnmatchcase(scenario_id, self.pattern)

    def applies(self, scenario_id: str, version: str) -> bool:
        if not self.matches(scenario_id):
            return False
        if self.vllm is None:
            return True
        try:
            return Version(version) in self.vllm
        except InvalidVersion:
            return False

    def covers(self, result: ScenarioResult) -> bool:
        if not self.checks:
            return True
        if result.verdict is Verdict.ERROR:
            return "error" in self.checks
        return all(f.check in self.checks for f in result.failures)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.pattern,
            "reason": self.reason,
            "evidence": self.evidence,
            "vllm": str(self.vllm) if self.vllm is not None else None,
            "checks": list(self.checks),
        }


def load_expectations(path: str | Path) -> list[Expectation]:
    path = Path(path)
    if not path.exists():
        return []
    return parse_expectations(path.read_text(encoding="utf-8"), str(path))


def parse_expectations(text: str, file: str) -> list[Expectation]:
    doc = load_yaml(text, file)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise ScenarioError(Location(file, 1), "an expectations file is a list of entries")
    entries = []
    for i, item in enumerate(doc):
        line = doc.line_of(i) if hasattr(doc, "line_of") else None
        where = Location(file, line, f"[{i}]")
        if not isinstance(item, LineDict):
            raise ScenarioError(where, "each entry is a mapping with id and reason")
        unknown = set(item) - {"id", "reason", "evidence", "vllm", "checks"}
        if unknown:
            raise ScenarioError(where.at(sorted(unknown)[0]), "unknown field")
        pattern, reason = item.get("id"), item.get("reason")
        if not isinstance(pattern, str) or not isinstance(reason, str) or not reason.strip():
            raise ScenarioError(where, "needs an 'id' pattern and a non-empty 'reason'")
        spec = None
        if item.get("vllm") is not None:
            try:
                spec = SpecifierSet(str(item["vllm"]))
            except InvalidSpecifier:
                raise ScenarioError(
                    where.at("vllm"), f"not a version specifier: {item['vllm']!r}"
                ) from None
        checks = item.get("checks") or []
        if not isinstance(checks, list):
            raise ScenarioError(where.at("checks"), "must be a list")
        entries.append(
            Expectation(
                pattern, reason.strip(), str(item.get("evidence") or ""), spec, tuple(checks), line
            )
        )
    return entries


def apply_expectations(
    result: ScenarioResult, expectations: list[Expectation], version: str
) -> ScenarioResult:
    """Turn a result into xfailed / xpassed where an expectation says so.

    Every entry that applies is considered: the first one that covers the way
    the scenario diverged makes it xfailed, so an entry for one check and a
    later one for another can sit side by side. Input errors are never excused,
    and an ``unsupported`` scenario neither diverged nor conformed: it stays as it is.
    """
    if result.error_kind is ErrorKind.INPUT or result.verdict is Verdict.UNSUPPORTED:
        return result
    applicable = [e for e in expectations if e.applies(result.id, version)]
    if not applicable:
        return result
    if result.verdict is Verdict.PASSED:
        result.verdict = Verdict.XPASSED
        result.expectation, result.expectation_evidence = (
            applicable[0].reason,
            applicable[0].evidence,
        )
        return result
    for entry in applicable:
        if entry.covers(result):
            result.verdict = Verdict.XFAILED
            result.expectation, result.expectation_evidence = entry.reason, entry.evidence
            break
    return result


def raw_verdict(result: ScenarioResult) -> Verdict:
    """The verdict before expectations were applied."""
    if result.verdict is Verdict.XPASSED:
        return Verdict.PASSED
    if result.verdict is Verdict.XFAILED:
        return Verdict.ERROR if result.error else Verdict.FAILED
    return result.verdict
