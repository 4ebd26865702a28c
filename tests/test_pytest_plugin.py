"""``pytest scenarios/``: YAML files become items; ids, tags, xfail and bad files behave."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
GOOD = """
name: good
tags: [eagle, chunked-prefill]
matrix: {num_speculative_tokens: [1, 2]}
speculative: {method: eagle}
requests: {a: {prompt_len: 30}}
steps: [{a: {prefill: 30}}, {a: {spec: 1, accepted: 0}}]
"""
SINK = """
name: sink
model: {groups: [{type: sink_full_attention, sink_len: 16}]}
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}]
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    scenarios = pytester.mkdir("scenarios")
    (scenarios / "good.yaml").write_text(GOOD)
    (scenarios / "sink.yaml").write_text(SINK)
    (scenarios / "bad.yaml").write_text("requests: {a: {prompt_len: 5}}\nsteps: [{a: fly}]\n")
    (scenarios / "expectations.yaml").write_text(
        "- {id: sink, checks: [error], reason: sink groups crash the manager in 0.33}\n"
    )
    return pytester


def test_items_outcomes_and_messages(vllm, project):
    result = project.runpytest_inprocess("scenarios", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=2, xfailed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*scenarios/bad.yaml:2: steps[[]0[]].a: unknown action 'fly'*",
            "PASSED scenarios/good.yaml::good?k1?",
            "XFAIL scenarios/sink.yaml::sink - sink groups crash the manager in 0.33",
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_k_and_tags_select(vllm, project):
    project.runpytest_inprocess("scenarios", "-p", "no:cacheprovider", "-k", "k2").assert_outcomes(
        passed=1
    )
    tagged = project.runpytest_inprocess(
        "scenarios", "-p", "no:cacheprovider", "-m", "chunked-prefill"
    )
    tagged.assert_outcomes(passed=2)


def test_a_failing_scenario_shows_the_checks_not_a_traceback(vllm, project):
    (project.path / "scenarios" / "expectations.yaml").unlink()
    result = project.runpytest_inprocess("scenarios", "-p", "no:cacheprovider", "-k", "sink")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*sink: error*", "*raised TypeError*", "*rerun alone: kvconform run *sink.yaml::sink*"]
    )


@pytest.mark.slow
def test_xdist_imports_vllm_once_per_worker(tmp_path: Path):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    shutil.copy(ROOT / "conftest.py", tmp_path)
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "scenarios", "-n", "2", "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    loads_by_pid: dict[str, set[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        loads_by_pid.setdefault(props["pid"], set()).add(props["vllm_loads"])
    assert len(loads_by_pid) == 2, "both workers ran scenarios"
    for loads in loads_by_pid.values():
        # One import per worker: every item of a worker saw the same single load.
        assert len(loads) == 1 and "," not in next(iter(loads))
