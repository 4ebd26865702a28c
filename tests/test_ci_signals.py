"""CI signals: exit 5 for an empty selection, shards, merged shards, JUnit lines, and reruns
that reproduce.

A nightly that stays green because its filter matches nothing, or whose printed rerun
passes where the nightly failed, is worse than no nightly. The cheap tests here run the
command line in a subprocess that never imports vLLM and assert it did not; the slow one
injects a bug into a copy of vLLM, runs a failing selection, runs the rerun command it
printed, and asserts the rerun fails the same way.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from vllm_copy import REPO, tree_with_replacement

from kvconform.errors import ExitStatus, Location, ScenarioError, UsageError
from kvconform.fuzz import shard_budget
from kvconform.harness.loader import load_text
from kvconform.harness.select import Shard, compile_expression, shard_from, shard_of
from kvconform.model.results import Failure, RunReport, ScenarioResult, Verdict
from kvconform.reports import write_reports
from kvconform.reports.junit import write_junit
from kvconform.reports.merge import merge_reports

MATRIX = """
name: rerun-spec
tags: [spec]
model: {block_size: 16, max_model_len: 1024, num_blocks: 64, groups: [full_attention]}
speculative: {method: eagle, num_speculative_tokens: 2}
matrix:
  num_speculative_tokens: [2, 3]
requests: {a: {prompt_len: 30}}
steps:
  - {a: {prefill: 30}}
  - {repeat: 4, step: {a: {spec: 2, accepted: 2}}}
  - {a: finish}
