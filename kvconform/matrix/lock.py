"""The release lock: which scenario files the release matrix found green on every claimed release.

``kvconform matrix --lock FILE`` writes it after a run in which every release at or
above kvconform's minimum exited 0: the releases, and a SHA-256 of each scenario
file it ran. A scenario added or changed since then is *unverified*: ``make test``
runs the unverified files against each locked release (tests/test_release_lock.py),
so a scenario written for one release cannot break another unseen, and CI's full
matrix (``make release-matrix-claimed`` in ``.ci/run``; ``make release-matrix`` writes the
lock) renews the evidence for everything else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "scenarios/release-matrix.lock"
SCHEMA = "kvconform-release-lock/1"


@dataclass(frozen=True)
class ReleaseLock:
    releases: tuple[str, ...]
    # scenario file, relative to the lock's folder -> SHA-256 of its bytes
    files: dict[str, str]

    def unverified(self, scenario_files: Iterable[Path], root: Path) -> list[Path]:
        """The files that are new or changed since the lock was written."""
        return [path for path in scenario_files if self.files.get(_key(path, root)) != digest(path)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(path: Path, root: Path) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()


def write_lock(lock: Path, releases: Iterable[str], scenario_files: Iterable[Path]) -> None:
    root = lock.parent
    files = {_key(path, root): digest(path) for path in scenario_files}
    text = json.dumps(
        {"schema": SCHEMA, "releases": list(releases), "files": dict(sorted(files.items()))},
        indent=1,
    )
    lock.write_text(text + "\n", encoding="utf-8")


def read_lock(lock: Path) -> ReleaseLock:
    data = json.loads(lock.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{lock}: not a release lock ({SCHEMA})")
    return ReleaseLock(tuple(data["releases"]), dict(data["files"]))
