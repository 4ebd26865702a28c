"""``kvconform judge``: recorded runs judged again with the current checks, without vLLM.

``kvconform run --record-dir DIR`` writes each scenario's :class:`Recording` (what the
driver and the checks' parties recorded, before any check judged it). Judging reads
them back (files, or folders of ``*.json``, in the order the scenarios ran), judges
each recorded trajectory with the checks (:func:`kvconform.harness.runner.conclude`),
applies the known divergences of each scenario's expectations file, and concludes the
run as a session does (root causes, notes, exit status) into one :class:`RunReport`.
Nothing here imports vLLM: a run recorded on a GPU host is judged on a CPU machine.
The report has no coverage of what vLLM offers (that needs vLLM itself).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kvconform.errors import RecordingFormatError, UsageError
from kvconform.harness import runner
from kvconform.harness.expectations import apply_expectations
from kvconform.harness.root_causes import find_root_causes
from kvconform.harness.session import RunRequest, Session, skipped_notes
from kvconform.model.kinds import entry
from kvconform.model.recording import Recording, loads
from kvconform.model.results import RunReport, Verdict

__all__ = ["judge_recordings", "read_recordings"]


def recording_files(paths: Sequence[str]) -> list[Path]:
    """The recordings ``paths`` name: files as given, folders' ``*.json`` by name."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files += sorted(path.glob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"no recording or folder of recordings at {text}")
    if not files:
        raise UsageError(f"no recordings (*.json) in {', '.join(paths)}")
    return files


def read_recordings(paths: Sequence[str]) -> list[Recording]:
    """Every recording ``paths`` name; one that does not read is a usage error naming it."""
    recordings = []
    for path in recording_files(paths):
        try:
            recordings.append(loads(path.read_text(encoding="utf-8")))
        except RecordingFormatError as exc:
            raise UsageError(f"{path}: {exc}") from None
    return recordings


def judge_recordings(
    recordings: Sequence[Recording], request: RunRequest, checks: tuple[str, ...] | None = None
) -> RunReport:
    """The run the recordings make, judged now: with ``checks``, or those each recorded."""
    session = Session(request)
    first = recordings[0].vllm if recordings else {}
    report = RunReport(
        results=[],
        input_errors=[],
        vllm_version=first.get("version"),
        vllm_source=first.get("source"),
        vllm_path=first.get("path"),
        vllm_release=first.get("release"),
        torch_version=first.get("torch"),
        device=first.get("device"),
        started=time.time(),
        command=request.command,
        checks=checks or (recordings[0].checks if recordings else ()),
        rerun_options=request.rerun_options(),
    )
    started = time.perf_counter()
    for recording in recordings:
        assert recording.outcome is not None, "a recording written by run --record-dir"
        result = replace(recording.outcome)
        if recording.trajectory is not None and recording.trajectory.partial:
            # Cut short by a crash: shown as run showed it, never judged (the verdict
            # stays the crash the outcome holds).
            result.trajectory = recording.trajectory
        elif recording.trajectory is not None:
            selected = checks or recording.checks
            runner.conclude(
                result, recording.trajectory, selected, recording.cannot_run, recording.crash
            )
        if result.verdict is not Verdict.SKIPPED:  # a skip is not judged: run leaves it so
            version = recording.vllm.get("version") or ""
            expectations = session.expectations_for(recording.file)
            result = apply_expectations(result, expectations, version)
        report.results.append(result)
    report.input_errors += session.expectation_errors
    report.phases["judge"] = time.perf_counter() - started
    if report.device == "cpu" and any(entry(r.kind).drives_warmup for r in report.results):
        from kvconform.oracles.warmup import CPU_RUN_NOTE

        report.notes.append(CPU_RUN_NOTE)
    report.notes.extend(skipped_notes(report.results))
    report.root_causes = find_root_causes(report.results)
    report.exit_status = runner.exit_status(report.results, len(report.input_errors))
    report.duration = time.perf_counter() - started
    return report
