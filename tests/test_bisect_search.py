"""The bisection loop, without vLLM: fake probes over a list of labels.

What each test pins down:
- the probe count stays within ceil(log2(n)) + 2 (ends included) for every n and boundary;
- skipped candidates are stepped around, and a boundary hidden behind skips is reported
  as a range, never as a wrong answer;
- both ends are verified first and a wrong end stops the bisection with exit 2;
- an interrupted bisection resumes from its state file without probing again;
- run statuses map to git bisect's codes (0 old, 1 new, 125 skip, 128 abort).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.bisect import outcome, release_index, search, selection, summary
from kvconform.bisect.outcome import Outcome
from kvconform.bisect.releases_mode import (
    ENDS_WRONG,
    FOUND,
    UNDECIDED,
    BisectAborted,
    run_search,
)
from kvconform.bisect.state import BisectState, ProbeRecord
from kvconform.errors import UsageError


def simulate(n: int, first_new: int, skipped: frozenset[int] = frozenset()):
    outcomes: dict[int, Outcome] = {0: Outcome.OLD, n - 1: Outcome.NEW}
    probes = 2
    while (index := search.next_probe(n, outcomes)) is not None:
        assert index not in outcomes, "probed a candidate twice"
        probes += 1
        if index in skipped:
            outcomes[index] = Outcome.SKIP
        else:
            outcomes[index] = Outcome.NEW if index >= first_new else Outcome.OLD
    return search.conclude(n, outcomes), probes


@given(st.integers(2, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n - 1))))
def test_probe_count_within_budget(case):
    n, first_new = case
    boundary, probes = simulate(n, first_new)
    assert boundary.exact and boundary.first_new == first_new
    assert boundary.last_old == first_new - 1
    assert probes <= math.ceil(math.log2(n)) + 2 == search.probe_budget(n)


@settings(max_examples=200)
@given(
    st.integers(3, 60).flatmap(
        lambda n: st.tuples(
            st.just(n), st.integers(1, n - 1), st.frozensets(st.integers(1, n - 2), max_size=n)
        )
    )
)
def test_skips_never_give_a_wrong_answer(case):
    n, first_new, skipped = case
    boundary, _ = simulate(n, first_new, skipped)
    possible = {*boundary.untestable, boundary.first_new}
    assert first_new in possible
    assert all(i in skipped for i in boundary.untestable)
    if boundary.exact:
        assert boundary.first_new == first_new


def test_skip_steps_to_a_neighbour():
    # 11 releases, the middle one (index 5) cannot be exercised: its neighbour is probed.
    outcomes = {0: Outcome.OLD, 10: Outcome.NEW}
    assert search.next_probe(11, outcomes) == 5
    outcomes[5] = Outcome.SKIP
    assert search.next_probe(11, outcomes) in (4, 6)


@pytest.mark.parametrize(
    ("status", "find_fix", "code"),
    [(0, False, 0), (1, False, 1), (0, True, 1), (1, True, 0), (3, False, 125), (3, True, 125),
     (2, False, 128), (2, True, 128), (None, False, 128), (130, False, 128)],
)  # fmt: skip
def test_git_codes(status, find_fix, code):
    assert outcome.git_code(status, find_fix) == code


# -- run_search with a fake prober -------------------------------------------------------

RELEASES = ["0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
            "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]  # fmt: skip


class FakeReleases:
    """Releases before ``fixed`` fail one scenario; ``broken`` ones cannot be exercised."""

    def __init__(self, fixed: str, broken: tuple[str, ...] = (), stop_after: int | None = None):
        self.fixed, self.broken, self.stop_after = fixed, broken, stop_after
        self.probed: list[str] = []

    def __call__(self, label: str) -> ProbeRecord:
        if self.stop_after is not None and len(self.probed) == self.stop_after:
            raise KeyboardInterrupt
        self.probed.append(label)
        if label in self.broken:
            return ProbeRecord(label, 3, reason=f"vLLM {label} lacks an importable vllm")
        ok = RELEASES.index(label) >= RELEASES.index(self.fixed)
        verdict = "passed" if ok else "failed"
        headlines = {} if ok else {"warmup-k3": "[floor] warmup holds 1 block, floor 2"}
        return ProbeRecord(label, 0 if ok else 1, f"/reports/{label}",
                           {"warmup-k3": verdict, "other": "passed"}, headlines)  # fmt: skip


def new_state(tmp_path: Path) -> BisectState:
    state, resumed = BisectState.open(tmp_path / "state", "k", {"mode": "test"})
    assert not resumed
    state.candidates = list(RELEASES)
    return state


def test_finds_the_fix_and_what_flipped(tmp_path, capsys):
    fake = FakeReleases(fixed="0.28.0")
    state = new_state(tmp_path)
    assert run_search(state, fake, find_fix=True, say=print, what="release") == FOUND
    assert state.result is not None
    assert state.result["first_new"] == "0.28.0" and state.result["last_old"] == "0.27.1"
    assert [f["scenario"] for f in state.result["flipped"]] == ["warmup-k3"]
    assert fake.probed[:2] == ["0.25.0", "0.33.0"]  # the ends first
    assert len(fake.probed) <= search.probe_budget(len(RELEASES)) == 6
    out = capsys.readouterr().out
    assert "First fixed (first conforming) release: 0.28.0" in out
    assert "warmup-k3: failed -> passed" in out and "[floor] warmup holds 1 block" in out
    assert "/reports/0.28.0" in out


def test_skips_a_release_that_cannot_be_exercised(tmp_path):
    fake = FakeReleases(fixed="0.30.0", broken=("0.28.0",))
    state = new_state(tmp_path)
    assert run_search(state, fake, find_fix=True, say=print) == FOUND
    assert fake.probed[2] == "0.28.0"  # the middle of 0.25.0..0.33.0 was tried, and skipped
    assert fake.probed[3] == "0.27.1"  # then its neighbour
    assert state.result is not None and state.result["first_new"] == "0.30.0"


def test_boundary_behind_skips_is_a_range(tmp_path):
    fake = FakeReleases(fixed="0.28.0", broken=("0.27.1", "0.28.0"))
    state = new_state(tmp_path)
    assert run_search(state, fake, find_fix=True, say=print) == UNDECIDED
    assert state.result is not None
    assert state.result["untestable"] == ["0.27.1", "0.28.0"]
    assert state.result["first_new"] == "0.29.0" and state.result["last_old"] == "0.27.0"


@pytest.mark.parametrize(
    ("fixed", "find_fix", "hint"),
    [("0.28.0", False, "add --find-fix"), ("0.25.0", True, "nothing changed")],
)
def test_wrong_ends_stop_with_exit_2(tmp_path, capsys, fixed, find_fix, hint):
    fake = FakeReleases(fixed=fixed)
    state = new_state(tmp_path)
    assert run_search(state, fake, find_fix=find_fix, say=print) == ENDS_WRONG
    assert fake.probed == ["0.25.0", "0.33.0"]
    out = capsys.readouterr().out
    assert "cannot bisect" in out and hint in out


def test_abort_stops_and_is_not_recorded(tmp_path):
    def probe(label: str) -> ProbeRecord:
        return ProbeRecord(label, 2, reason="scenario.yaml:3: model: unknown field")

    state = new_state(tmp_path)
    with pytest.raises(BisectAborted, match="unknown field"):
        run_search(state, probe, find_fix=False, say=print)
    assert state.probes == {}


def test_interrupted_bisection_resumes_without_probing_again(tmp_path):
    first = FakeReleases(fixed="0.31.0", stop_after=3)
    state = new_state(tmp_path)
    state.save()
    with pytest.raises(KeyboardInterrupt):
        run_search(state, first, find_fix=True, say=print)
    resumed, was_saved = BisectState.open(tmp_path / "state", "k", {"mode": "test"})
    assert was_saved and list(resumed.probes) == first.probed
    second = FakeReleases(fixed="0.31.0")
    assert run_search(resumed, second, find_fix=True, say=print) == FOUND
    assert not set(second.probed) & set(first.probed)
    assert resumed.result is not None and resumed.result["first_new"] == "0.31.0"
    assert len(first.probed) + len(second.probed) <= search.probe_budget(len(RELEASES))


# -- the release list --------------------------------------------------------------------


def test_release_list_is_ordered_filtered_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCONFORM_CACHE", str(tmp_path))
    calls = []

    def query() -> list[str]:
        calls.append(1)
        return ["0.33.0", "0.28.0", "0.9.2", "0.28.1rc1", "0.27.1", "0.10.0", "0.30.0.dev3"]

    versions = release_index.list_releases(query=query)
    assert versions == ["0.9.2", "0.10.0", "0.27.1", "0.28.0", "0.28.1rc1", "0.30.0.dev3", "0.33.0"]
    assert release_index.list_releases(query=query) == versions and len(calls) == 1
    release_index.list_releases(refresh=True, query=query)
    assert len(calls) == 2
    between = release_index.releases_between(versions, "0.10.0", "0.33.0")
    assert between == ["0.10.0", "0.27.1", "0.28.0", "0.33.0"]
    assert "0.28.1rc1" in release_index.releases_between(versions, "0.10.0", "0.33.0", pre=True)
    with pytest.raises(UsageError, match="0.26.0 is not on pip's index"):
        release_index.releases_between(versions, "0.26.0", "0.33.0")


@pytest.mark.parametrize("text", ["0.33.0..0.25.0", "0.25.0", "0.25.0..", "x..0.33.0"])
def test_bad_release_ranges(text):
    with pytest.raises(UsageError, match="--releases"):
        release_index.parse_range(text)


# -- flips and the selection ---------------------------------------------------------------


def test_flips_separate_decisive_changes_from_others(capsys):
    old = ProbeRecord("0.27.1", 1, verdicts={"a": "failed", "b": "xfailed", "c": "passed"},
                      headlines={"a": "[floor] holds 1, floor 2 (why: because)"})  # fmt: skip
    new = ProbeRecord("0.28.0", 0, verdicts={"a": "passed", "b": "xpassed", "c": "passed"})
    flips = summary.flipped(old, new)
    assert [(f.scenario, f.decisive) for f in flips] == [("a", True), ("b", False)]
    summary.print_flips(flips, "0.27.1", "0.28.0", print)
    out = capsys.readouterr().out
    assert "a: failed -> passed\n      [floor] holds 1, floor 2\n" in out  # no "(why: ...)"
    assert "Other verdict changes there: b xfailed -> xpassed" in out


def test_selection_applies_the_nearest_expectations_like_run(write_scenario):
    scenario = write_scenario(
        """
        name: s
        model: {block_size: 16, max_model_len: 64, num_blocks: 8, groups: [full_attention]}
        requests: {a: {prompt_len: 4}}
        steps: [{a: {prefill: 4}}, {a: finish}]
        """
    )
    expectations = scenario.parent / "expectations.yaml"
    expectations.write_text("- id: s\n  reason: a known divergence\n")
    chosen = selection.select([str(scenario)], None)
    assert chosen.scenario_ids == ("s",)
    assert chosen.check_args()[-2:] == ["--expectations", str(expectations.resolve())]
    bare = selection.select([str(scenario)], None, no_expectations=True)
    assert bare.check_args()[-1] == "--no-expectations" and bare.digest != chosen.digest
    expectations.write_text("- id: s\n  reason: another reason\n")
    assert selection.select([str(scenario)], None).digest != chosen.digest
    with pytest.raises(UsageError, match="no scenario selected"):
        selection.select([str(scenario)], "nothing-matches")


# -- bisecting what the nightly judged: --checks, root causes, the next command ----------

PLAIN = """
name: s
model: {block_size: 16, max_model_len: 64, num_blocks: 8, groups: [full_attention]}
requests: {a: {prompt_len: 4}}
steps: [{a: {prefill: 4}}, {a: finish}]
"""


def test_check_takes_checks_and_expectations_to_its_run(write_scenario, monkeypatch):
    from kvconform.fronts import cli
    from kvconform.fronts.commands import check

    scenario = write_scenario(PLAIN)
    assert cli.main(["check", "--checks", "nope", str(scenario)]) == 128  # abort, never "bad"
    seen = []
    monkeypatch.setattr(check, "cmd_run", lambda args: seen.append(args) or 0)
    assert cli.main(["check", "--checks", "all", "--no-expectations", str(scenario)]) == 0
    assert seen[0].checks == "all" and seen[0].no_expectations


def test_every_probe_runs_the_selected_checks(write_scenario, monkeypatch, tmp_path):
    from kvconform.bisect import probe

    scenario = write_scenario(PLAIN)
    default = selection.select([str(scenario)], None)
    every = selection.select([str(scenario)], None, checks="all")
    some = selection.select([str(scenario)], None, checks="slots,floor")
    assert "--checks" not in default.check_args() and default.digest != every.digest
    assert every.check_args()[1:3] == ["--checks", "all"]
    assert some.check_args()[1:3] == ["--checks", "floor,slots"]  # in reporting order
    with pytest.raises(UsageError, match="--checks: unknown check 'nope'"):
        selection.select([str(scenario)], None, checks="nope")
    import subprocess

    commands = []

    def run_logged(command, folder):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(probe, "run_logged", run_logged)
    probe.run_check("0.28.0", ["--vllm-release", "0.28.0"], every, tmp_path)
    (command,) = commands
    assert command[3:8] == [
        "check",
        str(scenario.resolve()),
        "--checks",
        "all",
        "--no-expectations",
    ]


def with_causes(record: ProbeRecord) -> ProbeRecord:
    """A probe whose report gathered its failures as `kvconform run` does."""
    if record.run_status == 1:
        record.root_causes = [
            {"check": "floor", "party": "predicted", "scenarios": ["warmup-k3"],
             "miss": "is below the floor by exactly the lookahead"},
            {"check": "agree", "party": "live", "scenarios": ["known"],
             "miss": "holds more than the warmup predictor by one block"},
        ]  # fmt: skip
    return record


def test_the_flips_are_grouped_by_root_cause(tmp_path, capsys):
    fake = FakeReleases(fixed="0.28.0")
    state = new_state(tmp_path)
    assert (
        run_search(state, lambda label: with_causes(fake(label)), True, print, "release") == FOUND
    )
    out = capsys.readouterr().out
    assert "The flips by root cause (the failures of 0.27.1, gathered as `kvconform run`" in out
    assert (
        "1. 1 flipped scenario: the warmup predictor _reserved_block_count "
        "(vllm/v1/worker/gpu/warmup.py) is below the floor by exactly the lookahead [floor]"
    ) in out
    assert "known" not in out.split("The flips by root cause")[1].split("Probes")[0]
    assert state.result is not None
    assert state.result["root_causes"] == [
        {"check": "floor", "party": "predicted", "scenarios": ["warmup-k3"],
         "miss": "is below the floor by exactly the lookahead"},
    ]  # fmt: skip


def test_a_flip_cause_names_the_manager_its_group_points_at():
    group = {
        "check": "floor", "party": "live", "scenarios": ["swa-62"],
        "miss": "is one position short in every record", "checks": {"floor": 2, "slots": 2},
        "vllm_function": "SlidingWindowManager",
        "vllm_file": "vllm/v1/core/single_type_kv_cache_manager.py",
    }  # fmt: skip
    record = ProbeRecord("0.33.1", 1, verdicts={"swa-62": "failed"}, root_causes=[group])
    flip = summary.Flip("swa-62", "passed", "failed", "")
    (cause,) = summary.flip_causes([flip], record)
    assert cause.sentence() == (
        "1 flipped scenario: the live allocator's SlidingWindowManager "
        "(vllm/v1/core/single_type_kv_cache_manager.py) is one position short in every "
        "record [floor, slots]"
    )


@pytest.mark.parametrize(
    ("find_fix", "fixed", "ends"),
    [(False, None, "--good v0.29.0 --bad v0.30.0"), (True, "0.30.0", "--good v0.30.0 --bad v0.29.0 --find-fix")],
)  # fmt: skip
def test_a_release_bisection_names_the_commit_bisection_to_run_next(
    write_scenario, monkeypatch, tmp_path, capsys, find_fix, fixed, ends
):
    import argparse

    from kvconform.bisect import releases_mode

    monkeypatch.setenv("KVCONFORM_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    scenario = write_scenario(PLAIN)
    monkeypatch.setattr(release_index, "list_releases", lambda **_: list(RELEASES))
    probed_with = []

    def prober(chosen, cache, fresh, say):
        probed_with.append(chosen.check_args())
        if fixed:
            return FakeReleases(fixed=fixed)

        def regression(label: str) -> ProbeRecord:  # 0.30.0 broke it
            bad = RELEASES.index(label) >= RELEASES.index("0.30.0")
            return ProbeRecord(label, int(bad), verdicts={"s": "failed" if bad else "passed"})

        return regression

    monkeypatch.setattr(releases_mode, "release_prober", prober)
    args = argparse.Namespace(
        releases="0.25.0..0.33.0", paths=[scenario.name], expression="s", checks="all",
        expectations=None, no_expectations=True, find_fix=find_fix, pre=False, fresh=True,
    )  # fmt: skip
    monkeypatch.chdir(scenario.parent)
    assert releases_mode.bisect_releases(args, print) == FOUND
    assert "--checks" in probed_with[0] and "all" in probed_with[0]
    out = capsys.readouterr().out
    expected = (
        f"kvconform bisect --repo VLLM_CHECKOUT {ends} {scenario.name} -k s --checks all "
        "--no-expectations"
    )
    assert f"  {expected}\n" in out and "vLLM tags release X.Y.Z as vX.Y.Z" in out


def test_a_commit_probe_gets_the_checks_through_git_bisect_run(write_scenario, tmp_path):
    from kvconform.bisect import gitprobe

    chosen = selection.select([str(write_scenario(PLAIN))], None, checks="all")
    state = new_state(tmp_path)
    state.save()
    gitprobe.write_config(state, chosen, find_fix=False, fresh=False)
    _, again, _, _ = gitprobe.load_config(state.directory)
    assert again == chosen and "--checks" in again.check_args()
