"""``kvconform run --record-dir`` and ``kvconform judge``: recorded runs judged without vLLM.

``judge`` runs here in a fresh interpreter whose import system refuses vLLM, torch and
Triton (an import hook that raises on them), so a pass shows it never imports them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_verdicts import EXACT_FULL_POOL  # the exact-pool scenario the verdict test injects into
from vllm_copy import REPO, run_kvconform, tree_with_replacement

from kvconform.model import facts as f
from kvconform.model.observations import GroupInfo, Observation, Trajectory
from kvconform.model.recording import RECORDING_VERSION, Recording, dumps
from kvconform.model.results import ScenarioResult, Verdict

# `kvconform ARGS` with vLLM, torch and Triton unimportable; it also fails if vLLM got
# into sys.modules some other way.
WITHOUT_VLLM = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "torch", "triton"):
            raise ImportError(f"{name} imported")
        return None
sys.meta_path.insert(0, Refuse())
from kvconform.fronts.cli import main
status = main(sys.argv[1:])
assert "vllm" not in sys.modules
sys.exit(status)
"""


def judge_without_vllm(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM, "judge", *map(str, args)],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _recording(tmp_path: Path) -> Recording:
    """A run whose live oracle recorded a first chunk's hit of 48 where 64 is stated."""
    groups = (GroupInfo(0, "full_attention", 16, "full", False),)
    trajectory = Trajectory(groups, 0, "no speculative decoding", max_model_len=256)
    trajectory.observations.append(
        Observation(1, 9, "b", "prefill 80", 0, 0, 80, 0, 5, 5, None, None, None, [1, 2, 3, 4, 5])
    )
    trajectory.num_blocks = 16
    trajectory.facts.append(f.Fact(1, 9, "b", "prefill 80", f.AdmissionHit(48, 64)))
    outcome = ScenarioResult("stated-hit", str(tmp_path / "hit.yaml"), Verdict.PASSED)
    return Recording(
        "stated-hit",
        outcome.file,
        "trajectory",
        trajectory,
        outcome=outcome,
        checks=("floor", "sanity"),
        vllm={"version": "0.34.0", "source": "installed", "path": None, "release": None,
              "torch": None, "device": "cpu"},  # fmt: skip
    )


def test_judge_judges_a_recording_without_importing_vllm(tmp_path: Path) -> None:
    folder = tmp_path / "recorded"
    folder.mkdir()
    (folder / "0001-stated-hit.json").write_text(dumps(_recording(tmp_path)), encoding="utf-8")
    done = judge_without_vllm(folder, "--report-dir", tmp_path / "report", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (entry,) = report["scenarios"]
    assert entry["verdict"] == "failed"
    assert [x["message"] for x in entry["failures"]] == [
        "step 1 (line 9, prefill 80) request b: gets a prefix-cache hit of 48 tokens, but the "
        "scenario states 64"
    ]
    assert report["exit_status"] == 1 and report["vllm"]["version"] == "0.34.0"


def test_judge_refuses_a_recording_of_another_version_naming_it(tmp_path: Path) -> None:
    text = dumps(_recording(tmp_path))
    assert f'"version":{RECORDING_VERSION},' in text
    text = text.replace(f'"version":{RECORDING_VERSION},', '"version":99,', 1)
    path = tmp_path / "old.json"
    path.write_text(text, encoding="utf-8")
    done = judge_without_vllm(path, "--report-dir", tmp_path / "report", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "old.json" in done.stdout + done.stderr and "version 99" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr



# Corpus files whose verdicts come from recorded facts and known divergences: a
# KV-events xfail (trajectory mode) and an encoder xfail (scheduler mode, two modes).
CORPUS = [
    REPO / "scenarios" / "hybrid" / "kv-events-full-report-sliding-window-null-columns.yaml",
    REPO / "scenarios" / "scheduler" / "sched-encoder-priority-preemption.yaml",
]


def _entries(report: Path) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    data = json.loads(report.read_text())
    return {
        s["id"]: (s["verdict"], [(x["check"], x["message"]) for x in s["failures"]])
        for s in data["scenarios"]
    }


@pytest.mark.slow
def test_judge_gives_the_verdicts_of_the_run_it_judges_on_an_injected_bug(
    pristine_tree, tmp_path: Path
) -> None:
    # The allocator rounds a block-aligned token count up one block too many: the exact
    # pool refuses b (capacity) and a holds more than its floor. Judged from the
    # recordings, without vLLM, the run must come out as it did.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "        num_required_blocks = cdiv(num_tokens, self.block_size)\n"
        "        if apply_admission_cap",
        "        num_required_blocks = num_tokens // self.block_size + 1\n"
        "        if apply_admission_cap",
    )
    scenario = tmp_path / "scenarios" / "full-exact.yaml"
    scenario.parent.mkdir()
    scenario.write_text(EXACT_FULL_POOL.lstrip(), encoding="utf-8")
    recorded = tmp_path / "recorded"
    run = run_kvconform(
        "run", scenario, *CORPUS, "--vllm-src", tree, "--record-dir", recorded,
        "--report-dir", tmp_path / "run", "-q", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    judged = judge_without_vllm(recorded, "--report-dir", tmp_path / "judged", "-q", cwd=tmp_path)
    assert judged.returncode == run.returncode, judged.stdout[-3000:] + judged.stderr[-3000:]
    before, after = _entries(tmp_path / "run" / "report.json"), _entries(
        tmp_path / "judged" / "report.json"
    )
    assert after == before
    assert before["full-exact"][0] == "failed"
    # The corpus files' known divergences were applied the same way (the bug may make a
    # listed divergence conform: xpassed).
    others = {v for sid, (v, _) in before.items() if sid != "full-exact"}
    assert others and others <= {"xfailed", "xpassed"}, before
    counts = [json.loads((tmp_path / d / "report.json").read_text())["counts"] for d in ("run", "judged")]
    assert counts[0] == counts[1]
