"""kvconform.peer's judgement: the baseline that makes the selection green, the verdict of a
run, the reach map that picks the test files, and the coverage summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.peer import baseline as baselines
from kvconform.peer.coverage_report import summarize
from kvconform.peer.reach import ReachMap, counted, from_coverage
from kvconform.peer.runner import PytestRun
from kvconform.peer.verdict import Verdict, decide


def ran(nodeid: str, outcome: str = "passed", when: str = "call", message: str = "") -> dict:
    return {"kind": "test", "nodeid": nodeid, "when": when, "outcome": outcome, "message": message}


def collect(nodeid: str, message: str) -> dict:
    return {"kind": "collect", "nodeid": nodeid, "outcome": "failed", "message": message}


FIRST_RUN = [
    ran("tests/v1/core/test_a.py::test_ok"),
    ran(
        "tests/v1/core/test_a.py::test_mm", "failed", message="OSError: no preprocessor_config.json"
    ),
    ran("tests/v1/core/test_a.py::test_fixture", "failed", "setup", "OSError: offline"),
    ran("tests/v1/core/test_a.py::test_gpu", "skipped", "setup", "needs CUDA"),
    ran("tests/v1/core/test_a.py::test_teardown", "passed"),
    ran("tests/v1/core/test_a.py::test_teardown", "failed", "teardown", "RuntimeError: leak"),
    collect("tests/v1/core/test_e2e.py", "ValueError: Unsupported platform"),
    collect("tests/v1/spec_decode/test_x.py", "ImportError: cannot import name 'y'"),
]
FILES = ["tests/v1/core", "tests/v1/worker/test_w.py", "tests/v1/spec_decode/test_x.py"]


def test_the_baseline_deselects_what_fails_here_and_leaves_out_what_does_not_collect():
    made = baselines.derive("0.33.0", "f" * 16, FILES, FIRST_RUN, 12.3)
    assert made.deselected == {
        "tests/v1/core/test_a.py::test_mm": "call: OSError: no preprocessor_config.json",
        "tests/v1/core/test_a.py::test_fixture": "setup: OSError: offline",
        "tests/v1/core/test_a.py::test_teardown": "teardown: RuntimeError: leak",
    }
    assert made.broken_files == {
        "tests/v1/core/test_e2e.py": "ValueError: Unsupported platform",
        "tests/v1/spec_decode/test_x.py": "ImportError: cannot import name 'y'",
    }
    # A broken file that was selected by name is dropped; one inside a folder is ignored.
    assert made.files == ["tests/v1/core", "tests/v1/worker/test_w.py"]
    assert baselines.ignore_args(made) == ["--ignore=tests/v1/core/test_e2e.py"]
    assert made.counts == {"passed": 2, "failed": 1, "skipped": 1, "errors": 2, "deselected": 3}


def test_the_baseline_round_trips_through_its_file(tmp_path: Path):
    made = baselines.derive("0.33.0", "f" * 16, FILES, FIRST_RUN, 12.3)
    baselines.save(made, tmp_path / "b.json")
    assert baselines.load(tmp_path / "b.json") == made
    assert baselines.load(tmp_path / "missing.json") is None


def test_run_counts():
    run = PytestRun(FIRST_RUN, 1, 1.0, "")
    assert run.counts() == {
        "passed": 2, "failed": 1, "skipped": 1, "errors": 2, "collect_errors": 2,
    }  # fmt: skip
    assert not run.timed_out and PytestRun([], None, 1.0, "").timed_out


@pytest.mark.parametrize(
    ("records", "returncode", "verdict", "failed"),
    [
        ([ran("t.py::a"), ran("t.py::b")], 0, Verdict.SURVIVED, None),
        ([], 5, Verdict.SURVIVED, None),  # everything deselected
        ([ran("t.py::a"), ran("t.py::b", "failed", message="AssertionError: 3 != 4")], 1,
         Verdict.KILLED, "t.py::b: AssertionError: 3 != 4"),
        ([ran("t.py::a", "failed", "setup", "ValueError: bad pool")], 1,
         Verdict.KILLED, "t.py::a: ValueError: bad pool"),
        ([collect("t.py", "SyntaxError: invalid syntax")], 2, Verdict.BROKEN,
         "t.py: SyntaxError: invalid syntax"),
        ([ran("t.py::a", "failed", message="ImportError: cannot import name 'BlockPool'")], 1,
         Verdict.BROKEN, "t.py::a: ImportError: cannot import name 'BlockPool'"),
        ([ran("t.py::a")], None, Verdict.TIMEOUT, None),
        ([ran("t.py::a", "failed", message="Failed: Timeout >60.0s")], 1, Verdict.TIMEOUT,
         "t.py::a: Failed: Timeout >60.0s"),
        ([], 4, Verdict.BROKEN, "pytest: ERROR: usage"),
    ],
)  # fmt: skip
def test_the_verdict_of_a_run(records, returncode, verdict, failed):
    got, failure = decide(records, returncode, "some output\nERROR: usage\n")
    assert got is verdict
    assert (str(failure) if failure else None) == failed


# -- reach and coverage ------------------------------------------------------------------------

SOURCE = """\
class BlockPool:
    def get_num_free_blocks(self):
        return self.free

    def take(self, n):
        if n > self.free:
            return None
        self.free -= n
        return n
