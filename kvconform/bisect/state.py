"""The saved progress of one bisection, so that an interrupted one resumes.

A bisection is keyed by everything that decides its answer (mode, range or
commits, ``--find-fix``, the scenario selection and kvconform's own source;
see :mod:`.selection`). Its state file, ``state.json`` under
``~/.cache/kvconform/bisect/<key>/``, holds the candidate list (so that a
resumed release bisection does not depend on PyPI having changed), every probe
recorded so far in the order it ran, and, once finished, the conclusion.
Writes go through a temporary file and a rename, so an interrupt never leaves
half a file.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


@dataclass
class ProbeRecord:
    """One probe: a vLLM (a release or a commit) run on the selected scenarios.

    ``run_status`` is ``kvconform run``'s exit status (0, 1, 2, 3), or None when
    the probe produced no report (kvconform itself failed to start).
    ``verdicts`` and ``headlines`` map scenario ids to their verdict and first
    failure or error message, as in the probe's ``report.json``; ``root_causes`` are
    its root-cause groups (``report.json``'s, as ``kvconform run`` gathered them).
    """

    label: str
    run_status: int | None
    report_dir: str | None = None
    verdicts: dict[str, str] = field(default_factory=dict)
    headlines: dict[str, str] = field(default_factory=dict)
    vllm_version: str | None = None
    root_causes: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    duration: float = 0.0
    cached: bool = False
    cacheable: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def failed_count(self) -> int:
        return sum(1 for v in self.verdicts.values() if v in ("failed", "error"))


@dataclass
class BisectState:
    directory: Path
    key: str
    settings: dict[str, Any]
    candidates: list[str] = field(default_factory=list)
    probes: dict[str, ProbeRecord] = field(default_factory=dict)
    result: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    @classmethod
    def open(
        cls, directory: Path, key: str, settings: dict[str, Any], fresh: bool = False
    ) -> tuple[BisectState, bool]:
        """The saved state in ``directory`` (and True), or a new one (and False)."""
        path = directory / STATE_FILE
        if fresh and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None  # a corrupt state file: start over
            if data and data.get("key") == key:
                return (
                    cls(
                        directory,
                        key,
                        data.get("settings", settings),
                        list(data.get("candidates", [])),
                        {p["label"]: ProbeRecord.from_json(p) for p in data.get("probes", [])},
                        data.get("result"),
                    ),
                    True,
                )
        return cls(directory, key, settings), False

    def reload(self) -> None:
        """Read back probes that another process (a ``git bisect run`` script) recorded."""
        again, _ = BisectState.open(self.directory, self.key, self.settings)
        self.candidates, self.probes, self.result = again.candidates, again.probes, again.result

    def number(self, label: str) -> int:
        """The probe's place in the order the probes ran, from 1."""
        return list(self.probes).index(label) + 1

    def record(self, probe: ProbeRecord) -> None:
        self.probes.pop(probe.label, None)
        self.probes[probe.label] = probe
        self.save()

    def save(self) -> None:
        data = {
            "key": self.key,
            "settings": self.settings,
            "candidates": self.candidates,
            "probes": [p.to_json() for p in self.probes.values()],
            "result": self.result,
        }
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.path)
