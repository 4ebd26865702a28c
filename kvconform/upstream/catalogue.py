"""The findings that go upstream: ``docs/reproducers/upstream.yaml``, read and checked.

Each entry names the release the finding was made on, its reproducer (a pytest file
for that release's own test tree, and the folder it belongs in), the fix (a patch
against that release's ``vllm/`` tree) or the release that fixed it, the vLLM
functions the fix changes, and the upstream threads. A finding still open in a
later release is listed once more for it (one entry per finding and release);
``every_test_fails`` says each test of the reproducer is a form of the finding. The file's header says what
``make upstream-check`` does with them (:mod:`kvconform.upstream.checking`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvconform.errors import Location, ScenarioError
from kvconform.harness.yamlio import load_yaml

__all__ = ["CATALOGUE", "Catalogue", "Finding", "load_catalogue"]

CATALOGUE = "docs/reproducers/upstream.yaml"
FOLDERS = ("tests/v1/core", "tests/v1/worker")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class Finding:
    number: int
    title: str
    release: str
    reproducer: Path
    folder: str  # where the reproducer belongs in vLLM's test tree
    scenario: str | None = None  # the scenario it was exported from; None: by hand
    fix: Path | None = None  # a patch against the release's vllm/ tree
    fixed_in: str | None = None  # the release that fixed it upstream
    changes: tuple[tuple[str, str], ...] = ()  # (vllm/...py, qualname) the fix changes
    upstream: str = ""
    # Each test of the reproducer is a form of the finding: every one must fail on
    # the release (not just one), so that a fix is shown to cover them all.
    every_test_fails: bool = False

    @property
    def proposed(self) -> bool:
        """kvconform proposes the fix: vLLM's own tests must stay green with it."""
        return self.fix is not None and self.fixed_in is None

    @property
    def destination(self) -> str:
        """The reproducer's path in vLLM's test tree."""
        return f"{self.folder}/{self.reproducer.name}"


@dataclass(frozen=True)
class Catalogue:
    findings: tuple[Finding, ...]
    combined: Mapping[str, Path]  # release -> every proposed fix of it, as one patch


def load_catalogue(root: Path, name: str = CATALOGUE) -> Catalogue:
    """The catalogue under ``root`` (the repository), every path checked to exist."""
    path = root / name
    data = load_yaml(path.read_text(encoding="utf-8"), name)
    where = Location(name)

    def need_file(value: object, field: str) -> Path:
        if not isinstance(value, str) or not (root / value).is_file():
            raise ScenarioError(where.at(field), f"{value!r} is no file of the repository")
        return root / value

    def need_version(value: object, field: str) -> str:
        if not isinstance(value, str) or not _VERSION.match(value):
            raise ScenarioError(where.at(field), f"{value!r} is not a release like 0.33.0")
        return value

    findings = []
    for i, item in enumerate(data.get("findings") or []):
        at = f"findings[{i}]"
        folder = item.get("folder")
        if folder not in FOLDERS:
            raise ScenarioError(where.at(f"{at}.folder"), f"one of {', '.join(FOLDERS)}")
        changes = []
        for change in item.get("changes") or []:
            file, sep, function = str(change).partition("::")
            if not sep or not file.startswith("vllm/"):
                raise ScenarioError(where.at(f"{at}.changes"), f"{change!r}: vllm/FILE::QUALNAME")
            changes.append((file, function))
        fix = item.get("fix")
        fixed_in = item.get("fixed_in")
        every_test_fails = item.get("every_test_fails", False)
        if not isinstance(every_test_fails, bool):
            raise ScenarioError(where.at(f"{at}.every_test_fails"), "true or false")
        if fix is None and fixed_in is None:
            raise ScenarioError(where.at(at), "a finding needs a fix or fixed_in")
        findings.append(
            Finding(
                number=int(item["finding"]),
                title=str(item.get("title", "")),
                release=need_version(item.get("release"), f"{at}.release"),
                reproducer=need_file(item.get("reproducer"), f"{at}.reproducer"),
                folder=str(folder),
                scenario=item.get("scenario"),
                fix=None if fix is None else need_file(fix, f"{at}.fix"),
                fixed_in=None if fixed_in is None else need_version(fixed_in, f"{at}.fixed_in"),
                changes=tuple(changes),
                upstream=str(item.get("upstream", "")),
                every_test_fails=every_test_fails,
            )
        )
    seen: set[tuple[int, str]] = set()
    for i, finding in enumerate(findings):
        key = (finding.number, finding.release)
        if key in seen:
            raise ScenarioError(
                where.at(f"findings[{i}]"),
                f"finding {finding.number} on vLLM {finding.release} is listed twice",
            )
        seen.add(key)
    combined = {
        need_version(release, "combined"): need_file(patch, f"combined.{release}")
        for release, patch in (data.get("combined") or {}).items()
    }
    return Catalogue(tuple(findings), combined)
