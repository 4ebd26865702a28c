"""Which scenarios a vLLM change touches (``kvconform run --impacted-by DIFF_OR_REV``).

A change is a unified diff file, or a git revision range (``A..B``, or one revision
``A`` for ``A..HEAD``) of the vLLM checkout given with ``--vllm-src DIR``. Each hunk
is mapped to the functions it changes, by the lines it removes or inserts among on the
old side, with ``ast`` over the old file (the checkout at ``A``; for a diff file, the
tree the coverage map was measured on). The selection keeps:

* every scenario whose recorded coverage executed a changed function;
* every scenario whose coverage is unknown (not in the map, or its file changed since);
* every scenario, when the change touches code every scenario runs at import (module
  level) or a Python file of ``vllm/`` outside the measured code (unknown reach).

The coverage map is the per-scenario functions of ``kvconform coverage --vllm-code``
(:mod:`kvconform.harness.vllm_code`) over the selected paths, built in a child
process against the unpatched vLLM of the same version (the installed one, else the
PyPI release's tree, else the tree under test), cached per vLLM version under
kvconform's cache dir and rebuilt when the measured tree's files change; scenarios
added or edited since only count as unknown until the next rebuild.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.errors import UsageError
from kvconform.harness.vllm_code import target_files
from kvconform.model.scenario import Scenario
from kvconform.model.vllm_code import (
    MODULE_LEVEL,
    RESERVATION_CODE,
    FunctionMap,
    Target,
    VllmCodeCoverage,
)
from kvconform.paths import cache_dir

MAP_FORMAT = 1

# -- the change -------------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class FileDiff:
    """One file of a unified diff, on its old side."""

    changed: set[int] = field(default_factory=set)  # lines changed, or that code follows
    expected: dict[int, str] = field(default_factory=dict)  # the text each old line must have
    new_file: bool = False


def _is_code(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and not stripped.startswith("#")


def parse_diff(diff: str) -> dict[str, FileDiff]:
    """Per file (``vllm/...``, as the diff names it), the old-side lines a unified diff
    changes: each removed line of code, and for inserted code the old line it follows
    (blank and comment lines change no behaviour); and the old text every removed and
    context line must have, to tell a diff of another tree."""
    files: dict[str, FileDiff] = {}
    current: FileDiff | None = None
    old = 0
    for line in diff.splitlines():
        if line.startswith("--- "):
            name = line[4:].split("\t")[0].strip()
            current = None
            if name != "/dev/null":
                current = files.setdefault(re.sub(r"^[ab]/", "", name), FileDiff())
            continue
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            if current is None and name != "/dev/null":  # a new file: its reach is unknown
                current = files.setdefault(re.sub(r"^[ab]/", "", name), FileDiff())
                current.new_file = True
            continue
        match = _HUNK.match(line)
        if match:
            old = int(match.group(1))
            continue
        if current is None or not line or line.startswith("\\"):
            continue
        if line[0] == "-":
            current.expected[old] = line[1:]
            if _is_code(line[1:]):
                current.changed.add(old)
            old += 1
        elif line[0] == "+":
            if _is_code(line[1:]):
                current.changed.add(max(old - 1, 1))
        elif line[0] == " ":
            current.expected[old] = line[1:]
            old += 1
    return files


def changed_lines(diff: str) -> dict[str, set[int]]:
    return {path: part.changed for path, part in parse_diff(diff).items()}


@dataclass
class Change:
    """What a change touches: functions (``FILE::Qual.name``), and why it reaches all."""

    source: str  # the diff file or revision range, as given
    functions: set[str] = field(default_factory=set)
    everything: list[str] = field(default_factory=list)  # reasons it reaches every scenario
    ignored: list[str] = field(default_factory=list)  # files outside vLLM's Python code


def read_change(
    spec: str, vllm_src: str | None, old_tree: Path | None, targets: tuple[Target, ...]
) -> Change:
    """The change ``spec`` names: a diff file, or a revision range of ``vllm_src``."""
    if Path(spec).is_file():
        diff = Path(spec).read_text(encoding="utf-8", errors="replace")

        def old_source(path: str) -> str | None:
            file = old_tree / path if old_tree is not None else None
            return file.read_text(encoding="utf-8") if file and file.is_file() else None

    else:
        if not vllm_src or not (Path(vllm_src) / ".git").exists():
            raise UsageError(
                f"--impacted-by {spec}: no such diff file, and no vLLM git checkout "
                "(--vllm-src DIR) to read it as a revision range in"
            )
        base, _, head = spec.partition("..")
        head = head or "HEAD"
        diff = _git(vllm_src, "diff", "--no-color", "-U0", base, head, "--", "vllm")

        def old_source(path: str) -> str | None:
            try:
                return _git(vllm_src, "show", f"{base}:{path}")
            except UsageError:
                return None

    change = Change(spec)
    for path, part in sorted(parse_diff(diff).items()):
        if not path.startswith("vllm/") or not path.endswith(".py"):
            change.ignored.append(path)
            continue
        if not any(t.matches(path) for t in targets):
            change.everything.append(f"{path} is outside the measured code: its reach is unknown")
            continue
        source = old_source(path)
        if source is None or part.new_file:
            change.everything.append(f"{path} is new or unreadable on the old side")
            continue
        functions = FunctionMap(source)
        differs = [n for n, text in part.expected.items() if functions.raw(n) != text]
        if differs:
            change.everything.append(
                f"{path}: the diff is not against this tree (line {min(differs)} differs), so "
                "which functions it changes is unknown"
            )
            continue
        for line in sorted(part.changed):
            name = functions.defining(line)
            if name == MODULE_LEVEL:
                change.everything.append(
                    f"{path}:{line} is module-level code, which every scenario runs at import"
                )
            else:
                change.functions.add(f"{path}::{name}")
    return change


def _git(repo: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout


# -- the coverage map ---------------------------------------------------------------------


def tree_fingerprint(vllm_location: Path, targets: tuple[Target, ...]) -> str:
    digest = hashlib.sha256()
    for name in target_files(targets, str(vllm_location)):
        digest.update(Path(name).relative_to(vllm_location.parent).as_posix().encode())
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()[:16]


def file_digest(path: str | None) -> str:
    if not path or not Path(path).is_file():
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass
class CoverageMap:
    """Per scenario id: its file's digest and the functions it executed."""

    vllm_version: str
    fingerprint: str
    tree: str  # the folder holding vllm/ it was measured on
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    def functions(self, scenario: Scenario) -> set[str] | None:
        """What ``scenario`` executes, or None when unknown (new, or its file changed)."""
        entry = self.scenarios.get(scenario.id)
        if entry is None or entry.get("digest") != file_digest(scenario.file):
            return None
        return set(entry["functions"])

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MAP_FORMAT,
            "vllm_version": self.vllm_version,
            "fingerprint": self.fingerprint,
            "tree": self.tree,
            "scenarios": self.scenarios,
        }


