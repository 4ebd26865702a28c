"""``pytest scenarios/``: YAML files become items; ids, tags, xfail and bad files behave."""

from __future__ import annotations

import os
import re
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
    # Nothing failed, one file is bad: kvconform's exit 2, not pytest's 1.
    assert result.ret == 2
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
    assert result.ret == 1
    # A failure beside a bad file is still 1: the failure is a finding.
    beside = project.runpytest_inprocess("scenarios", "-p", "no:cacheprovider", "-k", "sink or bad")
    beside.assert_outcomes(failed=1, errors=1)
    assert beside.ret == 1
    result.stdout.fnmatch_lines(
        ["*raised TypeError*", "*sink: error*", "*rerun alone: kvconform run *sink.yaml::sink*"]
    )


@pytest.mark.slow
def test_xdist_imports_vllm_once_per_worker(tmp_path: Path):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    shutil.copy(ROOT / "conftest.py", tmp_path)
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "scenarios", "-n", "2", "--kvconform-xdist", "-q",
         "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    loads_by_pid: dict[str, set[str]] = {}
    pids_by_file: dict[str, set[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        loads_by_pid.setdefault(props["pid"], set()).add(props["vllm_loads"])
        pids_by_file.setdefault(case.get("classname", ""), set()).add(props["pid"])
    # Whole files to a worker (--dist loadfile): a matrix file's cases stay together.
    assert all(len(pids) == 1 for pids in pids_by_file.values()), pids_by_file
    assert len(loads_by_pid) == 2, "both workers ran scenarios"
    for loads in loads_by_pid.values():
        # One import per worker: every item of a worker saw the same single load.
        assert len(loads) == 1 and "," not in next(iter(loads))


# One variant fails on vLLM 0.33.0: the stated prefix-cache hit is the one without
# speculation, and under EAGLE vLLM keeps the last block of the shared prefix out.
MATRIX = """
name: mat
model: {enable_caching: true}
matrix: {method: [none, eagle]}
speculative: {method: eagle, num_speculative_tokens: 2}
requests:
  a: {prompt_len: 64}
  b: {prompt_len: 80, prefix_from: a, prefix_len: 64}
steps:
  - {a: {prefill: 64}}
  - {a: finish}
  - {b: {prefill: 80, expect_hit: 64}}
  - {b: finish}
"""


def test_last_failed_reruns_a_failed_matrix_id_and_the_summary_says_why(vllm, pytester):
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    scenarios = pytester.mkdir("scenarios")
    (scenarios / "mat.yaml").write_text(MATRIX)
    (scenarios / "good.yaml").write_text(GOOD)
    first = pytester.runpytest_inprocess("scenarios", "-rf")
    first.assert_outcomes(passed=3, failed=1)
    # The short summary carries the first failure line, not only the id.
    first.stdout.fnmatch_lines(
        ["FAILED scenarios/mat.yaml::mat[[]eagle[]] - [[]sanity[]] step 2 (line 12, prefill 80)*"]
    )
    again = pytester.runpytest_inprocess("scenarios", "--lf", "-v")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*scenarios/mat.yaml::mat[[]eagle[]] FAILED*"])
    first_failed = pytester.runpytest_inprocess("scenarios", "--ff", "-v")
    first_failed.assert_outcomes(passed=3, failed=1)
    # --ff: the failed matrix case runs first.
    ran = [line for line in first_failed.stdout.lines if re.search(r"::\S+ (PASSED|FAILED)", line)]
    assert len(ran) == 4 and "mat[eagle] FAILED" in ran[0], ran


def test_at_80_columns_the_first_message_is_printed_whole_above_the_short_summary(
    vllm, pytester, monkeypatch
):
    for name in ("CI", "BUILD_NUMBER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    scenarios = pytester.mkdir("scenarios")
    (scenarios / "a-scenario-file-with-a-rather-long-name.yaml").write_text(
        MATRIX.replace("name: mat", "name: a-scenario-with-a-long-id-too")
    )
    result = pytester.runpytest_inprocess("scenarios", "-rf", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.lines
    node = "scenarios/a-scenario-file-with-a-rather-long-name.yaml::a-scenario-with-a-long-id-too[eagle]"
    # pytest's own line has no room for the message at 80 columns ...
    assert any(line.startswith(f"FAILED {node}") for line in out)
    # ... so the section above it carries it, wrapped, every figure kept.
    start = next(i for i, line in enumerate(out) if "kvconform: first message the short" in line)
    assert out[start + 1] == f"FAILED {node}"
    wrapped = []
    for line in out[start + 2 :]:
        if not line.startswith("    "):
            break
        assert len(line) <= 80, line
        wrapped.append(line.strip())
    message = " ".join(wrapped)
    assert message.startswith("[sanity] step 2 (line 12, prefill 80) request b: ")
    assert re.search(r"prefix-cache hit of \d+ tokens, but the scenario states 64", message), (
        message
    )


def test_n_2_over_scenarios_only_is_declined_with_one_line(vllm, project):
    result = project.runpytest_inprocess("scenarios", "-n", "2", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, xfailed=1, errors=1)
    text = result.stdout.str()
    declined = [line for line in result.stdout.lines if line.startswith("kvconform: -n")]
    assert declined == [
        "kvconform: -n 2 declined: every pytest-xdist worker imports vLLM for itself, which "
        "takes longer than the scenarios' own work; running in one process (--kvconform-xdist "
        "keeps the workers, each taking whole files)"
    ]
    assert "bringing up nodes" not in text


def test_a_folder_of_scenarios_anywhere_is_collected(vllm, pytester):
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    elsewhere = pytester.mkdir("elsewhere")
    (elsewhere / "good.yaml").write_text(GOOD)
    # A folder of Python tests keeps its YAML data files to itself.
    tests = pytester.mkdir("tests")
    (tests / "test_x.py").write_text("def test_x():\n    pass\n")
    (tests / "data.yaml").write_text("not: a scenario\n")
    result = pytester.runpytest_inprocess("elsewhere", "tests", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_installed_plugin_collects_scenarios_without_a_conftest(tmp_path: Path):
    """pyproject declares the plugin as a pytest11 entry point; a dist-info with the same
    entry point on the path stands in for the installed package here."""
    import tomllib

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    site = tmp_path / "site"
    info = site / "kvconform_entry-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvconform-entry\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in points["pytest11"].items())
    )
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(folder), "--co", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "somewhere/good.yaml::good[k1]" in done.stdout and "2 tests collected" in done.stdout


def test_pytests_cache_is_on_and_never_committed():
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "cacheprovider" not in ini.get("addopts", "")
    assert "cache_dir" not in ini  # pytest's default: .pytest_cache/ in the checkout
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".pytest_cache/v/cache/lastfailed"], cwd=ROOT
    )
    assert ignored.returncode == 0, ".pytest_cache/ must be git-ignored"
