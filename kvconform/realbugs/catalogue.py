"""The real-bug catalogue: one entry per bug, validated when read.

An entry (``realbugs/catalogue.yaml``)::

    - name: swa-eagle-alignment-assert        # unique, kebab-case; names its patch
      title: ...                              # one line
      upstream: {pr: [39450], issue: []}      # the fix's PR, the report's issue
      last_buggy: 0.19.0                      # the last release with the bug
      first_fixed: 0.19.1                     # the first release without it
      patch: swa-eagle-alignment-assert.patch # under realbugs/patches/, applies with patch -p1
      patch_target: 0.33.0                    # the release whose Python tree it applies to
      adapted: {value: true, note: ...}       # whether the revert was adapted to moved code
      files: [vllm/v1/core/single_type_kv_cache_manager.py]
      bug_class: assertion-on-valid-config
      symptom: what a user saw
      trigger: what drives vLLM into it

A malformed entry is one :class:`~kvconform.errors.ScenarioError` with the file,
line and field; the other entries are still read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from kvconform.errors import Location, ScenarioError
from kvconform.harness.yamlio import LineDict, LineList, load_yaml

DEFAULT_CATALOGUE = "realbugs/catalogue.yaml"
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = (
    "name", "title", "upstream", "last_buggy", "first_fixed", "patch", "patch_target",
    "files", "bug_class", "symptom", "trigger",
)  # fmt: skip


@dataclass(frozen=True)
class RealBug:
    name: str
    title: str
    pr: tuple[int, ...]
    issue: tuple[int, ...]
    last_buggy: str
    first_fixed: str
    patch: Path
    patch_target: str
    adapted: bool
    adapted_note: str
    files: tuple[str, ...]
    bug_class: str
    symptom: str
    trigger: str
    where: Location = field(compare=False, default=Location("<catalogue>"))
    extra: dict[str, Any] = field(compare=False, default_factory=dict)

    @property
    def upstream(self) -> str:
        """``#39450`` (and its issues), or ``not reported upstream``."""
        numbers = [f"#{n}" for n in self.pr] + [f"issue #{n}" for n in self.issue]
        return ", ".join(numbers) if numbers else "not found upstream"


@dataclass
class Catalogue:
    bugs: list[RealBug]
    errors: list[ScenarioError]


def read_catalogue(path: str | Path) -> Catalogue:
    """The entries of a catalogue file; every malformed entry becomes one error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(Location(str(path)), f"cannot read the catalogue: {exc}") from None
    doc = load_yaml(text, str(path))
    if not isinstance(doc, LineList):
        raise ScenarioError(Location(str(path)), "a catalogue is a list of entries")
    catalogue = Catalogue([], [])
    seen: set[str] = set()
    for index, raw in enumerate(doc):
        where = Location(str(path), doc.line_of(index), f"[{index}]")
        try:
            bug = _entry(raw, where, path.parent / "patches")
        except ScenarioError as error:
            catalogue.errors.append(error)
            continue
        if bug.name in seen:
            catalogue.errors.append(ScenarioError(where.at("name"), f"{bug.name!r} twice"))
            continue
        seen.add(bug.name)
        catalogue.bugs.append(bug)
    return catalogue


def _entry(raw: Any, where: Location, patches: Path) -> RealBug:
    if not isinstance(raw, LineDict):
        raise ScenarioError(where, "an entry is a mapping")

    def at(key: str) -> Location:
        return Location(where.file, raw.line_of(key) or where.line, f"{where.field}.{key}")

    for key in _REQUIRED:
        if raw.get(key) in (None, ""):
            raise ScenarioError(at(key), "is required")
    name = str(raw["name"])
    if not _NAME.match(name):
        raise ScenarioError(at("name"), f"must be kebab-case, not {name!r}")
    for key in ("last_buggy", "first_fixed", "patch_target"):
        try:
            Version(str(raw[key]))
        except InvalidVersion:
            raise ScenarioError(at(key), f"is not a release: {raw[key]!r}") from None
    if Version(str(raw["last_buggy"])) >= Version(str(raw["first_fixed"])):
        raise ScenarioError(at("first_fixed"), "must be later than last_buggy")
    patch = patches / str(raw["patch"])
    if not patch.is_file():
        raise ScenarioError(at("patch"), f"no such patch: {patch}")
    upstream = raw["upstream"]
    if not isinstance(upstream, dict):
        raise ScenarioError(at("upstream"), "must be a mapping with pr and issue lists")
    numbers: dict[str, tuple[int, ...]] = {}
    for key in ("pr", "issue"):
        values = upstream.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            raise ScenarioError(at("upstream"), f"{key}: a list of numbers")
        numbers[key] = tuple(values)
    adapted = raw.get("adapted") or {}
    files = raw["files"]
    if not isinstance(files, list) or not all(str(f).startswith("vllm/") for f in files):
        raise ScenarioError(at("files"), "a list of vllm/... paths")
    known = set(_REQUIRED) | {"adapted"}
    return RealBug(
        name=name,
        title=str(raw["title"]),
        pr=numbers["pr"],
        issue=numbers["issue"],
        last_buggy=str(raw["last_buggy"]),
        first_fixed=str(raw["first_fixed"]),
        patch=patch,
        patch_target=str(raw["patch_target"]),
        adapted=bool(adapted.get("value", False)) if isinstance(adapted, dict) else bool(adapted),
        adapted_note=str(adapted.get("note", "")) if isinstance(adapted, dict) else "",
        files=tuple(str(f) for f in files),
        bug_class=str(raw["bug_class"]),
        symptom=" ".join(str(raw["symptom"]).split()),
        trigger=" ".join(str(raw["trigger"]).split()),
        where=where,
        extra={k: v for k, v in raw.items() if k not in known},
    )
