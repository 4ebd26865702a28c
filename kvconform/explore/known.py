"""Triaged findings: the explorer's file of signatures it reports as known.

A finding of ``kvconform explore`` that has been triaged -- written up in
docs/findings.md as a vLLM bug, its scenario a known divergence in
scenarios/expectations.yaml -- is found again by every run on the releases it
holds on. The file of triaged findings (``scenarios/explore-known.yaml`` by
default) lists them, so that they are still reported, as ``known (finding #N)``,
but no longer make the run exit 1::

    - signature: "sanity / SlidingWindowSpec / frees a block the attention still reads"
      vllm: ">=0.28.0"              # PEP 440 specifier: the releases it holds on
      finding: 14                   # its number in docs/findings.md
      evidence: scenarios/scheduler/sched-remote-prefill-sliding-window-last-token.yaml

``signature`` is a finding's signature as the explorer prints it
(:class:`kvconform.fuzz.findings.Signature`), matched exactly: a finer or
another signature of the same check stays a new finding. The file is loaded
and checked like the expectations file (:mod:`kvconform.harness.expectations`):
a bad entry is one :class:`~kvconform.errors.ScenarioError` with file, line
and field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kvconform.errors import Location, ScenarioError
from kvconform.fuzz.findings import Signature
from kvconform.harness.checks import CHECKS
from kvconform.harness.yamlio import LineDict, load_yaml

DEFAULT_KNOWN_FINDINGS = "scenarios/explore-known.yaml"
FIELDS = ("signature", "vllm", "finding", "evidence")


@dataclass(frozen=True)
class KnownFinding:
    """One triaged finding: a signature, the releases it holds on, its findings.md number."""

    signature: str
    vllm: SpecifierSet
    finding: int
    evidence: str
    line: int | None = None

    def holds(self, signature: Signature, version: str) -> bool:
        if str(signature) != self.signature:
            return False
        try:
            return Version(version) in self.vllm
        except InvalidVersion:
            return False

    def label(self) -> str:
        return f"known (finding #{self.finding})"


def triaged(
    signature: Signature, version: str, known: Sequence[KnownFinding]
) -> KnownFinding | None:
    """The first entry that ``signature`` on vLLM ``version`` is, or None: a new finding."""
    return next((entry for entry in known if entry.holds(signature, version)), None)


def load_known_findings(path: str | Path) -> list[KnownFinding]:
    path = Path(path)
    return parse_known_findings(path.read_text(encoding="utf-8"), str(path))


def parse_known_findings(text: str, file: str) -> list[KnownFinding]:
    doc = load_yaml(text, file)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise ScenarioError(Location(file, 1), "a file of known findings is a list of entries")
    entries = []
    for i, item in enumerate(doc):
        line = doc.line_of(i) if hasattr(doc, "line_of") else None
        where = Location(file, line, f"[{i}]")
        if not isinstance(item, LineDict):
            raise ScenarioError(where, f"each entry is a mapping with {', '.join(FIELDS)}")

        def at(field: str, item: LineDict = item, where: Location = where) -> Location:
            return where.at(f"{where.field}.{field}", item.line_of(field))

        unknown = sorted(set(item) - set(FIELDS))
        if unknown:
            raise ScenarioError(at(unknown[0]), f"unknown field (the fields: {', '.join(FIELDS)})")
        for field in FIELDS:
            if field not in item:
                raise ScenarioError(where, f"missing field {field!r}")
        signature = item["signature"]
        if not isinstance(signature, str) or not signature.strip():
            raise ScenarioError(at("signature"), "a finding's signature as explore prints it")
        check = signature.split(" / ")[0].strip()
        if check not in CHECKS and check != "crash":
            raise ScenarioError(
                at("signature"),
                f"{check!r} is not a check (a signature starts with a check's name or 'crash')",
            )
        try:
            spec = SpecifierSet(str(item["vllm"]))
        except InvalidSpecifier:
            raise ScenarioError(at("vllm"), f"not a version specifier: {item['vllm']!r}") from None
        if not str(spec):
            raise ScenarioError(at("vllm"), "name the releases it holds on, e.g. '>=0.28.0'")
        number = item["finding"]
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise ScenarioError(at("finding"), f"its number in docs/findings.md, not {number!r}")
        evidence = item["evidence"]
        if not isinstance(evidence, str) or not evidence.strip() or "\n" in evidence.strip():
            raise ScenarioError(at("evidence"), "one line of evidence")
        entries.append(KnownFinding(signature.strip(), spec, number, evidence.strip(), line))
    return entries