"""


@pytest.fixture
def vllm_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "site" / "vllm"
    (folder / "v1" / "core").mkdir(parents=True)
    (folder / "v1" / "core" / "block_pool.py").write_text(SOURCE)
    (folder / "config").mkdir()
    (folder / "config" / "vllm.py").write_text("x = 1\n")
    return folder


def _function(lines: list[int], missing: list[list[int]] | None = None) -> dict:
    missing = missing or []
    return {
        "executed_lines": lines,
        "missing_branches": missing,
        "summary": {
            "num_statements": 4 if missing is not None and len(lines) > 1 else 1,
            "covered_lines": len(lines),
            "num_branches": 2 if len(lines) > 1 else 0,
            "covered_branches": 2 - len(missing) if len(lines) > 1 else 0,
        },
    }


def _report(vllm_dir: Path) -> dict:
    pool = str(vllm_dir / "v1" / "core" / "block_pool.py")
    config = str(vllm_dir / "config" / "vllm.py")
    return {
        "files": {
            pool: {
                "summary": {"num_statements": 7, "covered_lines": 6, "num_branches": 2,
                            "covered_branches": 1},
                "missing_branches": [[6, 7]],
                "contexts": {
                    "1": [""], "2": [""], "3": ["tests/v1/core/test_a.py::test_free|run"],
                    "6": ["tests/v1/core/test_b.py::test_take|run",
                          "tests/v1/worker/test_w.py::test_fix|setup"],
                    "8": ["tests/v1/core/test_b.py::test_take|run"],
                    "9": ["tests/v1/core/test_b.py::test_take|run"],
                },
                "functions": {
                    "BlockPool.get_num_free_blocks": _function([3]),
                    "BlockPool.take": _function([6, 8, 9], [[6, 7]]),
                    "": _function([1, 2, 5]),
                },
            },
            config: {
                "summary": {"num_statements": 1, "covered_lines": 1, "num_branches": 0,
                            "covered_branches": 0},
                "contexts": {"1": [""]},
                "functions": {"VllmConfig.other": _function([1]), "": _function([1])},
            },
        }
    }  # fmt: skip


def test_the_reach_map_names_the_tests_that_execute_each_function(vllm_dir: Path):
    made = from_coverage(_report(vllm_dir), vllm_dir)
    pool = "vllm/v1/core/block_pool.py"
    assert made.tests_reaching(pool, "BlockPool.get_num_free_blocks") == ["tests/v1/core/test_a.py"]
    assert made.tests_reaching(pool, "BlockPool.take") == [
        "tests/v1/core/test_b.py",
        "tests/v1/worker/test_w.py",  # in a fixture's setup: it reaches too
    ]
    assert made.nodeids(pool, "BlockPool.take")[0] == "tests/v1/core/test_b.py::test_take"
    # config/vllm.py counts only for num_lookahead_tokens; module-level code is no function.
    assert sorted(made.functions) == [
        f"{pool}::BlockPool.get_num_free_blocks",
        f"{pool}::BlockPool.take",
    ]
    assert made.files_for({(pool, "BlockPool.take")}) == made.tests_reaching(pool, "BlockPool.take")
    # Module-level code or an unknown function stands for every function of its file.
    everything = ["tests/v1/core/test_a.py", "tests/v1/core/test_b.py", "tests/v1/worker/test_w.py"]
    assert made.files_for({(pool, "")}) == everything
    assert made.files_for({(pool, "BlockPool.added_by_the_mutant")}) == everything
    assert made.files_for({("vllm/v1/core/elsewhere.py", "f")}) == []
    assert ReachMap.from_json(made.to_json()) == made
    # A test that failed in the run that made the map does not count as reaching.
    without = from_coverage(_report(vllm_dir), vllm_dir, {"tests/v1/core/test_a.py::test_free"})
    assert without.tests_reaching(pool, "BlockPool.get_num_free_blocks") == []
    assert made.test_files()[f"{pool}::BlockPool.get_num_free_blocks"] == [
        "tests/v1/core/test_a.py"
    ]


def test_what_counts_as_reservation_code():
    assert counted("vllm/v1/core/block_pool.py", "BlockPool.take")
    assert counted("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule")
    # One definition with the corpus's coverage (kvconform.model.vllm_code.RESERVATION_CODE):
    # the scheduler's whole package, and the three lookahead properties of VllmConfig.
    assert counted("vllm/v1/core/sched/output.py", "SchedulerOutput.make_empty")
    assert counted("vllm/config/vllm.py", "VllmConfig.num_prefill_lookahead_tokens")
    assert not counted("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner.execute_model")
    assert counted("vllm/v1/worker/gpu/warmup.py", "warmup_kernels")
    assert counted("vllm/config/vllm.py", "VllmConfig.num_lookahead_tokens")
    assert not counted("vllm/config/vllm.py", "VllmConfig.__post_init__")


def test_the_coverage_summary_per_file_and_function(vllm_dir: Path):
    summary = summarize(_report(vllm_dir), vllm_dir)
    files = {u.name: u for u in summary.files}
    pool = files["vllm/v1/core/block_pool.py"]
    assert (pool.counts.statements, pool.counts.branches, pool.counts.covered_branches) == (7, 2, 1)
    assert pool.counts.branch_percent == 50.0
    assert [(m.source_line, m.target_line, m.text) for m in pool.missed] == [
        (6, 7, "if n > self.free:")
    ]
    # Only VllmConfig.num_lookahead_tokens counts in config/vllm.py, and it is not there.
    assert "vllm/config/vllm.py" not in files
    take = {u.name: u for u in summary.functions}["vllm/v1/core/block_pool.py::BlockPool.take"]
    assert take.counts.branch_percent == 50.0 and take.missed[0].text == "if n > self.free:"
    assert summary.total.statements == 7
