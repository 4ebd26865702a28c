"""What every report writer shares: the rerun command and the failure grouping."""

from __future__ import annotations

import shlex

from kvconform.harness.results import RunReport, ScenarioResult


def rerun_command(result: ScenarioResult, report: RunReport | None = None) -> str:
    """The command that runs this scenario alone, against the same vLLM."""
    parts = ["kvconform", "run", result.file, "-k", result.id]
    if report is not None and report.vllm_release:
        parts += ["--vllm-release", report.vllm_release]
    elif report is not None and report.vllm_source == "src" and report.vllm_path:
        parts += ["--vllm-src", report.vllm_path.removesuffix("/vllm")]
    return shlex.join(parts)
