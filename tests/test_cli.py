"""The command line, in process: exit codes, reports, and messages without tracebacks."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvconform.fronts.cli import main
from kvconform.fronts.doctor import doctor
from kvconform.harness.loader import load_text
from kvconform.harness.select import compile_expression

GOOD = """
name: good
tags: [eagle]
speculative: {method: eagle, num_speculative_tokens: 2}
requests: {a: {prompt_len: 30}}
steps:
  - {a: {prefill: 30}}
  - {a: {spec: 2, accepted: 1}}
  - {a: finish}
"""
CRASHING = """
name: sink
model: {groups: [{type: sink_full_attention, sink_len: 16}]}
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}]
"""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    return folder


def run(*args: str) -> int:
    return main(["run", *args])


def test_run_conforming_corpus_exits_0_and_writes_reports(vllm, corpus, tmp_path, capsys):
    report_dir = tmp_path / "out"
    assert run(str(corpus), "--report-dir", str(report_dir), "-v") == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["schema"] == "kvconform-report/1"
    assert report["vllm"]["version"] == vllm.version and report["vllm"]["source"] == "installed"
    assert [(s["id"], s["verdict"]) for s in report["scenarios"]] == [("good", "passed")]
    junit = ET.parse(report_dir / "junit.xml").getroot()
    assert junit.tag == "testsuites" and junit.get("tests") == "1" and junit.get("failures") == "0"
    assert (report_dir / "summary.md").read_text().startswith("# kvconform: conform (exit 0)")
    assert "PASSED   good" in capsys.readouterr().out


def test_bad_file_exits_2_names_file_line_field_and_the_rest_still_runs(
    vllm, corpus, tmp_path, capsys
):
    (corpus / "broken.yaml").write_text(
        "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {spec: 1}}\n"
    )
    report_dir = tmp_path / "out"
    assert run(str(corpus), "--report-dir", str(report_dir)) == 2
    out = capsys.readouterr().out
    message = f"{corpus / 'broken.yaml'}:3: steps[0].a: request 'a' cannot spec before"
    assert f"INPUT   {message}" in out and out.count(message) == 1, out
    assert "Traceback" not in out
    report = json.loads((report_dir / "report.json").read_text())
    assert [s["id"] for s in report["scenarios"]] == ["good"]
    (error,) = report["input_errors"]
    assert (error["line"], error["field"]) == (3, "steps[0].a")
    junit = ET.parse(report_dir / "junit.xml").getroot()
    assert junit.get("errors") == "1"


def test_vllm_crash_is_nonconformance_with_exit_1(vllm, corpus, tmp_path, capsys):
    (corpus / "sink.yaml").write_text(CRASHING)
    report_dir = tmp_path / "out"
    assert run(str(corpus), "--report-dir", str(report_dir)) == 1
    report = json.loads((report_dir / "report.json").read_text())
    sink = next(s for s in report["scenarios"] if s["id"] == "sink")
    assert sink["verdict"] == "error" and sink["error_kind"] == "crash"
    assert sink["rerun"] == f"kvconform run {corpus / 'sink.yaml'}::sink"


def test_expectations_turn_a_known_divergence_into_xfail(vllm, corpus, tmp_path):
    (corpus / "sink.yaml").write_text(CRASHING)
    (corpus / "expectations.yaml").write_text(
        "- id: sink\n  checks: [error]\n  reason: SinkFullAttentionManager rejects needs_kv_cache_zeroing\n"
        "  vllm: '>=0.33'\n"
    )
    report_dir = tmp_path / "out"
    assert run(str(corpus), "--report-dir", str(report_dir)) == 0
    report = json.loads((report_dir / "report.json").read_text())
    sink = next(s for s in report["scenarios"] if s["id"] == "sink")
    assert sink["verdict"] == "xfailed" and "needs_kv_cache_zeroing" in sink["expectation"]
    assert report["counts"]["xfailed"] == 1


def test_k_selects_and_unknown_path_is_a_usage_error(vllm, corpus, tmp_path, capsys):
    (corpus / "sink.yaml").write_text(CRASHING)
    assert run(str(corpus), "-k", "not sink", "--report-dir", str(tmp_path / "o")) == 0
    assert run(str(tmp_path / "missing"), "--report-dir", str(tmp_path / "o")) == 2
    assert "no such file or folder" in capsys.readouterr().out


def test_vllm_src_without_vllm_exits_3(tmp_path, capsys):
    empty = tmp_path / "tree"
    empty.mkdir()
    scenario = tmp_path / "scenarios"
    scenario.mkdir()
    (scenario / "good.yaml").write_text(GOOD)
    assert run(str(scenario), "--vllm-src", str(empty), "--report-dir", str(tmp_path / "o")) == 3
    out = capsys.readouterr().out
    assert "ERROR vLLM" in out and "has no vllm/__init__.py" in out
    assert json.loads((tmp_path / "o" / "report.json").read_text())["vllm"]["error"]


def test_methods_lists_vllm_methods_with_both_lookaheads(vllm, capsys):
    assert main(["methods", "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("dflash "))
    assert row.split()[1:4] == ["4", "4", "ok"]
    assert any(line.startswith("deepseek_mtp (= mtp)") for line in lines)
    # Aligned however long a name: every row's status column starts where the header's does.
    header = next(line for line in lines if line.startswith("method "))
    table = lines[lines.index(header) + 1 :]
    table = table[: next((i for i, line in enumerate(table) if not line), len(table))]
    longest = max(table, key=lambda line: len(line.split("  ")[0]))
    assert len(longest.split("  ")[0]) > 26  # longer than the old fixed width
    at = header.index("status")
    for line in table:
        assert line[at - 2 : at] == "  " and line[at] != " ", line


def test_a_table_is_as_wide_as_its_longest_cells():
    from kvconform.fronts.commands.methods import aligned

    lines = aligned(("name", "n", "rule"), [("a-very-long-name", "3", "k"), ("b", "12", "k + 1")],
                    right=(1,))  # fmt: skip
    assert lines == [
        "name               n  rule",
        "a-very-long-name   3  k",
        "b                 12  k + 1",
    ]


def test_explain_prints_every_step_and_group(vllm, corpus, capsys):
    assert main(["explain", str(corpus / "good.yaml")]) == 0
    out = capsys.readouterr().out
    assert "lookahead 2 from VllmConfig.num_lookahead_tokens" in out
    assert "spec 2 (1 accepted)" in out and "verdict: passed" in out
    # The lookahead column: 2 on every row of an eagle k=2 scenario.
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("step"))
    assert header.split()[:7] == ["step", "line", "req", "action", "comp", "sched", "look"]
    row = next(line for line in lines if "spec 2 (1 accepted)" in line)
    assert row.split("|")[0].split()[-3:] == ["30", "3", "2"]


# A matrix file with one variant that fails: the stated prefix-cache hit is the one
# without speculation; under EAGLE vLLM 0.33.0 keeps the last block out (check sanity).
MATRIX = """
name: mat
model: {enable_caching: true}
speculative: {method: eagle, num_speculative_tokens: 2}
matrix:
  method: [none, eagle]
