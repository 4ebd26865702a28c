"""``realbugs.json`` and ``realbugs.md``: per bug, detected or missed or broken, and by whom."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.peer.verdict import CATCH_CELLS, catch_cell
from kvconform.realbugs.catalogue import RealBug
from kvconform.realbugs.replay import Replay

SCHEMA = "kvconform-realbugs/1"


@dataclass
class BugResult:
    bug: RealBug
    replay: Replay
    # What vLLM's own tests made of the same tree (kvconform realbugs --peer-tests).
    peer: dict[str, Any] | None = None
    # What the explorer made of the same tree where the corpus missed it (--with-explorer).
    explorer: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        bug = self.bug
        return {
            "name": bug.name,
            "title": bug.title,
            "pr": list(bug.pr),
            "issue": list(bug.issue),
            "last_buggy": bug.last_buggy,
            "first_fixed": bug.first_fixed,
            "patch_target": bug.patch_target,
            "adapted": bug.adapted,
            "bug_class": bug.bug_class,
            "files": list(bug.files),
            **self.replay.to_json(),
            "peer": self.peer,
            **({"explorer": self.explorer} if self.explorer is not None else {}),
        }


@dataclass
class RealBugsReport:
    results: list[BugResult]
    baselines: dict[str, Replay] = field(default_factory=dict)  # release -> unpatched run
    command: str = ""
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        counts = {"detected": 0, "missed": 0, "broken": 0}
        for result in self.results:
            counts[result.replay.outcome] = counts.get(result.replay.outcome, 0) + 1
        return counts

    def detection_rate(self) -> float:
        judged = [r for r in self.results if r.replay.outcome in ("detected", "missed")]
        detected = sum(1 for r in judged if r.replay.outcome == "detected")
        return detected / len(self.results) if self.results else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "seconds": round(self.seconds, 1),
            "counts": self.counts(),
            "detection_rate": round(self.detection_rate(), 3),
            "who_catches": who_catches(self.results) if any(r.peer for r in self.results) else None,
            "baselines": {release: run.to_json() for release, run in self.baselines.items()},
            "bugs": [result.to_json() for result in self.results],
        }


def who_catches(results: Sequence[BugResult]) -> dict[str, int]:
    """Bugs detected by kvconform only, by vLLM's tests only, by both, by neither."""
    table: Counter[str] = Counter()
    for result in results:
        peer = result.peer
        if not peer or peer["verdict"] not in ("killed", "survived"):
            table["not judged by vLLM's tests"] += 1
            continue
        if result.replay.outcome not in ("detected", "missed"):
            table["not judged by kvconform"] += 1
            continue
        table[catch_cell(result.replay.outcome == "detected", peer["verdict"] == "killed")] += 1
    keys = (*CATCH_CELLS, "not judged by vLLM's tests", "not judged by kvconform")
    return {key: table.get(key, 0) for key in keys}


def _caught(replay: Replay) -> str:
    if replay.outcome != "detected":
        return replay.why or "-"
    shown = [f"`{sid}` ({', '.join(checks)})" for sid, checks in list(replay.caught_by.items())[:3]]
    more = len(replay.caught_by) - len(shown)
    return "; ".join(shown) + (f"; +{more} more" if more > 0 else "")


def render_markdown(report: RealBugsReport) -> str:
    counts = report.counts()
    peer = any(r.peer is not None for r in report.results)
    lines = [
        "# Real bugs replayed",
        "",
        f"{len(report.results)} bugs: {counts['detected']} detected, {counts['missed']} missed, "
        f"{counts['broken']} broken; detection rate {report.detection_rate():.0%} "
        f"in {report.seconds:.0f} s.",
        "",
        "| bug | upstream | releases | class | outcome | caught by (scenario, checks) |"
        + (" vLLM's own tests |" if peer else ""),
        "|---|---|---|---|---|---|" + ("---|" if peer else ""),
    ]
    for result in report.results:
        bug = result.bug
        lines.append(
            f"| `{bug.name}` | {bug.upstream} | {bug.last_buggy} → {bug.first_fixed} "
            f"(replayed on {bug.patch_target}{', adapted' if bug.adapted else ''}) | "
            f"{bug.bug_class} | {result.replay.outcome} | {_caught(result.replay)} |"
            + (f" {_peer(result.peer)} |" if peer else "")
        )
    if peer:
        table = who_catches(report.results)
        lines += [
            "",
            "Who catches the bugs (vLLM's own tests: `--peer-tests`, docs/peer-tests.md):",
            "",
        ]
        lines += [f"- {key}: {count}" for key, count in table.items()]
    return "\n".join(lines) + "\n"


def _peer(peer: dict[str, Any] | None) -> str:
    if not peer:
        return "-"
    failure = str(peer.get("first_failure") or "").split(" ")[0].rstrip(":")
    if peer["verdict"] == "killed":
        return f"caught (`{failure}`)" if failure else "caught"
    if peer["verdict"] == "survived":
        return f"missed ({peer.get('tests_run', 0)} tests reach it)"
    return f"{peer['verdict']}: {failure}" if failure else peer["verdict"]


def write_report(report: RealBugsReport, directory: Path) -> Sequence[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "realbugs.json", directory / "realbugs.md"
    json_path.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, md_path
