"""The slow path: a mutant in a fresh process, against a copy of vLLM's tree.

A decorator or a parameter default is evaluated when ``def`` runs, at import;
swapping the function's code afterwards cannot express a mutant there. Such a
mutant gets what a user's ``--vllm-src`` run gets: a copy of the vLLM Python
tree in use (hard links, so it costs no space and a second), the one file
replaced by its mutated text, and a new interpreter that imports that tree and
runs the reached scenarios (``python -m kvconform.mutate.fresh JOB``). It
prints the same verdict payload a forked child writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvconform.harness.releases import link_tree
from kvconform.mutate.outcome import Outcome

FRESH_TIMEOUT_S = 300.0


def run_fresh(
    package: str,
    module_file: str,
    mutated_text: str,
    scenario_ids: Sequence[str],
    scenario_files: Sequence[str],
    clean: dict[str, Outcome],
    checks: Sequence[str],
    timeout: float = FRESH_TIMEOUT_S,
) -> dict[str, Any]:
    """The verdict payload of one mutant run in a new interpreter."""
    with tempfile.TemporaryDirectory(prefix="kvconform-mutant-") as tmp:
        try:
            root = link_tree(Path(package), Path(tmp) / "tree")
        except OSError as exc:
            # Not the mutant's doing (the tree went away under the campaign): say so and
            # let the campaign write its report.
            return {"verdict": "skipped", "note": f"could not copy the vLLM tree: {exc}"}
        relative = Path(module_file).resolve().relative_to(Path(package).resolve())
        target = root / "vllm" / relative
        target.unlink()  # a hard link: never write through it into the original
        target.write_text(mutated_text, encoding="utf-8")
        job = Path(tmp) / "job.json"
        job.write_text(
            json.dumps(
                {
                    "tree": str(root),
                    "files": list(scenario_files),
                    "ids": list(scenario_ids),
                    "clean": {k: _outcome_json(v) for k, v in clean.items() if k in scenario_ids},
                    "checks": list(checks),
                }
            )
        )
        try:
            done = subprocess.run(
                [sys.executable, "-m", "kvconform.mutate.fresh", str(job)],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"verdict": "timeout", "note": f"fresh process killed after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        payload = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        payload = {}
    if "verdict" not in payload:
        # vLLM did not import with the mutant in place, or the process died.
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"verdict": "incompetent", "note": f"fresh process failed: {tail[0][:300]}"}
    return dict(payload)


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "verdict": outcome.verdict,
        "error_kind": outcome.error_kind,
        "failures": sorted([list(k) for k in outcome.failures], key=str),
        "message": outcome.message,
    }


def _outcome_from(data: dict[str, Any]) -> Outcome:
    return Outcome(
        data["verdict"],
        data["error_kind"],
        frozenset(tuple(k) for k in data["failures"]),
        data.get("message", ""),
    )


def main(job_file: str) -> int:
    from kvconform.harness.session import RunRequest, Session
    from kvconform.mutate.outcome import judge_mutant, outcome_of

    job = json.loads(Path(job_file).read_text())
    # The same session as the campaign's (the nearest expectations file of each
    # scenario), against the mutated tree.
    session = Session(
        RunRequest(paths=tuple(job["files"]), checks=tuple(job["checks"]), vllm_src=job["tree"])
    )
    by_id = {s.id: s for s in session.select().scenarios}
    scenarios = [by_id[i] for i in job["ids"] if i in by_id]
    clean = {k: _outcome_from(v) for k, v in job["clean"].items()}
    payload = judge_mutant(scenarios, lambda s: outcome_of(session.run_scenario(s)), clean)
    sys.stdout.write("\n" + json.dumps(payload) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM's teardown takes seconds and has nothing to say


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
