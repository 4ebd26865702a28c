"""One real bug through the explorer alone: detected, missed or broken.

``kvconform realbugs --explorer-only SECONDS`` asks, per catalogued bug, whether
generated scheduler workloads find it with no corpus: ``kvconform explore
--vllm-src PATCHED --baseline-src UNPATCHED --budget SECONDS --seed 0`` in a
process of its own. A finding there need not be the bug: the unpatched release may
fail the same workload (a divergence or a false alarm the explorer finds on every
tree). So:

1. the unpatched release is explored too, with the same seed and budget
   (:func:`explore_baseline`), side by side with the bugs' runs: it says whether the
   release itself is green for the explorer (realbugs.json lists its findings);
2. each bug's run compares with the unpatched release as it goes (differential
   testing, ``--baseline-src``, :mod:`kvconform.fuzz.baseline`): a new failure is
   run on the unpatched tree before it is shrunk, and one the unpatched tree shows
   too is recorded as the baseline's and not searched for again; a shrink candidate
   counts only while the unpatched tree does not show it. The budget goes to what the
   patch changed without waiting for step 1 (which took longer than a bug's budget
   where the release has findings of its own to shrink: issue 35's sixth stop);
3. every reproducer the patched run writes is then run with ``kvconform run``
   against the unpatched release, all in one process. A reproducer that passes
   there and fails on the patched tree is the bug: the bug is *detected*, caught
   by those reproducers. Where none passes, each reproducer is run once more on the
   unpatched tree as the differential baseline runs it (:func:`signature_only`): one
   whose signature the unpatched tree does not show -- it fails there only otherwise,
   with a standing failure of the release -- detects the bug too, said in ``why``.
   A run with no finding, or whose every finding fails on the unpatched release
   with its own signature too, *missed* it (``why`` says which, and what the patched
   run met that the baseline shows too). A run that did not complete (exit 2 or 3,
   no summary) is *broken*.

The price of the differential baseline: a bug whose only symptom has the signature
of a failure of the unpatched release stays hidden (signatures are coarse, :mod:`kvconform.fuzz.findings`). realbugs.json records the
baseline's findings, and per bug the failures its run found the baseline to share.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from kvconform.bisect.probe import log_tail, run_logged
from kvconform.fuzz.baseline import UNJUDGED, BaselineProcess
from kvconform.fuzz.findings import Signature
from kvconform.realbugs.replay import Replay

EXPLORE_LOG = "explore.log"
_SCENARIO_ID = re.compile(r"^explore-s\d+-\d+")
SEED = 0
# Findings a bug's run shrinks and writes at most. With the differential baseline each is a
# failure the unpatched tree does not show on the same workload (its reproducer one the
# unpatched tree passes for that signature), so the first is the bug's in all likelihood;
# a second is room for a first one that the unpatched release's `kvconform run` still fails.
MAX_FINDINGS = 2


def explore_baseline(tree: Path, folder: Path, seconds: float) -> Replay:
    """The unpatched release explored: ``green`` (nothing found), ``red`` (findings, listed in
    ``caught_by``), or ``broken``."""
    result = _explore(tree, folder, seconds, max_findings=10, baseline=None)
    if result.outcome == "detected":
        result.outcome = "red"
    elif result.outcome == "missed":
        result.outcome = "green"
    return result


def explore_replay(tree: Path, pristine: Path, folder: Path, seconds: float) -> Replay:
    """The explorer alone on the patched ``tree``, its reproducers judged on ``pristine``."""
    found = _explore(tree, folder, seconds, MAX_FINDINGS, baseline=pristine)
    if found.outcome != "detected":
        return found
    reproducers = sorted((folder / "explore").glob("explore-*.yaml"))
    check = folder / "unpatched"
    check.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "kvconform", "run", *map(str, reproducers),
        "--vllm-src", str(pristine), "--report-dir", str(check), "--progress", "off",
    ]  # fmt: skip
    started = time.perf_counter()
    run_logged(command, check, "run.log")
    found.seconds += time.perf_counter() - started
    try:
        report = json.loads((check / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        found.outcome = "broken"
        found.why = "the reproducers did not run on the unpatched release: " + log_tail(
            check, log_file="run.log"
        )
        return found
    passed = {e["id"] for e in report.get("scenarios", []) if e["verdict"] == "passed"}
    bug = {sid: checks for sid, checks in found.caught_by.items() if sid in passed}
    if bug:
        found.caught_by = bug
        return found
    bug = signature_only(found, folder, pristine)
    if bug:
        found.why = (
            "the unpatched release fails these reproducers only with other signatures: "
            + ", ".join(bug)
        )
        found.caught_by = bug
        return found
    found.outcome = "missed"
    found.why = "every finding fails on the unpatched release too: " + ", ".join(
        f"{sid} ({', '.join(checks)})" for sid, checks in found.caught_by.items()
    ) + _shared(found)
    found.caught_by = {}
    return found


def signature_only(found: Replay, folder: Path, pristine: Path) -> dict[str, list[str]]:
    """The reproducers whose finding's signature the unpatched tree does not show on them.

    Each is run in a baseline process (:mod:`kvconform.fuzz.baseline`) on ``pristine``,
    signed as the explorer signs a failure: a reproducer the unpatched release fails only
    with another signature (a standing failure of its own) still shows what the patch changed.
    """
    summary = json.loads((folder / "explore" / "explore-summary.json").read_text("utf-8"))
    findings = {
        _SCENARIO_ID.match(Path(f["file"]).stem)[0]: (Path(f["file"]), Signature(*f["parts"]))  # type: ignore[index]
        for f in summary.get("findings", [])
        if f["file"]
    }
    kept: dict[str, list[str]] = {}
    started = time.perf_counter()
    with BaselineProcess(pristine, folder / "unpatched" / "signatures.log") as unpatched:
        for sid, checks in found.caught_by.items():
            path, signature = findings[sid]
            answer = unpatched.judge(path.read_text(encoding="utf-8"))
            if answer.outcome not in UNJUDGED and not answer.shows(signature):
                kept[sid] = checks
    found.seconds += time.perf_counter() - started
    return kept


def _explore(
    tree: Path,
    folder: Path,
    seconds: float,
    max_findings: int,
    baseline: Path | None,
) -> Replay:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "explore"
    command = [
        sys.executable, "-m", "kvconform", "explore", "--vllm-src", str(tree),
        "--budget", f"{seconds:g}", "--seed", str(SEED), "--out", str(out),
        "--max-findings", str(max_findings),
        *(["--baseline-src", str(baseline)] if baseline is not None else []),
        # Detected means exit 1 on any finding: the differential baseline and the
        # reproducers' run on the unpatched release decide, not the triaged findings of
        # the pinned vLLM.
        "--no-known-findings",
    ]  # fmt: skip
    started = time.perf_counter()
    done = run_logged(command, folder, EXPLORE_LOG)
    seconds_taken = time.perf_counter() - started
    summary_file = out / "explore-summary.json"
    if done.returncode not in (0, 1) or not summary_file.is_file():
        return Replay(
            "broken", done.returncode, seconds=seconds_taken, report_dir=str(folder),
            why=f"kvconform explore exited {done.returncode}: "
            + log_tail(folder, log_file=EXPLORE_LOG),
        )  # fmt: skip
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    # Keyed by the reproducer's scenario id (its name; the file adds the signature's slug).
    caught = {
        _SCENARIO_ID.match(Path(f["file"]).stem)[0]: [f["parts"][0]]  # type: ignore[index]
        for f in summary.get("findings", [])
        if f["file"]
    }
    counts = {"examples": int(summary.get("examples", 0)), "findings": len(caught)}
    compared = summary.get("baseline")
    if compared is not None:
        counts["baseline_runs"] = int(compared["search_runs"]) + int(compared["shrink_runs"])
        counts["baseline_failures"] = len(compared["failures"])
    result = Replay(
        "detected" if done.returncode == 1 else "missed",
        done.returncode,
        caught,
        counts,
        seconds_taken,
        why="" if caught else f"no finding in {summary.get('examples', 0)} workloads",
        report_dir=str(folder),
    )
    if not caught:
        result.why += _shared(result)
    return result


def _shared(result: Replay) -> str:
    """What the run met that the unpatched release shows too (its summary's ``baseline``)."""
    summary_file = Path(result.report_dir) / "explore" / "explore-summary.json"
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    shown = [entry["signature"] for entry in summary.get("baseline", {}).get("failures", [])]
    if not shown:
        return ""
    return "; failures the unpatched release shows too, passed over: " + ", ".join(shown)