def map_path(version: str, fingerprint: str) -> Path:
    return cache_dir("impact", version) / f"coverage-map-{fingerprint}.json"


def load_map(version: str, fingerprint: str) -> CoverageMap | None:
    """The map measured on a tree whose counted files have ``fingerprint`` (None: none yet;
    a map of a changed tree, a patched one for instance, has another fingerprint)."""
    path = map_path(version, fingerprint)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") != MAP_FORMAT:
        return None
    return CoverageMap(data["vllm_version"], fingerprint, data["tree"], data["scenarios"])


def save_map(
    measured: VllmCodeCoverage, scenarios: Sequence[Scenario], vllm_location: str
) -> CoverageMap | None:
    """Record what ``kvconform coverage --vllm-code`` measured, per scenario, in the map of
    its vLLM version and tree (entries of other scenarios kept)."""
    version = measured.vllm_version
    if not version or not vllm_location:
        return None
    location = Path(vllm_location)
    fingerprint = tree_fingerprint(location, measured.targets)
    old = load_map(version, fingerprint)
    result = CoverageMap(
        version, fingerprint, str(location.parent), dict(old.scenarios) if old else {}
    )
    for scenario in scenarios:
        result.scenarios[scenario.id] = {
            "file": scenario.file,
            "digest": file_digest(scenario.file),
            "functions": measured.scenario_functions.get(scenario.id, []),
        }
    map_path(version, fingerprint).write_text(json.dumps(result.to_json()))
    return result


def build_map(
    version: str,
    tree: Path,
    release: str | None,
    paths: Sequence[str],
    fingerprint: str,
    say: Any = print,
) -> CoverageMap:
    """Measure ``paths`` with ``kvconform coverage --vllm-code`` in a child process against the
    unpatched tree, which records the map."""
    with tempfile.TemporaryDirectory(prefix="kvconform-impact-") as tmp:
        command = [sys.executable, "-m", "kvconform", "coverage", "--vllm-code", *paths,
                   "--report-dir", tmp, "--progress", "off", "--no-expectations"]  # fmt: skip
        command += ["--vllm-release", release] if release else ["--vllm-src", str(tree)]
        say(f"impact: measuring the coverage map of vLLM {version} over {', '.join(paths)}")
        done = subprocess.run(command, capture_output=True, text=True)
    built = load_map(version, fingerprint)
    if built is None:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise UsageError(f"impact: building the coverage map failed:\n{tail}")
    return built


# -- the selection --------------------------------------------------------------------------


@dataclass
class Impact:
    selected: list[Scenario]
    touching: int
    unknown: int
    why: list[str]


def select_impacted(scenarios: Sequence[Scenario], change: Change, cmap: CoverageMap) -> Impact:
    if change.everything:
        return Impact(list(scenarios), 0, 0, change.everything)
    selected, touching, unknown = [], 0, 0
    for scenario in scenarios:
        functions = cmap.functions(scenario)
        if functions is None:
            unknown += 1
            selected.append(scenario)
        elif functions & change.functions:
            touching += 1
            selected.append(scenario)
    return Impact(selected, touching, unknown, [])


def plan(
    spec: str,
    scenarios: Sequence[Scenario],
    paths: Sequence[str],
    vllm_src: str | None,
    vllm_release: str | None,
    say: Any = print,
) -> tuple[Impact, Change]:
    """The scenarios of ``scenarios`` that the change ``spec`` touches, and the change."""
    from kvconform.harness.releases import release_tree
    from kvconform.oracles.vllm import installed_version, tree_version

    if vllm_release:
        version: str | None = vllm_release
    elif vllm_src:
        version = tree_version(vllm_src)
    else:
        version = installed_version()
    if version is None:
        raise UsageError("--impacted-by: which vLLM version the change is against is unknown")
    release = None
    if version == installed_version():
        import importlib.util

        found = importlib.util.find_spec("vllm")
        assert found is not None and found.origin is not None
        tree = Path(found.origin).parent.parent
    elif re.fullmatch(r"\d+\.\d+\.\d+", version):
        release, tree = version, release_tree(version)
    else:  # a development tree: measured as it is
        tree = Path(vllm_src or ".")
    targets = RESERVATION_CODE
    fingerprint = tree_fingerprint(tree / "vllm", targets)
    cmap = load_map(version, fingerprint)
    if cmap is None or not any(s.id in cmap.scenarios for s in scenarios):
        cmap = build_map(version, tree, release, paths, fingerprint, say)
    change = read_change(spec, vllm_src, tree, targets)
    return select_impacted(scenarios, change, cmap), change
