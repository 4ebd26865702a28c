"""Coverage of vLLM's reservation code (``kvconform coverage --vllm-code``) and test impact
(``kvconform run --impacted-by``)."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.harness.impact import (
    Change,
    CoverageMap,
    changed_lines,
    read_change,
    select_impacted,
)
from kvconform.model.vllm_code import (
    RESERVATION_CODE,
    Counts,
    FileCoverage,
    FunctionCoverage,
    FunctionMap,
    MissedBranch,
    Target,
    VllmCodeCoverage,
)

REPO = Path(__file__).resolve().parents[1]

SOURCE = """\
import os

LIMIT = 3


class Pool:
    @property
    def size(self):
        return LIMIT

    def take(self, n):
        def inner(k):
            return k + 1

        if n > LIMIT:
            return None
        return inner(n)


def free(x):
    return x
"""


def test_lines_map_to_the_innermost_function() -> None:
    functions = FunctionMap(SOURCE)
    assert functions.name_executing(9) == "Pool.size"
    assert functions.name_executing(13) == "Pool.take.inner"
    assert functions.name_executing(15) == "Pool.take"
    assert functions.name_executing(12) == "Pool.take"  # a def line runs in its parent
    assert functions.name_executing(3) == "<module>"
    # A change of a decorator or a signature changes the function.
    assert functions.defining(7) == "Pool.size"
    assert functions.defining(11) == "Pool.take"
    assert functions.defining(21) == "free"


def test_targets_read_and_count() -> None:
    target = Target.from_text("vllm/config/vllm.py::VllmConfig.a,VllmConfig.b")
    assert target.functions == ("VllmConfig.a", "VllmConfig.b")
    assert target.counts("vllm/config/vllm.py", "VllmConfig.a")
    assert not target.counts("vllm/config/vllm.py", "VllmConfig.c")
    assert Target.from_text(target.to_text()) == target
    whole = Target.from_text("vllm/v1/core/*.py")
    assert whole.counts("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule")
    assert any(t.matches("vllm/v1/worker/gpu/warmup.py") for t in RESERVATION_CODE)


def test_the_record_round_trips_through_json() -> None:
    unit = FunctionCoverage(
        "BlockPool.get", 10, Counts(4, 3, 2, 1), [12], [MissedBranch(11, 12, "if x:")]
    )
    record = VllmCodeCoverage(
        "0.33.0",
        RESERVATION_CODE,
        [FileCoverage("vllm/v1/core/block_pool.py", Counts(4, 3, 2, 1), [unit])],
        {"s1": ["vllm/v1/core/block_pool.py::BlockPool.get"], "s2": []},
        ["in-process"],
    )
    data = json.loads(json.dumps(record.to_json()))
    assert data["total"]["branch_percent"] == 50.0
    back = VllmCodeCoverage.from_json(data)
    assert back.scenario_functions == record.scenario_functions
    assert back.files[0].functions[0].missed_branches == [MissedBranch(11, 12, "if x:")]
    assert back.scenarios_executing("vllm/v1/core/block_pool.py::BlockPool.get") == ["s1"]


DIFF = """\
--- a/vllm/v1/core/pool.py
+++ b/vllm/v1/core/pool.py
@@ -15,3 +15,3 @@
         if n > LIMIT:
-            return None
+            return 0
         return inner(n)
@@ -21,2 +21,3 @@
     return x
