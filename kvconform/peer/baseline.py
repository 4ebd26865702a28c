"""The green baseline: which of vLLM's tests fail here already, so that they are left out.

vLLM's tests are written for CI machines with GPUs, network and model
weights. On a CPU-only machine without network some fail whatever vLLM's code
says: multimodal processors that need files a config-only model folder lacks,
end-to-end tests that load weights, encoder-cache tests. A peer run must not
count those as kills, so the selection is run once against the *unmodified*
tree, and

* every test that fails there (in setup, call or teardown) is deselected by
  node id from then on;
* every test file that fails to collect there is left out whole.

What remains passes on the unmodified tree (the baseline is green), so a
failure against a mutated tree is the mutation's doing. The baseline is cached
as JSON per vLLM version, tree fingerprint and selection
(:mod:`kvconform.peer.fingerprint`); :func:`derive` is a pure function of the
run's records, :func:`load`/:func:`save` handle the file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Baseline:
    """The selection as it runs green on one tree."""

    version: str
    fingerprint: str
    files: list[str]  # the test files (or folders) the green selection runs
    deselected: dict[str, str]  # node id -> the first line of why it fails here
    broken_files: dict[str, str]  # file -> why it does not collect here
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Baseline:
        return cls(**data)


def derive(
    version: str,
    fingerprint: str,
    files: list[str],
    records: list[dict[str, Any]],
    seconds: float = 0.0,
) -> Baseline:
    """The baseline that a first run's ``records`` (of :mod:`.plugins.record`) imply."""
    deselected: dict[str, str] = {}
    broken: dict[str, str] = {}
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for record in records:
        nodeid = record["nodeid"]
        if record["kind"] == "collect":
            broken.setdefault(nodeid.split("::")[0], record.get("message", ""))
            continue
        outcome, when = record["outcome"], record["when"]
        if outcome == "failed":
            deselected.setdefault(nodeid, f"{when}: {record.get('message', '')}")
            counts["failed" if when == "call" else "errors"] += 1
        elif outcome == "skipped":
            counts["skipped"] += 1
        elif when == "call":
            counts["passed"] += 1
    counts["deselected"] = len(deselected)
    kept = [f for f in files if not any(_within(b, f) for b in broken)]
    # A broken file inside a selected folder is ignored by path, not dropped with its folder.
    return Baseline(version, fingerprint, kept, deselected, broken, counts, round(seconds, 1))


def ignore_args(baseline: Baseline) -> list[str]:
    """``--ignore`` for every broken file inside a folder the selection still runs."""
    return [
        f"--ignore={b}"
        for b in sorted(baseline.broken_files)
        if any(_within(f, b) and f != b for f in baseline.files)
    ]


def _within(folder: str, path: str) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (both relative, '/'-separated)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def save(baseline: Baseline, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(baseline.to_json(), indent=1, sort_keys=True))
    tmp.replace(path)


def load(path: Path) -> Baseline | None:
    if not path.exists():
        return None
    return Baseline.from_json(json.loads(path.read_text()))
