"""``report.json``: the machine-readable record of a run.

Schema ``kvconform-report/1`` (documented in ``docs/report-json.md``): at the
top, where and against which vLLM the run happened; then one entry per
scenario with its id, file, verdict and every failure (check, step, request,
group, spec type, live, predicted, warmup, floor, message), after the
root-cause groups those failures fall into; at the end, the
coverage of the run (:mod:`kvconform.harness.coverage`). A scenario listed as a
known divergence that conforms now has the verdict ``xpassed``.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from kvconform import __version__
from kvconform.model.results import RunReport, ScenarioResult

SCHEMA = "kvconform-report/1"


def scenario_json(result: ScenarioResult, report: RunReport) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": result.id,
        "file": result.file,
        "line": result.line,
        "kind": result.kind,
        "tags": list(result.tags),
        "verdict": result.verdict.value,
        "error_kind": result.error_kind.value if result.error_kind else None,
        "error": result.error,
        "skip_reason": result.skip_reason,
        "description": result.description,
        "expectation": result.expectation,
        "expectation_evidence": result.expectation_evidence,
        "duration_s": round(result.duration, 6),
        "rerun": report.rerun_command(result),
        "failures": [f.to_json() for f in result.failures],
        "skipped_checks": dict(result.skipped_checks),
    }
    if result.settings is not None:
        entry.update(result.settings.to_json())
    trajectory = result.trajectory
    if trajectory is not None:
        entry.update(
            lookahead=trajectory.lookahead,
            lookahead_source=trajectory.lookahead_source,
            method=trajectory.method,
            parties=list(trajectory.parties),
            groups=[
                {
                    "type": g.type,
                    "label": g.label,
                    "block_size": g.block_size,
                    "vllm_manager": g.manager,
                    "vllm_manager_file": g.manager_file,
                }
                for g in trajectory.groups
            ],
            notes=list(trajectory.notes),
            steps=len({o.step for o in trajectory.observations}),
            partial=trajectory.partial,
        )
        if trajectory.slots is not None:
            slots = trajectory.slots
            entry["slots"] = {
                "mode": slots.mode,
                "skipped": slots.skipped,
                "groups_mapped": list(slots.groups_mapped),
                "groups_skipped": {str(g): why for g, why in slots.groups_skipped.items()},
                "kernel_calls": slots.kernel_calls,
                "rows": slots.rows,
                "positions": slots.positions,
                "escapes": len(slots.escapes),
                "seconds": round(slots.seconds, 6),
            }
    return entry


def report_json(report: RunReport) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kvconform": __version__,
        "vllm": {
            "version": report.vllm_version,
            "source": report.vllm_source,
            "path": report.vllm_path,
            "release": report.vllm_release,
            "error": report.vllm_error,
        },
        "torch": report.torch_version,
        "device": report.device,
        "python": platform.python_version(),
        "command": report.command,
        "started": report.started,
        "duration_s": round(report.duration, 3),
        "phases_s": {name: round(seconds, 3) for name, seconds in report.phases.items()},
        "exit_status": report.exit_status,
        "checks": list(report.checks),
        "rerun_options": list(report.rerun_options),
        "shard": report.shard,
        "counts": report.counts(),
        "notes": list(report.notes),
        "input_errors": [
            {
                "file": e.where.file,
                "line": e.where.line,
                "field": e.where.field,
                "message": e.message,
            }
            for e in report.input_errors
        ],
        "expectations_file": report.expectations_file,
        "root_causes": [cause.to_json() for cause in report.root_causes],
        "scenarios": [scenario_json(r, report) for r in report.results],
        "coverage": report.coverage.to_json() if report.coverage is not None else None,
        "vllm_coverage": (
            report.vllm_coverage.to_json() if report.vllm_coverage is not None else None
        ),
    }


def write_json(report: RunReport, directory: Path) -> Path:
    path = directory / "report.json"
    path.write_text(json.dumps(report_json(report), indent=1) + "\n", encoding="utf-8")
    return path