+    # a comment changes nothing
+    x += 1
--- a/docs/readme.md
+++ b/docs/readme.md
@@ -1 +1 @@
-a
+b
"""


def test_a_diff_names_the_functions_it_changes(tmp_path: Path) -> None:
    assert changed_lines(DIFF)["vllm/v1/core/pool.py"] == {16, 21}
    (tmp_path / "vllm" / "v1" / "core").mkdir(parents=True)
    (tmp_path / "vllm" / "v1" / "core" / "pool.py").write_text(SOURCE)
    diff = tmp_path / "change.diff"
    diff.write_text(DIFF)
    change = read_change(str(diff), None, tmp_path, RESERVATION_CODE)
    assert change.functions == {"vllm/v1/core/pool.py::Pool.take", "vllm/v1/core/pool.py::free"}
    assert change.ignored == ["docs/readme.md"]
    assert not change.everything
    # Module-level code runs in every scenario; a file outside the measured code is unknown;
    # a diff whose old lines are not this tree's (another release's) is unknown too.
    module = "--- a/vllm/v1/core/pool.py\n+++ b/vllm/v1/core/pool.py\n@@ -3 +3 @@\n"
    diff.write_text(module + "-LIMIT = 3\n+LIMIT = 4\n")
    assert "module-level" in read_change(str(diff), None, tmp_path, RESERVATION_CODE).everything[0]
    diff.write_text(module + "-LIMIT = 5\n+LIMIT = 4\n")
    assert (
        "not against this tree"
        in read_change(str(diff), None, tmp_path, RESERVATION_CODE).everything[0]
    )
    diff.write_text(DIFF.replace("v1/core/pool.py", "v1/request.py"))
    assert (
        "outside the measured code"
        in read_change(str(diff), None, tmp_path, RESERVATION_CODE).everything[0]
    )


def test_the_selection_keeps_touching_and_unknown_scenarios(tmp_path: Path) -> None:
    from kvconform.harness.loader import load_paths

    files = []
    for name in ("a", "b", "c"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"name: {name}\nrequests: {{r: {{prompt_len: 4}}}}\nsteps: [{{r: {{prefill: 4}}}}]\n"
        )
        files.append(str(path))
    scenarios = load_paths(files).scenarios
    from kvconform.harness.impact import file_digest

    cmap = CoverageMap("0", "f", "/t")
    cmap.scenarios["a"] = {"file": files[0], "digest": file_digest(files[0]), "functions": ["F"]}
    cmap.scenarios["b"] = {"file": files[1], "digest": file_digest(files[1]), "functions": ["G"]}
    impact = select_impacted(scenarios, Change("x", {"F"}), cmap)
    assert [s.id for s in impact.selected] == ["a", "c"]  # c: coverage unknown
    assert (impact.touching, impact.unknown) == (1, 1)
    Path(files[1]).write_text(Path(files[1]).read_text() + "# edited\n")
    assert len(select_impacted(scenarios, Change("x", {"F"}), cmap).selected) == 3
    everything = select_impacted(scenarios, Change("x", set(), ["module level"]), cmap)
    assert len(everything.selected) == 3


def _kvconform(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvconform", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.mark.slow
def test_coverage_of_vllm_code_per_file_function_and_scenario(tmp_path: Path) -> None:
    pytest.importorskip("coverage")
    pytest.importorskip("vllm")
    out = tmp_path / "report"
    done = _kvconform(
        "coverage", "--vllm-code", "scenarios/admission/watermark-admission.yaml",
        "scenarios/warmup/warmup-no-speculation.yaml", "-k", "watermark or bs16-pool16", "--report-dir", str(out), "--progress", "off",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| vllm/v1/core/kv_cache_manager.py |" in done.stdout
    data = json.loads((out / "report.json").read_text())["vllm_coverage"]
    record = VllmCodeCoverage.from_json(data)
    manager = record.file("vllm/v1/core/kv_cache_manager.py")
    assert manager is not None and 0 < manager.counts.executed_branches < manager.counts.branches
    allocate = next(f for f in manager.functions if f.name == "KVCacheManager.allocate_slots")
    assert allocate.counts.executed_lines > 0
    assert all(m.text for m in manager.missed_branches)
    # Every counted file is listed, imported or not; config/vllm.py only for its lookahead.
    config = record.file("vllm/config/vllm.py")
    assert config is not None and not config.whole
    assert {f.name for f in config.functions} <= set(RESERVATION_CODE[-1].functions or ())
    # Per scenario: the warmup ran the predictor, the trajectory did not run the warmup.
    warmup = record.scenario_functions["warmup-no-speculation[bs16-pool16]"]
    assert "vllm/v1/worker/gpu/warmup.py::warmup_kernels" in warmup
    trajectory = record.scenario_functions["watermark-admission"]
    assert "vllm/v1/core/kv_cache_manager.py::KVCacheManager.allocate_slots" in trajectory
    assert "vllm/v1/worker/gpu/warmup.py::warmup_kernels" not in trajectory
    # The reports: one table in summary.md, coverage.py's pages linked from report.html.
    assert "reservation code executed by the scenarios" in (out / "summary.md").read_text()
    html = (out / "report.html").read_text()
    assert manager.html is not None and f'href="{manager.html}"' in html
    assert (out / manager.html).is_file()


VLLM_TESTS_COVERAGE = REPO / "tests" / "data" / "vllm-tests-coverage-0.33.0.json"


@pytest.mark.slow
def test_the_corpus_executes_as_much_as_vllms_own_tests(tmp_path: Path) -> None:
    # Issue 25's bar: of each of the five files, the corpus executes at least as many lines
    # and branches together (coverage.py's percent) as vLLM's own CPU-runnable tests of the
    # release, measured apart (tests/data/vllm-tests-coverage-0.33.0.json says how).
    pytest.importorskip("coverage")
    vllm = pytest.importorskip("vllm")
    theirs = json.loads(VLLM_TESTS_COVERAGE.read_text())
    if vllm.__version__ != theirs["vllm_version"]:
        pytest.skip(f"vLLM's own tests were measured on {theirs['vllm_version']}")
    out = tmp_path / "report"
    done = _kvconform(
        "coverage", "--vllm-code", "scenarios", "--report-dir", str(out), "--progress", "off"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = VllmCodeCoverage.from_json(
        json.loads((out / "report.json").read_text())["vllm_coverage"]
    )
    short = []
    for path, counts in theirs["files"].items():
        mine = record.file(path)
        assert mine is not None, path
        assert (mine.counts.statements, mine.counts.branches) == (
            counts["statements"],
            counts["branches"],
        ), f"{path}: not the file vLLM's tests were measured on"
        executed = mine.counts.executed_lines + mine.counts.executed_branches
        needed = counts["executed_lines"] + counts["executed_branches"]
        if executed < needed:
            short.append(f"{path}: {executed} lines and branches executed, vLLM's tests {needed}")
    assert not short, "\n".join(short)


@pytest.mark.slow
def test_impacted_by_a_one_function_bug_selects_few_and_turns_red(tmp_path: Path) -> None:
    """The real bug mamba-prefix-hit-on-block-cached-same-step changes one function,
    MambaManager.get_num_blocks_to_allocate: the selection keeps the Mamba scenarios
    (those executing it), drops the others, and fails on the patched tree."""
    pytest.importorskip("coverage")
    pytest.importorskip("vllm")
    from kvconform.realbugs.catalogue import read_catalogue
    from kvconform.realbugs.trees import patched_tree

    bugs = read_catalogue(REPO / "realbugs" / "catalogue.yaml").bugs
    bug = next(b for b in bugs if b.name == "mamba-prefix-hit-on-block-cached-same-step")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in (
        "mamba-table-partial-hit-same-step", "mamba-align-one-block-prefix-hit",
        "full-attention-lookahead-crosses-block-boundary", "sliding-window-frees-just-in-time",
        "mla-chunked-prefill-lookahead", "chunked-local-lookahead-crosses-chunk",
    ):  # fmt: skip
        shutil.copy(REPO / "scenarios" / "specs" / f"{name}.yaml", corpus)
    env = {"KVCONFORM_CACHE": str(tmp_path / "cache")}
    for release in ("releases", "vllm"):  # share the downloads, not the coverage map
        source = Path(os.environ.get("KVCONFORM_CACHE", Path.home() / ".cache/kvconform"))
        if (source / release).exists():
            (tmp_path / "cache").mkdir(exist_ok=True)
            (tmp_path / "cache" / release).symlink_to(source / release)
    tree = patched_tree(bug)
    done = _kvconform(
        "run", str(corpus), "--impacted-by", str(bug.patch), "--vllm-src", str(tree),
        "--report-dir", str(tmp_path / "report"), "--progress", "off", env=env,
    )  # fmt: skip
    log = done.stdout + done.stderr
    chosen = re.search(r"impacted by \S+: (\d+) of (\d+) scenarios", log)
    assert chosen is not None, log
    assert (int(chosen.group(1)), int(chosen.group(2))) == (2, 13), log  # 6 files, 13 ids
    assert "MambaManager.get_num_blocks_to_allocate" in log
    assert done.returncode == 1, log  # red: the bug is caught by what was selected
    ran = {
        r["id"] for r in json.loads((tmp_path / "report" / "report.json").read_text())["scenarios"]
    }
    assert ran == {"mamba-table-partial-hit-same-step", "mamba-align-one-block-prefix-hit"}


def test_a_child_process_measures_itself_when_the_parent_asks(tmp_path: Path) -> None:
    """Engine mode's child runs vLLM in another process: with the parent's settings in
    the environment it records its lines under the scenario's context, for the parent
    to combine (kvconform.oracles.code_tracing)."""
    coverage = pytest.importorskip("coverage")
    from kvconform.oracles.code_tracing import ENVIRONMENT, child_settings

    package = tmp_path / "tree" / "vllm" / "v1" / "core"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "pool.py").write_text(SOURCE)
    data_file = tmp_path / "data" / "coverage"
    data_file.parent.mkdir()
    settings = child_settings(str(data_file), ["*/vllm/v1/core/*.py"], "engine-scenario")
    code = (
        "import runpy\n"
        "from kvconform.oracles.code_tracing import measure_child\n"
        "with measure_child():\n"
        f"    runpy.run_path({str(package / 'pool.py')!r})['Pool']().take(1)\n"
    )
    env = {**os.environ, ENVIRONMENT: settings, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    children = list(data_file.parent.glob("coverage.child.*"))
    assert len(children) == 1
    data = coverage.CoverageData(basename=str(children[0]))
    data.read()
    (measured,) = [f for f in data.measured_files() if f.endswith("pool.py")]
    assert data.measured_contexts() >= {"engine-scenario"}
    lines = data.contexts_by_lineno(measured)
    assert "engine-scenario" in lines[15]  # inside Pool.take
    # Without the variable nothing is measured, and coverage.py is not imported.
    env.pop(ENVIRONMENT)
    check = code + "import sys\nassert 'coverage' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", check], env=env, check=True, cwd=tmp_path)


def test_the_tracer_combines_its_children_per_scenario(tmp_path: Path) -> None:
    """In the process and in a child, one context per scenario; the child's data is combined
    and every function attributed to the scenario that ran it."""
    pytest.importorskip("coverage")
    from kvconform.harness.vllm_code import CodeTracer

    tree = tmp_path / "tree"
    package = tree / "vllm" / "v1" / "core"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "kvpool.py").write_text(SOURCE)
    source = str(package / "kvpool.py")
    child = (
        "import runpy\n"
        "from kvconform.oracles.code_tracing import measure_child\n"
        "with measure_child():\n"
        f"    runpy.run_path({source!r})['free'](1)\n"
    )
    tracer = CodeTracer((Target("vllm/v1/core/*.py"),))
    tracer.start()
    try:
        tracer.switch("in-process")
        runpy.run_path(source)["Pool"]().take(5)
        # A function run untraced (the interpreted slot kernel) counts as entered, no more.
        tracer.switch("untraced")
        from kvconform.oracles.code_tracing import untraced

        module = runpy.run_path(source)
        with untraced(module["Pool"].take):
            module["Pool"]().take(1)
        tracer.switch("child")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-c", child], env=env, check=True, cwd=tmp_path)
    finally:
        tracer.stop()
    record = tracer.finish("test", str(tree / "vllm"), tmp_path / "report")
    assert record.processes == ["in-process", "engine child (1 runs)"]
    # take(5) returns early: its inner function never runs.
    assert record.scenario_functions["in-process"] == ["vllm/v1/core/kvpool.py::Pool.take"]
    assert record.scenario_functions["child"] == ["vllm/v1/core/kvpool.py::free"]
    assert record.scenario_functions["untraced"] == ["vllm/v1/core/kvpool.py::Pool.take"]
    pool = record.file("vllm/v1/core/kvpool.py")
    assert pool is not None and pool.html is not None
    take = next(f for f in pool.functions if f.name == "Pool.take")
    assert [m.text for m in take.missed_branches] == ["if n > LIMIT:"]  # never false
    assert (tmp_path / "report" / "vllm-coverage.data").is_file()