requests:
  a: {prompt_len: 64}
  b: {prompt_len: 80, prefix_from: a, prefix_len: 64}
steps:
  - {a: {prefill: 64}}
  - {a: finish}
  - {b: {prefill: 80, expect_hit: 64}}
  - {b: finish}
"""


def test_explain_takes_file_id_and_a_matrix_id_and_draws_the_variants_that_fail(
    vllm, corpus, capsys
):
    path = corpus / "mat.yaml"
    path.write_text(MATRIX)
    # FILE::ID, as every rerun prints it; the first line comes before anything runs.
    assert main(["explain", f"{path}::mat[nospec]"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"kvconform 0.1.0: explaining {path}::mat[nospec]; loading vLLM ")
    assert any(line.startswith("scenario mat[nospec] ") for line in lines)
    assert not any(line.startswith("scenario mat[eagle] ") for line in lines)
    # The file: every variant runs, only the failing one is drawn.
    assert main(["explain", str(path)]) == 1
    out = capsys.readouterr().out
    assert "2 scenarios: mat[nospec] passed, mat[eagle] failed" in out
    assert "scenario mat[eagle] " in out and "scenario mat[nospec] " not in out
    assert "verdict: failed" in out and "[sanity]" in out
    # An unknown id in a file names the ids it has.
    assert main(["explain", f"{path}::mat[k9]"]) == 2
    out = capsys.readouterr().out
    assert "has no scenario 'mat[k9]' (it has: mat[nospec], mat[eagle])" in out


def test_doctor_reports_the_installed_vllm(vllm, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"vLLM {vllm.version}" in out and "_reserved_block_count: present" in out
    assert "older trees run for bisection only" not in out


@pytest.mark.parametrize(
    ("version", "below"),
    [("0.27.1", True), ("0.28.0.dev5+gabc", False), ("0.28.0", False), ("main", False)],
)
def test_doctor_notes_a_vllm_older_than_kvconform_supports(vllm, version, below):
    older = copy.copy(vllm)
    older.version = version
    lines: list[str] = []
    doctor(older, lines.append)
    assert any("older trees run for bisection only" in line for line in lines) is below, lines


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        ("good", True),
        ("GOOD", True),
        ("eagle and not mamba", True),
        ("mamba or (eagle and good)", True),
        ("not eagle", False),
        ("good[", False),
    ],
)
def test_k_expressions(expression, selected):
    (scenario,) = load_text(GOOD, "scenarios/good.yaml")
    assert compile_expression(expression)(scenario) is selected


def test_the_command_leaves_fast_with_its_output_and_reports_whole(tmp_path: Path):
    """``python -m kvconform`` ends with os._exit once main() is done (vLLM's teardown
    costs seconds): its last line, its reports and its exit status must survive that."""
    import subprocess
    import sys

    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "sink.yaml").write_text(CRASHING)  # crashes in vLLM 0.33: exit status 1
    report_dir = tmp_path / "report"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", str(tmp_path), "--report-dir",
         str(report_dir), "--progress", "off"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads((report_dir / "report.json").read_text())
    assert done.returncode == report["exit_status"] != 0, done.stdout[-2000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith("reports: "), done.stdout[-500:]
    ET.parse(report_dir / "junit.xml")  # complete, closed files
    assert set(report["phases_s"]) == {"select", "load_vllm", "scenarios", "coverage"}
    assert report["phases_s"]["load_vllm"] > 0


def test_explain_finds_a_matrix_id_or_name_under_the_scenarios_folder(corpus):
    from kvconform.fronts.explain import find_targets

    (corpus / "nested").mkdir()
    (corpus / "nested" / "mat.yaml").write_text(MATRIX)
    one = find_targets("mat[eagle]", root=str(corpus))
    assert [s.id for s in one.scenarios] == ["mat[eagle]"] and one.exact
    both = find_targets("mat", root=str(corpus))
    assert [s.id for s in both.scenarios] == ["mat[nospec]", "mat[eagle]"] and not both.exact
    # A scenario named unlike its file is found by reading every file.
    (corpus / "other.yaml").write_text(GOOD.replace("name: good", "name: renamed"))
    assert [s.id for s in find_targets("renamed", root=str(corpus)).scenarios] == ["renamed"]


def test_explain_names_each_records_manager_and_says_each_why_once():
    from kvconform.fronts.explain import _verdict_lines
    from kvconform.model.observations import GroupInfo, Trajectory
    from kvconform.model.results import Failure, ScenarioResult, Verdict

    single = "vllm/v1/core/single_type_kv_cache_manager.py"
    groups = (
        GroupInfo(0, "sliding_window", 16, "sliding_window", True,
                  manager="SlidingWindowManager", manager_file=single),
        GroupInfo(1, "full_attention", 16, "full_attention", False,
                  manager="FullAttentionManager", manager_file=single),
    )  # fmt: skip
    reason = groups[0].floor_rule.reason
    result = ScenarioResult("s", "scenarios/s.yaml", Verdict.FAILED)
    result.trajectory = Trajectory(groups=groups, lookahead=3, lookahead_source="vllm")
    result.failures = [
        Failure("floor", f"step {step}: holds 2 blocks, below the floor of 3 (why: {reason})",
                step=step, group=0, party="live")
        for step in (1, 2, 3)
    ] + [Failure("agree", "step 4: holds 3 blocks but predicts 2 (why: another reason)", group=1)]  # fmt: skip
    lines = _verdict_lines(result)
    records = [line for line in lines if line.startswith("  [")]
    assert len(records) == 4
    assert all(line.endswith(f"[SlidingWindowManager, {single}]") for line in records[:3])
    assert records[3].endswith(f"[FullAttentionManager, {single}]")
    text = "\n".join(lines)
    # The floor rule's reason is the groups' (printed above the table): not once per record.
    assert reason not in text
    assert text.count("another reason") == 1 and "  why: another reason" in lines
