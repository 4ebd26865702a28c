"""The release matrix's own logic, on rows written by hand: no vLLM, no network.

The rows stand for what :mod:`kvconform.matrix.runner` reads back from each
release's ``report.json``; ``test_release_matrix_slice.py`` runs the real thing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvconform.bisect import release_index
from kvconform.errors import UsageError
from kvconform.matrix import command
from kvconform.matrix.runner import ReleaseRun, ScenarioCell, read_run
from kvconform.matrix.table import Matrix, reason_of, render_console, write_matrix

ASYNC = (
    "vLLM {v} lacks support for these settings (scenarios/scheduler/{f}.yaml:{n}: scheduler): "
    "Currently, async scheduling is only supported with EAGLE/MTP"
)


def row(release, tmp_path, supported=True, exit_status=0, **cells) -> ReleaseRun:
    scenarios = {
        sid: ScenarioCell(*cell) if isinstance(cell, tuple) else ScenarioCell(cell, "trajectory")
        for sid, cell in cells.items()
    }
    counts: dict[str, int] = {}
    for cell in scenarios.values():
        counts[cell.verdict] = counts.get(cell.verdict, 0) + 1
    return ReleaseRun(
        release, tmp_path / release, supported, exit_status, counts, scenarios, duration=12.0
    )


def test_exit_status_is_the_worst_supported_release(tmp_path):
    old = row("0.27.1", tmp_path, supported=False, exit_status=1, w=("failed", "warmup"))
    good = row("0.28.0", tmp_path, a="passed")
    assert Matrix([old, good], "0.28.0", "scenarios").exit_status() == 0
    red = row("0.29.0", tmp_path, exit_status=1, a="failed")
    unexercised = row("0.30.0", tmp_path, exit_status=3, a="error")
    assert Matrix([good, unexercised], "0.28.0", "").exit_status() == 3
    assert Matrix([good, unexercised, red], "0.28.0", "").exit_status() == 1
    bad_input = row("0.31.0", tmp_path, exit_status=2)
    # A failure outranks bad input, as in one run.
    assert Matrix([red, bad_input], "0.28.0", "").exit_status() == 1
    assert Matrix([good, bad_input], "0.28.0", "").exit_status() == 2
    # A supported release whose run wrote no report cannot pass for green.
    missing = ReleaseRun("0.32.0", tmp_path / "0.32.0", True, None, problem="no such release")
    assert Matrix([good, missing], "0.28.0", "").exit_status() == 3


def test_changes_between_neighbours_name_each_flipped_scenario(tmp_path):
    first = row("0.28.0", tmp_path, a="failed", b="passed", c="error")
    second = row("0.29.0", tmp_path, a="failed", b="passed", c="passed", d="passed")
    third = row("0.30.0", tmp_path, a="passed", b="passed", c="passed", d="passed")
    (one, two) = Matrix([first, second, third], "0.28.0", "").changes()
    assert (one[0].release, one[1].release) == ("0.28.0", "0.29.0")
    assert [(c.scenario, c.before, c.after) for c in one[2]] == [
        ("c", "error", "passed"),
        ("d", "—", "passed"),
    ]
    assert [(c.scenario, c.before, c.after) for c in two[2]] == [("a", "failed", "passed")]


def test_a_release_without_a_report_is_left_out_of_the_changes(tmp_path):
    first = row("0.28.0", tmp_path, a="passed")
    gone = ReleaseRun("0.29.0", tmp_path / "0.29.0", True, None, problem="pip failed")
    third = row("0.30.0", tmp_path, a="failed", exit_status=1)
    ((older, newer, changed),) = Matrix([first, gone, third], "0.28.0", "").changes()
    assert (older.release, newer.release) == ("0.28.0", "0.30.0")
    assert [(c.before, c.after) for c in changed] == [("passed", "failed")]
    assert Matrix([gone], "0.28.0", "").notes(gone) == ["pip failed"]


def test_rows_below_the_minimum_say_what_kvconform_does_there(tmp_path):
    old = row(
        "0.27.1",
        tmp_path,
        supported=False,
        exit_status=1,
        w1=("failed", "warmup", "[floor] step 1 (warmup_kernels #2) request _warmup_0_ ..."),
        w2=("failed", "warmup", "[floor] step 2 ..."),
        w3=("passed", "warmup"),
        t1=("passed", "trajectory"),
        s1=("unsupported", "scheduler", ASYNC.format(v="0.27.1", f="sched-ngram", n=15)),
        s2=("unsupported", "scheduler", ASYNC.format(v="0.27.1", f="sched-prefix", n=17)),
    )
    notes = Matrix([old], "0.28.0", "").notes(old)
    assert notes[0].startswith("below kvconform's minimum 0.28.0")
    assert notes[1].startswith("2 of 3 warmup scenarios fail: the upstream warmup bug")
    assert notes[2] == "the other scenarios: 1 passed, 2 unsupported"
    # One cause, counted once, whatever file, line and version its message names.
    assert notes[3] == (
        "unsupported (2): lacks support for these settings: Currently, async scheduling "
        "is only supported with EAGLE/MTP"
    )
    assert len(notes) == 4  # the warmup failures are the upstream bug, not listed again


def test_reason_of_drops_what_differs_per_scenario():
    assert (
        reason_of("[slots] step 3 (line 9, spec 3) request a, group 0: ...") == "[slots] failures"
    )
    assert reason_of("vLLM 0.28.0 lacks vllm.v1.kv_cache_interface.CircularBufferSpec") == (
        "lacks vllm.v1.kv_cache_interface.CircularBufferSpec"
    )


def test_written_reports_link_each_release_run(tmp_path):
    rows = [
        row("0.28.0", tmp_path, exit_status=1, a="failed", b="passed"),
        row("0.29.0", tmp_path, a="passed", b="passed"),
    ]
    matrix = Matrix(rows, "0.28.0", "scenarios --checks all")
    paths = write_matrix(matrix, tmp_path)
    assert [p.name for p in paths] == ["matrix.json", "matrix.md", "matrix.html"]
    data = json.loads(paths[0].read_text())
    assert data["schema"] == "kvconform-matrix/1" and data["exit_status"] == 1
    assert data["releases"][0]["verdicts"] == {"a": "failed", "b": "passed"}
    assert data["changes"] == [
        {
            "from": "0.28.0",
            "to": "0.29.0",
            "scenarios": [{"id": "a", "from": "failed", "to": "passed"}],
        }
    ]
    markdown = paths[1].read_text()
    assert "| release | passed | failed | exit | time | report | notes |" in markdown
    assert "| 0.28.0 | 1 | 1 | 1 | 12 s | [report.html](0.28.0/report.html) |" in markdown
    assert "  - `a`: failed → passed" in markdown
    page = paths[2].read_text()
    assert '<a href="0.28.0/report.html#groups">1</a>' in page
    assert '<a href="0.29.0/report.html#passed">2</a>' in page
    assert render_console(matrix)[1].split() == ["0.28.0", "1", "1", "1"]


def test_read_run_reads_what_kvconform_run_wrote(tmp_path):
    folder = tmp_path / "0.30.0"
    folder.mkdir()
    report = {
        "exit_status": 1,
        "counts": {"passed": 1, "failed": 1, "error": 0},
        "vllm": {"version": "0.30.0", "error": None},
        "scenarios": [
            {"id": "a", "kind": "warmup", "verdict": "passed", "error": None, "failures": []},
            {
                "id": "b",
                "kind": "trajectory",
                "verdict": "failed",
                "error": None,
                "failures": [{"check": "floor", "message": "step 0 ..."}],
            },
        ],
    }
    (folder / "report.json").write_text(json.dumps(report))
    run = read_run("0.30.0", folder, True)
    assert (run.exit_status, run.vllm_version, run.counts["failed"]) == (1, "0.30.0", 1)
    assert run.scenarios["b"] == ScenarioCell("failed", "trajectory", "[floor] step 0 ...")
    assert read_run("0.31.0", tmp_path / "nowhere", True).exit_status is None


INDEX = ["0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0rc1"]


@pytest.fixture
def fake_index(monkeypatch):
    monkeypatch.setattr(release_index, "list_releases", lambda say=print: list(INDEX))


@pytest.mark.usefixtures("fake_index")
def test_release_ranges_lists_and_open_ends():
    say = print
    assert command.releases_in("0.28.0..0.30.0", say) == ["0.28.0", "0.29.0", "0.30.0"]
    assert command.releases_in("0.31.0..", say) == ["0.31.0", "0.32.0", "0.33.0"]
    assert command.releases_in("0.32.0,0.28.0", say) == ["0.28.0", "0.32.0"]
    with pytest.raises(UsageError, match="0.26.0 is not on pip's index"):
        command.releases_in("0.26.0,0.28.0", say)
    with pytest.raises(UsageError, match="newer than the newest release, 0.33.0"):
        command.releases_in("0.35.0..", say)
    with pytest.raises(UsageError, match="'x' is not a version"):
        command.releases_in("x..", say)


def test_run_arguments_are_absolute_because_each_run_starts_in_its_own_folder(tmp_path):
    scenarios = Path(__file__).resolve().parents[1] / "scenarios"
    args = argparse.Namespace(
        paths=[str(scenarios / "warmup")],
        expression="eagle",
        checks="all",
        expectations=None,
        no_expectations=True,
    )
    assert command.run_arguments(args) == [
        str(scenarios / "warmup"), "-k", "eagle", "--checks", "all", "--no-expectations",
    ]  # fmt: skip
    args.paths = [str(tmp_path / "missing")]
    with pytest.raises(UsageError, match="no such file or folder"):
        command.run_arguments(args)
