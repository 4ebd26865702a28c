"""Real bugs vLLM shipped in its startup planning, its abort path, its KV-connector allocation
and its Mamba chunk split, caught on vLLM's own code.

Each bug's patch from the catalogue (``realbugs/catalogue.yaml``, ``realbugs/patches/``)
is applied to a copy of the installed vLLM's Python tree, and the scenario that catches
it runs against the copy in a fresh process (``--vllm-src``), as ``kvconform realbugs``
does with the whole corpus. Unpatched, the same scenarios pass (the corpus runs green on
the installed vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_copy import run_kvconform, tree_with_patch

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "realbugs" / "patches"

# bug -> (scenario file, the check that fails, a phrase of its message)
CATCHES = {
    "capacity-check-counts-null-block": (
        "scenarios/startup/startup-override-null-block.yaml",
        "startup",
        "accepts a pool of 64 blocks",
    ),
    "hybrid-capacity-check-first-group-only": (
        "scenarios/startup/startup-hybrid-mamba-first.yaml",
        "startup",
        "one request of 1024 tokens needs 65 blocks by the floor",
    ),
    "num-gpu-blocks-override-ignored-by-capacity-check": (
        "scenarios/startup/startup-override-below-profiled.yaml",
        "startup",
        "accepts a pool of 48 blocks",
    ),
    "abort-during-async-kv-load-frees-blocks": (
        "scenarios/scheduler/sched-remote-prefill-abort.yaml",
        "sanity",
        "when the client aborted it",
    ),
    "connector-alloc-evicts-other-group-hit": (
        "scenarios/admission/connector-tokens-beside-hybrid-hit.yaml",
        "sanity",
        "is in this group's table and in request b's group 1 at once",
    ),
    "mamba-align-chunk-ends-off-grid": (
        "scenarios/scheduler/sched-mamba-align-chunk-on-grid.yaml",
        "sanity",
        "the prefill chunk from position 40 to 100 starts inside block 0",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(CATCHES))
def test_the_bug_put_back_turns_its_scenario_red(bug: str, pristine_tree: Path, tmp_path: Path):
    scenario, check, words = CATCHES[bug]
    tree = tree_with_patch(pristine_tree, tmp_path / "tree", PATCHES / f"{bug}.patch")
    proc = run_kvconform(
        "run", scenario, "--vllm-src", tree, "--report-dir", tmp_path / "report", cwd=REPO
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["vllm"]["source"] == "src"
    (entry,) = report["scenarios"]
    assert entry["verdict"] == "failed", entry
    messages = [f["message"] for f in entry["failures"] if f["check"] == check]
    assert any(words in m for m in messages), entry["failures"]


@pytest.mark.slow
def test_an_abort_during_a_load_that_leaves_a_block_unwritten_is_judged_not_a_crash(
    pristine_tree: Path, tmp_path: Path
):
    # The load reports a block of a's table unwritten after vLLM freed a's blocks at the
    # abort: the scheduler oracle once read that block from a's (now empty) table and raised
    # IndexError, so the bug showed as a crash of kvconform's own code. It takes the block
    # from those the load began with, and the sanity invariant judges the free.
    bug = "abort-during-async-kv-load-frees-blocks"
    tree = tree_with_patch(pristine_tree, tmp_path / "tree", PATCHES / f"{bug}.patch")
    scenario = "scenarios/scheduler/sched-remote-load-block-failure-abort.yaml"
    proc = run_kvconform(
        "run", scenario, "--vllm-src", tree, "--report-dir", tmp_path / "report", cwd=REPO
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (entry,) = json.loads((tmp_path / "report" / "report.json").read_text())["scenarios"]
    assert (entry["verdict"], entry["error_kind"], entry["error"]) == ("failed", None, None)
    invariants = {f["detail"]["invariant"] for f in entry["failures"] if f["check"] == "sanity"}
    # The scheduler bookkeeping family sees the same early free from its side: the request's
    # blocks went back (it "ended") while the scheduler still tracks its load.
    assert "hands out a block a KV load still writes into" in invariants, entry["failures"]
    assert invariants <= {
        "hands out a block a KV load still writes into",
        "keeps per-request state of a request that has ended",
    }, entry["failures"]
    assert any("when the client aborted it" in f["message"] for f in entry["failures"])
