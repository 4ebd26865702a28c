"""The console of ``kvconform run``, as pytest's: a character per scenario, the summary.

A green run prints a handful of lines whatever the number of scenarios; ``-v`` a
line per scenario; ``-q`` the summary only. Skips with one reason are one line.
The time estimate counts from vLLM's load, not from before its import.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from kvconform.fronts.cli import main
from kvconform.fronts.console import ROW, folded_lines
from kvconform.fronts.progress import Progress
from kvconform.model.results import ScenarioResult, Verdict

# Four scenarios from one matrix file and a plain one, all conforming on vLLM 0.33.0.
GREEN = """
name: green
speculative: {method: eagle, num_speculative_tokens: 2}
matrix:
  num_speculative_tokens: [1, 2, 3, 4]
requests: {a: {prompt_len: 30}}
steps:
  - {a: {prefill: 30}}
  - {a: {spec: 1, accepted: 1}}
  - {a: finish}
"""


@pytest.fixture
def green(tmp_path: Path) -> Path:
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "green.yaml").write_text(GREEN)
    (folder / "plain.yaml").write_text(
        "name: plain\nrequests: {a: {prompt_len: 17}}\n"
        "steps:\n  - {a: {prefill: 17}}\n  - {a: decode}\n  - {a: finish}\n"
    )
    return folder


def run(capsys, *args: str) -> tuple[int, list[str]]:
    status = main(["run", *args])
    return status, capsys.readouterr().out.splitlines()


def test_a_green_run_prints_a_row_of_characters_not_a_line_per_scenario(
    vllm, green, tmp_path, capsys
):
    status, lines = run(capsys, str(green), "--report-dir", str(tmp_path / "out"))
    assert status == 0
    assert lines[0].startswith("kvconform ") and "loading vLLM" in lines[0]
    assert lines[1].startswith(f"vLLM {vllm.version} loaded in ")
    assert lines[2] == "." * 5 + " " * (ROW - 5) + " [100%]"
    assert not [line for line in lines if line.startswith("PASSED")]
    assert re.fullmatch(r"5 passed in [\d.]+ s; exit 0", lines[-2])
    assert lines[-1].startswith("reports: ")
    assert len(lines) <= 7, lines


def test_one_file_is_one_scenario(vllm, green, tmp_path, capsys):
    status, lines = run(capsys, str(green / "plain.yaml"), "--report-dir", str(tmp_path / "o"))
    assert status == 0
    assert ": 1 scenario from " in lines[0], lines[0]
    assert re.fullmatch(r"1 passed in [\d.]+ s; exit 0", lines[-2])


def test_the_short_summary_shortens_the_prose_and_keeps_every_figure(capsys):
    from kvconform.fronts.summary import print_short_summary
    from kvconform.model.results import Failure, RunReport

    message = (
        "step 7 (line 31, decode) request a, group 0 (sliding_window): the live KVCacheManager "
        "holds 6 blocks, below the floor of 33 = cdiv(min(512 + 1 + 3, 1024), 16); the "
        "drafter's positions 96..99 have no block (why: one column per block_size tokens up "
        "to the last position the target or the drafter writes, never past max_model_len)"
    )
    result = _result("s", Verdict.FAILED)
    result.failures = [Failure("floor", message, party="live")]
    print_short_summary(RunReport([result], [], "0.34.0", "installed", None))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("FAILED")]
    assert re.findall(r"\d+", line.split(" - ", 1)[1]) == re.findall(r"\d+", message)
    assert "below the floor of 33 = cdiv(min(512 + 1 + 3, 1024), 16)" in line
    assert "(why:" not in line and len(line) < len(message)


def test_verbose_prints_a_line_per_scenario(vllm, green, tmp_path, capsys):
    status, lines = run(capsys, str(green), "--report-dir", str(tmp_path / "out"), "-v")
    assert status == 0
    assert len([line for line in lines if re.match(r"PASSED +\S+ +\(\d+ ms\)", line)]) == 5


def test_quiet_prints_the_summary_only(vllm, green, tmp_path, capsys):
    (green / "sink.yaml").write_text(
        "name: sink\nmodel: {groups: [{type: sink_full_attention, sink_len: 16}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    status, lines = run(capsys, str(green), "--report-dir", str(tmp_path / "out"), "-q")
    assert status == 1  # vLLM 0.33.0 raises on the sink group
    assert not [line for line in lines if "loading vLLM" in line or " loaded in " in line]
    assert not [line for line in lines if re.match(r"[.FEsxXu]+ +\[", line)]
    # The failure with its first message and rerun, the counts, the reports.
    text = "\n".join(lines)
    assert re.search(r"^ERROR   sink - vLLM \S+ raised ", text, re.M), text
    assert "rerun: kvconform run " in text and "root causes" not in text
    assert re.fullmatch(r"5 passed, 1 error in [\d.]+ s; exit 1", lines[-2])
    assert lines[-1].startswith("reports: ")


def _result(scenario_id: str, verdict: Verdict, why: str = "") -> ScenarioResult:
    result = ScenarioResult(scenario_id, f"scenarios/{scenario_id}.yaml", verdict)
    if verdict is Verdict.SKIPPED:
        result.skip_reason = why
    else:
        result.error = why
    return result


def test_skips_with_one_reason_are_one_line_with_a_count():
    cuda = "engine mode cannot run here: no CUDA device"
    results = [_result(f"engine-{i}", Verdict.SKIPPED, cuda) for i in range(11)]
    results += [_result("old", Verdict.UNSUPPORTED, "needs CircularBufferSpec")]
    results += [_result("fine", Verdict.PASSED)]
    skipped, unsupported = folded_lines(results)
    assert skipped.startswith(f"SKIPPED     11 scenarios: {cuda} (engine-0, engine-1, ")
    assert (
        skipped
        == f"SKIPPED     11 scenarios: {cuda} ({', '.join(f'engine-{i}' for i in range(11))})"
    )
    assert unsupported == (
        "UNSUPPORTED 1 scenario: not offered here, not counted against it: "
        "needs CircularBufferSpec (old)"
    )


def test_one_unsupported_line_per_reason_names_the_ids_within_200_characters():
    why = "vLLM 0.33.0 lacks what the scenario states: the scenario is written for vLLM >=0.34.0"
    results = [_result(f"sched-{i}", Verdict.UNSUPPORTED, why) for i in range(4)]
    (line,) = folded_lines(results)
    assert line.endswith("(sched-0, sched-1, sched-2, sched-3)") and ">=0.34.0" in line
    many = [
        _result(f"a-rather-long-scenario-id-{i:02}", Verdict.UNSUPPORTED, why) for i in range(40)
    ]
    (line,) = folded_lines(many)
    assert len(line) <= 200 and line.startswith("UNSUPPORTED 40 scenarios: ")
    shown = line.count("a-rather-long-scenario-id-")
    assert 1 <= shown < 40 and line.endswith(f", +{40 - shown} more)")
    # A long reason's prose is shortened; its figures stay; an empty reason is never shown.
    long_why = "needs 3 blocks (" + "prose " * 60 + ") of 16 tokens"
    (line,) = folded_lines([_result("x", Verdict.SKIPPED, long_why)])
    assert len(line) <= 200 and "needs 3 blocks of 16 tokens" in line
    (line,) = folded_lines([_result("y", Verdict.SKIPPED, "")])
    assert line == "SKIPPED     1 scenario: skipped (y)"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_estimate_counts_from_vllms_load_not_from_its_import():
    out, clock = io.StringIO(), Clock()
    progress = Progress(300, "scenarios", out, "lines", every_items=1000, clock=clock)
    clock.now += 90  # vLLM's import
    progress.restart()
    clock.now += 1
    progress.advance()
    assert progress.summary() == "1/300 scenarios (0%), 1 s elapsed, about 4 min 59 s left"
