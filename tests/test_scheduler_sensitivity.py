"""Scheduler mode catches a scheduler that under-reserves: bugs injected into a COPY of vLLM.

The installed vLLM's Python tree is copied (``.py`` files and its dist-info;
compiled parts stay with the installed package, which ``--vllm-src`` keeps on
the path), one exact piece of ``Scheduler.schedule`` is replaced, and the
scheduler corpus is run against the copy in a subprocess, as a user would. The
copy is never the installed vLLM, which the other tests keep using.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_copy import run_kvconform, tree_with_replacement

REPO = Path(__file__).resolve().parent.parent

# The running-request allocation in Scheduler.schedule; the bug drops its lookahead.
RUNNING_ALLOCATION = """\
                    new_blocks = self.kv_cache_manager.allocate_slots(
                        request,
                        num_new_tokens,
                        num_lookahead_tokens=self.num_lookahead_tokens,
                    )"""


# The admission of a waiting request in Scheduler.schedule; the bug drops its lookahead.
ADMISSION_LOOKAHEAD = """\
                effective_lookahead_tokens = (
                    0 if limit_lookahead_tokens else self.num_lookahead_tokens
                )"""

# name -> (text in Scheduler.schedule, its buggy replacement)
BUGS = {
    "running-requests-without-lookahead": (
        RUNNING_ALLOCATION,
        RUNNING_ALLOCATION.replace(
            "num_lookahead_tokens=self.num_lookahead_tokens", "num_lookahead_tokens=0"
        ),
    ),
    "admissions-without-lookahead": (
        ADMISSION_LOOKAHEAD,
        "                effective_lookahead_tokens = 0",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(BUGS))
def test_a_scheduler_that_drops_the_lookahead_turns_scheduler_scenarios_red(
    bug: str, pristine_tree: Path, tmp_path: Path
):
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/core/sched/scheduler.py", *BUGS[bug]
    )
    scenario = REPO / "scenarios" / "scheduler" / "sched-eagle-family.yaml"
    proc = run_kvconform(
        "run",
        str(scenario),
        "-k",
        "eagle-k3",
        "--vllm-src",
        str(tree),
        "--report-dir",
        str(tmp_path),
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["vllm"]["source"] == "src"
    results = {s["id"]: s for s in report["scenarios"]}
    modes = {"sync", "async", "overlapped"}
    assert set(results) == {f"sched-eagle-family[eagle-k3-{m}]" for m in modes}
    for entry in results.values():
        assert entry["verdict"] == "failed"
        floor = [f for f in entry["failures"] if f["check"] == "floor"]
        assert floor, entry["failures"]
        for failure in floor:
            # Which step and request, and that the drafter's positions are the ones uncovered.
            assert failure["step"] is not None and failure["request"] in {"a", "b", "c"}
            assert failure["live"] < failure["floor"]
            assert "the drafter's positions" in failure["message"]
            # The report says which path lost the lookahead: admissions ("new, ...")
            # or requests already running.
            admitted = failure["action"].startswith(("new", "resumed"))
            assert admitted == (bug == "admissions-without-lookahead"), failure["message"]
    # The first failure points at a step and a request, in words a reader can act on.
    assert "FAILED" in proc.stdout and "[floor] step " in proc.stdout
    assert " request " in proc.stdout
