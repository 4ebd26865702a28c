"""``kvconform realbugs --explorer-only`` / ``--with-explorer``: the judgement, without vLLM.

The subprocesses (``kvconform explore`` on the patched tree, ``kvconform run`` of its
reproducers on the unpatched one) are stood in for by writing what they would write,
so that each outcome is decided by kvconform's own reading of those files:

* a reproducer that passes on the unpatched release: the bug is *detected*, caught by it;
* every reproducer failing there too with its own signature (asked of a stand-in for the
  baseline process): *missed*, and ``why`` names them; failing there only otherwise (a
  standing failure of the release): *detected*, and ``why`` says so;
* no finding: *missed*, and ``why`` names what the run found the unpatched release to
  fail too (the differential baseline, ``--baseline-src``); an explore run that died: *broken*.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvconform.fronts.cli import main
from kvconform.fuzz.baseline import BaselineAnswer
from kvconform.fuzz.findings import Signature
from kvconform.realbugs import explorer


class Unpatched:
    """Stands in for the baseline process on the unpatched tree: fails every document with
    the signatures ``shows``."""

    def __init__(self, shows: tuple[Signature, ...]) -> None:
        self.shows = shows
        self.judged: list[str] = []

    def __call__(self, src: Path, log: Path) -> Unpatched:
        return self

    def __enter__(self) -> Unpatched:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def judge(self, text: str) -> BaselineAnswer:
        self.judged.append(text)
        return BaselineAnswer(self.shows, "failed" if self.shows else "passed")


def _stand_in(
    monkeypatch: pytest.MonkeyPatch,
    findings: list[str],
    passes_unpatched: set[str],
    status: int,
    baseline_shows: tuple[str, ...] = (),
) -> list[list[str]]:
    calls: list[list[str]] = []

    def run_logged(command: list[str], folder: Path, log_file: str = "x") -> Any:
        calls.append(command)
        (folder / log_file).write_text("log\n")
        if command[3] == "explore":
            out = Path(command[command.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            entries = []
            for number, check in enumerate(findings, 1):
                file = out / f"explore-s0-{number}-{check}-x.yaml"
                file.write_text("name: x\n")
                entries.append({"file": str(file), "parts": [check, "live", ""], "message": "m"})
            if status in (0, 1):
                summary: dict[str, Any] = {"examples": 50, "findings": entries}
                if "--baseline-src" in command:
                    shown = [{"signature": f"{check} / live", "parts": [check, "live", ""]}
                             for check in baseline_shows]  # fmt: skip
                    summary["baseline"] = {"search_runs": 4, "shrink_runs": 9, "failures": shown}
                (out / "explore-summary.json").write_text(json.dumps(summary))
            return subprocess.CompletedProcess(command, status)
        scenarios = [
            {"id": f"explore-s0-{n}", "verdict": "passed" if f"explore-s0-{n}" in passes_unpatched
             else "failed"}
            for n in range(1, len(findings) + 1)
        ]  # fmt: skip
        (folder / "report.json").write_text(json.dumps({"scenarios": scenarios}))
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(explorer, "run_logged", run_logged)
    return calls


def test_a_reproducer_that_passes_unpatched_detects_the_bug(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, ["sanity", "floor"], {"explore-s0-2"}, 1)
    result = explorer.explore_replay(Path("/patched"), Path("/pristine"), tmp_path, 45)
    assert result.outcome == "detected"
    assert result.caught_by == {"explore-s0-2": ["floor"]}
    explore, run = calls
    # Nothing from the release's own exploration: the bug's run starts at once beside it.
    assert "--known" not in explore
    assert "--no-known-findings" in explore  # any finding is a catch; triage is not its job
    assert explore[explore.index("--vllm-src") + 1] == "/patched"
    # Differential: each new failure is run on the unpatched tree before it is shrunk.
    assert explore[explore.index("--baseline-src") + 1] == "/pristine"
    assert result.counts["baseline_runs"] == 13
    assert run[run.index("--vllm-src") + 1] == "/pristine"
    assert sum(arg.endswith(".yaml") for arg in run) == 2  # every reproducer, one process


def test_findings_the_unpatched_release_shares_are_a_miss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stand_in(monkeypatch, ["sanity"], set(), 1)
    unpatched = Unpatched((Signature("sanity", "live"),))  # the stand-in's finding's parts
    monkeypatch.setattr(explorer, "BaselineProcess", unpatched)
    result = explorer.explore_replay(Path("/patched"), Path("/pristine"), tmp_path, 45)
    assert result.outcome == "missed" and not result.caught_by
    assert "fails on the unpatched release too: explore-s0-1 (sanity)" in result.why
    assert unpatched.judged == ["name: x\n"]  # the reproducer's text, asked by signature


def test_a_reproducer_the_unpatched_release_fails_only_otherwise_detects_the_bug(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The patched tree hands out a block a load still writes into; the unpatched one fails
    # the same workload only with a standing failure of its own (another invariant).
    _stand_in(monkeypatch, ["sanity"], set(), 1)
    standing = Signature("sanity", "-", "rejects a request otherwise than its multimodal ids")
    monkeypatch.setattr(explorer, "BaselineProcess", Unpatched((standing,)))
    result = explorer.explore_replay(Path("/patched"), Path("/pristine"), tmp_path, 45)
    assert result.outcome == "detected"
    assert result.caught_by == {"explore-s0-1": ["sanity"]}
    assert result.why.startswith("the unpatched release fails these reproducers only with other")


def test_a_miss_names_what_the_unpatched_release_fails_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _stand_in(monkeypatch, [], set(), 0, baseline_shows=("sanity", "crash"))
    result = explorer.explore_replay(Path("/p"), Path("/u"), tmp_path, 45)
    assert result.outcome == "missed"
    assert result.why == (
        "no finding in 50 workloads; failures the unpatched release shows too, passed over: "
        "sanity / live, crash / live"
    )
    assert result.counts["baseline_failures"] == 2


def test_no_finding_is_a_miss_and_a_dead_run_is_broken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, [], set(), 0)
    result = explorer.explore_replay(Path("/p"), Path("/u"), tmp_path / "a", 45)
    assert result.outcome == "missed" and result.why == "no finding in 50 workloads"
    assert len(calls) == 1  # nothing to rerun
    _stand_in(monkeypatch, [], set(), 3)
    result = explorer.explore_replay(Path("/p"), Path("/u"), tmp_path / "b", 45)
    assert result.outcome == "broken" and "exited 3" in result.why


def test_a_baseline_is_green_or_red_by_its_findings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _stand_in(monkeypatch, ["sanity"], set(), 1)
    assert explorer.explore_baseline(Path("/u"), tmp_path / "a", 45).outcome == "red"
    assert "--baseline-src" not in calls[0]  # the unpatched release itself: nothing to compare
    _stand_in(monkeypatch, [], set(), 0)
    assert explorer.explore_baseline(Path("/u"), tmp_path / "b", 45).outcome == "green"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--explorer-only", "0"], "--explorer-only must be a positive number of seconds"),
        (["--with-explorer", "-1"], "--with-explorer must be a positive number of seconds"),
    ],
)
def test_explorer_budgets_must_be_positive(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["realbugs", *args]) == 2
    assert message in capsys.readouterr().out


def test_explorer_only_and_with_explorer_exclude_each_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["realbugs", "--explorer-only", "5", "--with-explorer", "5"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bugs_start_beside_their_release_s_exploration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The release's own exploration ends only once a bug's run has started: were the bugs
    # still queued behind it (as when they took its findings as --known), this would time out.
    import threading

    from kvconform.realbugs import command
    from kvconform.realbugs.replay import Replay

    bug_started = threading.Event()

    def explore_baseline(tree: Path, folder: Path, seconds: float) -> Replay:
        assert bug_started.wait(timeout=10), "no bug's run started beside the baseline"
        return Replay("broken" if "0.28.0" in str(folder) else "red", 1, why="dead tree")

    def explore_replay(tree: Path, pristine: Path, folder: Path, seconds: float) -> Replay:
        bug_started.set()
        return Replay("detected", 1, {"explore-s0-1": ["floor"]})

    monkeypatch.setattr(explorer, "explore_baseline", explore_baseline)
    monkeypatch.setattr(explorer, "explore_replay", explore_replay)
    monkeypatch.setattr(command, "patched_tree", lambda bug: Path("/patched"))
    monkeypatch.setattr(command, "pristine_tree", lambda release: Path(f"/{release}"))
    bugs = ["first-prefill-drops-spec-lookahead", "swa-fine-grained-hit-assertion"]
    status = main([
        "realbugs", "--explorer-only", "5", "--jobs", "3", "--report-dir", str(tmp_path),
        *(arg for bug in bugs for arg in ("--bug", bug)),
    ])  # fmt: skip
    report = json.loads((tmp_path / "realbugs.json").read_text(encoding="utf-8"))
    outcomes = {entry["name"]: entry["outcome"] for entry in report["bugs"]}
    # 0.33.0's bug is detected; 0.28.0's release could not be explored, so nothing is concluded.
    assert outcomes == {bugs[0]: "detected", bugs[1]: "broken"}, capsys.readouterr().out
    assert status == 3