"""
OTHER = """
name: plain
model: {groups: [full_attention]}
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}, {a: finish}]
"""


def cli(*args: object, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, bool]:
    """``kvconform ARGS`` in a fresh process: (status, output, whether vLLM was imported)."""
    script = (
        "import sys\nfrom kvconform.fronts.cli import main\n"
        "status = main(sys.argv[1:])\n"
        "print('VLLM-IMPORTED' if 'vllm' in sys.modules else 'VLLM-NOT-IMPORTED')\n"
        "sys.exit(status)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    return proc.returncode, out, "VLLM-IMPORTED" in out


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "matrix.yaml").write_text(MATRIX)
    (folder / "plain.yaml").write_text(OTHER)
    return folder


# -- an empty selection ---------------------------------------------------------------------


def test_a_filter_that_matches_nothing_exits_5_and_never_imports_vllm(corpus, tmp_path):
    status, out, imported = cli("run", corpus, "-k", "mistyped", "--report-dir", "o", cwd=tmp_path)
    assert status == ExitStatus.NO_SELECTION and not imported
    assert "nothing selected: -k 'mistyped' matched none of the 3 scenarios" in out
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["exit_status"] == 5 and report["scenarios"] == []
    # Under git bisect an empty selection is the same on every commit: abort, never "good".
    status, out, imported = cli("check", corpus, "-k", "mistyped", cwd=tmp_path)
    assert status == 128 and not imported and "run status 5" in out


def test_files_that_all_fail_to_load_exit_2_without_importing_vllm(tmp_path):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "bad.yaml").write_text("requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {spec: 1}}\n")
    status, out, imported = cli("run", folder, "--report-dir", "o", cwd=tmp_path)
    assert status == ExitStatus.BAD_INPUT and not imported
    assert "bad.yaml:3" in out
    junit = ET.parse(tmp_path / "o" / "junit.xml").getroot()
    (case,) = junit.iter("testcase")
    assert case.get("line") == "3" and case.get("name") == "load (line 3)"


def test_an_unknown_scenario_id_and_an_empty_folder_exit_5(corpus, tmp_path):
    status, out, _ = cli(
        "run", f"{corpus / 'matrix.yaml'}::nope", "--report-dir", "o", cwd=tmp_path
    )
    assert status == 5 and "has no scenario 'nope'" in out
    (tmp_path / "empty").mkdir()
    status, out, _ = cli("run", tmp_path / "empty", "--report-dir", "o", cwd=tmp_path)
    assert status == 5 and "no scenario in" in out


def test_a_shard_that_draws_none_of_a_selection_is_not_an_error(corpus, tmp_path):
    (one,) = [s for s in load_text(OTHER, "plain.yaml")]
    other = 2 if shard_of(one.id, 2) == 1 else 1
    path = corpus / "plain.yaml"
    status, out, imported = cli(
        "run", path, "--shard", f"{other}/2", "--report-dir", "o", cwd=tmp_path
    )
    assert status == ExitStatus.CONFORM and not imported
    assert f"shard {other}/2 holds none of the 1 selected scenarios" in out


# -- selection ------------------------------------------------------------------------------


def test_k_matches_the_speculative_method():
    # Neither the id, the tags nor the file's stem says "eagle": only the method does.
    spec = load_text(MATRIX, "matrix.yaml")
    (plain,) = load_text(OTHER, "plain.yaml")
    assert not any("eagle" in " ".join((s.id, *s.tags)) for s in spec)
    matches = compile_expression("eagle")
    assert [s.id for s in (*spec, plain) if matches(s)] == [s.id for s in spec]
    assert not any(compile_expression("not eagle")(s) for s in spec)


def test_shards_partition_by_a_hash_of_the_id_not_the_order():
    ids = [f"scenario-{n}[k{n % 5}]" for n in range(300)]
    shards = {i: [x for x in ids if Shard(i, 4).holds(x)] for i in range(1, 5)}
    assert sorted(sum(shards.values(), [])) == sorted(ids)  # each id in exactly one shard
    assert all(40 < len(held) < 110 for held in shards.values())
    reversed_ids = list(reversed(ids))
    assert {i: [x for x in reversed_ids if Shard(i, 4).holds(x)][::-1] for i in shards} == shards
    # SHA-256 of the id: the same value on every machine and interpreter.
    assert shard_of("eagle-chunked[eagle-k3]", 4) == 4 and shard_of("a", 4) == 3


def test_the_shard_comes_from_the_option_or_buildkite():
    assert shard_from("2/4", {}) == Shard(2, 4, "--shard")
    buildkite = {"BUILDKITE_PARALLEL_JOB": "0", "BUILDKITE_PARALLEL_JOB_COUNT": "3"}
    assert shard_from(None, buildkite) == Shard(1, 3, "BUILDKITE_PARALLEL_JOB")
    assert shard_from("3/3", buildkite) == Shard(3, 3, "--shard")
    assert shard_from(None, {}) is None
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(UsageError, match="--shard"):
            shard_from(bad, {})
    with pytest.raises(UsageError, match="BUILDKITE_PARALLEL_JOB"):
        shard_from(None, {"BUILDKITE_PARALLEL_JOB": "x", "BUILDKITE_PARALLEL_JOB_COUNT": "2"})


def test_fuzz_shards_split_the_budget_with_seeds_of_their_own():
    shares = [shard_budget(1001, 7, i, 4) for i in range(1, 5)]
    assert sum(n for n, _ in shares) == 1001 and {n for n, _ in shares} == {250, 251}
    assert len({seed for _, seed in shares}) == 4
    assert shard_budget(1001, 7, 1, 1) == (1001, 7)


# -- JUnit and merged shards -----------------------------------------------------------------


def _failed(id_: str, file: str, step_line: int) -> ScenarioResult:
    failure = Failure("floor", "live holds 2 blocks, floor 3", step=1, line=step_line, live=2)
    return ScenarioResult(id_, file, Verdict.FAILED, failures=[failure], line=1)


def _report(results: list[ScenarioResult], **kw: Any) -> RunReport:
    return RunReport(
        results=results,
        input_errors=kw.pop("input_errors", []),
        vllm_version="0.33.0",
        vllm_source="installed",
        vllm_path="/x/vllm",
        checks=("floor",),
        rerun_options=("--checks", "floor"),
        exit_status=kw.pop("exit_status", 1 if results else 0),
        **kw,
    )


def test_junit_points_at_the_failing_step_and_names_the_vllm(tmp_path):
    error = ScenarioError(Location("s/bad.yaml", 4, "steps[1]"), "unknown field 'prefil'")
    report = _report([_failed("x[k2]", "s/x.yaml", 17)], input_errors=[error])
    root = ET.parse(write_junit(report, tmp_path)).getroot()
    case = next(c for c in root.iter("testcase") if c.get("name") == "x[k2]")
    assert case.get("line") == "17"
    assert "Rerun: kvconform run 's/x.yaml::x[k2]' --checks floor" in case.findtext("failure", "")
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["vllm_version"] == "0.33.0" and props["checks"] == "floor"
    load = next(c for c in root.iter("testcase") if c.get("file") == "s/bad.yaml")
    assert load.get("line") == "4"


def test_merge_joins_shards_and_refuses_a_missing_one(tmp_path):
    bad = ScenarioError(Location("s/bad.yaml", 2, "name"), "is required")
    parts = [
        _report([_failed("a", "s/a.yaml", 5)], shard="1/3", input_errors=[bad]),
        _report([ScenarioResult("b", "s/b.yaml", Verdict.PASSED)], shard="2/3", exit_status=0),
        _report([], shard="3/3", input_errors=[bad], exit_status=2),
    ]
    dirs = []
    for n, part in enumerate(parts, 1):
        write_reports(part, tmp_path / f"shard{n}")
        dirs.append(tmp_path / f"shard{n}")
    merged = merge_reports(dirs)
    assert [r.id for r in merged.results] == ["a", "b"]
    assert len(merged.input_errors) == 1  # every shard reports the same bad file once
    assert merged.exit_status == ExitStatus.BAD_INPUT
    assert merged.rerun_command(merged.results[0]) == "kvconform run s/a.yaml::a --checks floor"
    written = write_reports(merged, tmp_path / "all")
    assert "s/a.yaml::a" in (tmp_path / "all" / "summary.md").read_text() and written
    # Without shard 2 the merge must not look like the whole selection.
    partial = merge_reports([dirs[0], dirs[2]])
    assert partial.exit_status == ExitStatus.BAD_INPUT
    assert any("shard 2/3 missing" in note for note in partial.notes)
    # Conforming shards merge to 0; nothing anywhere merges to 5.
    ok = [_report([ScenarioResult(x, "s.yaml", Verdict.PASSED)], exit_status=0) for x in "pq"]
    for n, part in enumerate(ok):
        write_reports(part, tmp_path / f"ok{n}")
    assert merge_reports([tmp_path / "ok0", tmp_path / "ok1"]).exit_status == 0
    for n in range(2):
        write_reports(_report([], exit_status=5), tmp_path / f"none{n}")
    assert merge_reports([tmp_path / "none0", tmp_path / "none1"]).exit_status == 5


# -- reruns that reproduce -------------------------------------------------------------------

# The predictor (vLLM's warmup _reserved_block_count) drops the lookahead; the live
# allocator keeps it. With --checks floor the predictor's shortfall is the only
# failure; the default checks would add agree's disagreement, and without
# --no-expectations the entry below would excuse the scenario.
PREDICTOR_BUG = (
    "v1/worker/gpu/warmup.py",
    "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
    "num_tokens = min(num_tokens, max_model_len)",
)


def _failures(report_dir: Path, scenario_id: str) -> tuple[str, list[tuple[Any, ...]]]:
    report = json.loads((report_dir / "report.json").read_text())
    entry = next(s for s in report["scenarios"] if s["id"] == scenario_id)
    rows = [
        (f["check"], f["step"], f["request"], f["group"], f["message"]) for f in entry["failures"]
    ]
    return entry["verdict"], rows


@pytest.mark.slow  # two subprocesses, each importing vLLM
def test_a_printed_rerun_command_fails_the_same_way(pristine_tree, corpus, tmp_path):
    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *PREDICTOR_BUG)
    (corpus / "expectations.yaml").write_text(
        "- id: rerun-spec*\n  checks: [floor, agree]\n  reason: known\n  vllm: '>=0.1'\n"
    )
    # A wrapper that says when vLLM is first imported, to place the first line before it.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import sys

            class _Watch:
                def find_spec(self, name, path=None, target=None):
                    if name == "vllm":
                        print("IMPORTING-VLLM", flush=True)
                    return None

            sys.meta_path.insert(0, _Watch())
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(hook)])}
    args = ["run", corpus, "--checks", "floor", "--no-expectations", "--vllm-src", tree]
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", *map(str, args), "--report-dir", "first"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    lines = out.splitlines()
    assert lines[0].startswith("kvconform ") and "loading vLLM" in lines[0]
    assert lines.index("IMPORTING-VLLM") > 0, "the first line comes before vLLM's import"
    assert "short summary" in out
    reruns = [line.split("rerun: ", 1)[1] for line in lines if "rerun: " in line]
    failed = json.loads((tmp_path / "first" / "report.json").read_text())
    ids = [s["id"] for s in failed["scenarios"] if s["verdict"] == "failed"]
    # k3's lookahead crosses a block boundary that k2's does not: one matrix case fails.
    assert ids == ["rerun-spec[k3]"]
    target = ids[0]
    (command,) = reruns
    words = shlex.split(command)
    assert words[:3] == ["kvconform", "run", f"{corpus / 'matrix.yaml'}::{target}"]
    assert {"--checks", "floor", "--no-expectations", "--vllm-src", str(tree)} <= set(words)
    # Every report prints the same command.
    entry = next(s for s in failed["scenarios"] if s["id"] == target)
    assert entry["rerun"] == command
    assert command in (tmp_path / "first" / "summary.md").read_text()
    assert f"Rerun: {command}" in (tmp_path / "first" / "junit.xml").read_text()

    again = subprocess.run(
        [sys.executable, "-m", "kvconform", *words[1:], "--report-dir", "again"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert again.returncode == proc.returncode, again.stdout
    rerun = json.loads((tmp_path / "again" / "report.json").read_text())
    assert [s["id"] for s in rerun["scenarios"]] == [target]
    verdict, rows = _failures(tmp_path / "again", target)
    assert (verdict, rows) == _failures(tmp_path / "first", target)
    assert rows and {row[0] for row in rows} == {"floor"}
