"""The differential baseline of the search loop (``kvconform explore --baseline-src``).

The vLLM under test is the installed one, running a real failure: findings.md #14's
workload (a whole-prompt KV load on a sliding-window model; ``sanity`` fails on every
release since 0.28.0). The baseline is a stand-in behind the ``Baseline`` protocol,
saying of each document whether "the baseline" fails it the same way, so that every
branch of the search's decision is taken on purpose:

* a first failure the baseline shows too is recorded as the baseline's, asked once, never
  shrunk nor searched for again, and the search goes on;
* a failure the baseline does not show is shrunk, and a shrink candidate the baseline fails
  the same way does not count: the reproducer is one the baseline passes;
* the summary's counts fold across ``--jobs`` workers, and ``--known`` takes the
  baseline's failures of an earlier run too.

The real baseline process, on copies of vLLM's tree, is ``tests/test_explore.py``'s
(slow); the command's argument check is here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from kvconform.explore.runner import ExploreStats, known_signatures
from kvconform.fronts.cli import main
from kvconform.fuzz.baseline import BaselineAnswer, BaselineStats
from kvconform.fuzz.findings import Signature
from kvconform.fuzz.search import Budget, SearchStats, search
from kvconform.harness.yamlio import load_yaml

FINDING_14 = Signature("sanity", "SlidingWindowSpec", "frees a block the attention still reads")


def workload(extra: int) -> dict[str, Any]:
    """#14's failing request ``a`` when ``extra`` >= 1, with ``extra - 1`` plain requests
    beside it; ``extra`` = 0 is one plain request, which conforms."""
    requests = {"p": {"prompt_len": 8, "max_tokens": 1}}
    if extra >= 1:
        requests["a"] = {"prompt_len": 47, "max_tokens": 3, "remote_prefill": 1}
    for n in range(extra - 1):
        requests[f"q{n}"] = {"prompt_len": 8, "max_tokens": 1}
    return {
        "kind": "scheduler",
        "model": {
            "block_size": 16,
            "max_model_len": 128,
            "num_blocks": 40,
            "groups": [{"type": "sliding_window", "sliding_window": 32}, "full_attention"],
        },
        "scheduler": {"mode": "sync"},
        "requests": requests,
    }


def extra_of(text: str) -> int:
    requests = load_yaml(text, "<doc>")["requests"]
    return 0 if "a" not in requests else len(requests) - 1


class Workloads:
    """An example source of #14's workload with 0-3 other requests (``extra``)."""

    name = "explore"

    def documents(self) -> st.SearchStrategy[dict[str, Any]]:
        return st.integers(0, 3).map(workload)

    def measure(self, result: Any, doc: dict[str, Any]) -> None:
        pass


class StandIn:
    """A baseline that fails #14's way on the documents ``fails`` says, and passes others."""

    def __init__(self, fails: Any) -> None:
        self.fails = fails
        self.asked: list[int] = []  # each document's `extra`, in the order asked

    def describe(self) -> str:
        return "vLLM (a stand-in)"

    def judge(self, text: str) -> BaselineAnswer:
        extra = extra_of(text)
        self.asked.append(extra)
        if self.fails(extra):
            return BaselineAnswer((FINDING_14,), "failed", ("the baseline's message",))
        return BaselineAnswer((), "passed")


def test_the_workload_fails_on_the_installed_vllm(vllm: Any) -> None:
    from kvconform.fuzz.findings import signatures
    from kvconform.fuzz.search import run_document

    assert FINDING_14 in signatures(run_document(workload(2), vllm))
    assert signatures(run_document(workload(0), vllm)) == []


def test_a_failure_the_baseline_shows_is_recorded_not_shrunk(vllm: Any) -> None:
    baseline = StandIn(lambda extra: True)
    stats = SearchStats(seed=0, budget=12)
    lines: list[str] = []
    search(Workloads(), vllm, stats, Budget(examples=12), say=lines.append, baseline=baseline)
    assert stats.findings == []
    assert stats.baseline is not None
    assert [f.signature for f in stats.baseline.failures] == [FINDING_14]
    # The search went on after it (to the end of the space: four distinct workloads).
    assert stats.examples > stats.baseline.failures[0].examples_before
    assert stats.baseline.failures[0].message == "the baseline's message"
    # Asked once: the signature is the baseline's from then on, not searched for again.
    assert len(baseline.asked) == stats.baseline.search_runs == 1
    assert stats.baseline.shrink_runs == stats.shrink_runs == 0
    assert any("the baseline fails too" in line for line in lines), lines


def test_a_failure_the_baseline_lacks_is_shrunk_past_what_the_baseline_fails(
    vllm: Any,
) -> None:
    # The baseline fails #14's way where a stands alone (extra = 1), the smallest failing
    # workload; the search shrinks towards it. Without the baseline the reproducer is that
    # workload; with it, the smallest the baseline passes: a beside one other request.
    plain = SearchStats(seed=0, budget=20)
    search(Workloads(), vllm, plain, Budget(examples=20), max_findings=1)
    assert [extra_of(f.text) for f in plain.findings] == [1]

    shrunk = []
    for seed in range(8):
        baseline = StandIn(lambda extra: extra == 1)
        stats = SearchStats(seed=seed, budget=20)
        search(Workloads(), vllm, stats, Budget(examples=20), max_findings=1,
               baseline=baseline)  # fmt: skip
        assert stats.baseline is not None
        if not stats.findings:  # its first failing workload was the baseline's (extra = 1)
            assert baseline.asked[0] == 1 and stats.baseline.failures
            continue
        (finding,) = stats.findings
        assert finding.signature == FINDING_14 and not stats.baseline.failures
        assert baseline.asked[0] >= 2  # the first failing workload, judged before shrinking
        assert 1 in baseline.asked[1:]  # the candidate the baseline fails was offered ...
        shrunk.append(extra_of(finding.text))  # ... and did not count
        assert stats.baseline.shrink_runs == len(baseline.asked) - 1 >= 1
    assert shrunk and set(shrunk) == {2}, shrunk


def test_without_a_failure_the_baseline_is_not_asked(vllm: Any) -> None:
    baseline = StandIn(lambda extra: True)
    stats = SearchStats(seed=0, budget=4)

    class Passing(Workloads):
        def documents(self) -> st.SearchStrategy[dict[str, Any]]:
            return st.just(workload(0))

    search(Passing(), vllm, stats, Budget(examples=4), baseline=baseline)
    assert baseline.asked == [] and stats.findings == []
    assert stats.baseline is not None and stats.search_json()["baseline"]["search_runs"] == 0


def test_baseline_counts_fold_across_workers_and_known_takes_its_failures(
    tmp_path: Path,
) -> None:
    one, two = BaselineStats("vLLM 0.33.0 (t)", 4.0), BaselineStats("vLLM 0.33.0 (t)", 6.0)
    one.count(BaselineAnswer((FINDING_14,), "failed", ("m",)), 0.5, shrinking=False)
    two.count(BaselineAnswer((), "unsupported"), 0.25, shrinking=True)
    from kvconform.fuzz.baseline import BaselineFailure

    one.failures.append(BaselineFailure(FINDING_14, 7, "m"))
    two.failures.append(BaselineFailure(FINDING_14, 9, "m"))
    other = Signature("crash", "AssertionError", "x.py:1 f")
    two.failures.append(BaselineFailure(other, 3, "n"))
    stats = ExploreStats(seed=0, budget=1)
    for worker in (one, two):
        summary = {**ExploreStats(seed=0, budget=1).to_json(), "baseline": worker.to_json()}
        stats.add(summary)
    folded = stats.to_json()["baseline"]
    assert folded["search_runs"] == 1 and folded["shrink_runs"] == 1
    assert folded["unjudged"] == 1 and folded["seconds"] == 0.75
    assert folded["setup_seconds"] == 6.0  # side by side: the longest start
    assert [f["signature"] for f in folded["failures"]] == [str(FINDING_14), str(other)]
    assert "the baseline's own failures: " in stats.summary_lines()[1]

    summary = tmp_path / "explore-summary.json"
    found = Signature("floor", "live", "FullAttentionSpec")
    summary.write_text(json.dumps({
        "findings": [{"parts": [found.check, found.subject, found.detail]}],
        "baseline": folded,
    }))  # fmt: skip
    assert known_signatures(summary) == (found, FINDING_14, other)


def test_baseline_src_must_be_a_vllm_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["explore", "--budget", "1", "--baseline-src", str(tmp_path)])
    assert status == 2
    assert f"--baseline-src: {tmp_path} is not a vLLM Python tree" in capsys.readouterr().out


def test_the_search_is_the_same_with_a_baseline_that_never_fails(vllm: Any) -> None:
    # Differential testing costs runs, not examples: with a baseline that passes everything,
    # the same seed finds and shrinks the same finding.
    plain = SearchStats(seed=3, budget=15)
    search(Workloads(), vllm, plain, Budget(examples=15), max_findings=1)
    compared = SearchStats(seed=3, budget=15)
    search(Workloads(), vllm, compared, Budget(examples=15), max_findings=1,
           baseline=StandIn(lambda extra: False))  # fmt: skip
    assert [f.text for f in compared.findings] == [f.text for f in plain.findings]
    assert compared.examples == plain.examples


def test_a_crash_is_the_baselines_at_another_line_of_the_same_function() -> None:
    # A patch moves the lines below what it changes: the same assertion of the same function
    # raises at another line in the patched tree (found by realbugs --explorer-only: a crash
    # "new" to the patched tree that its release's `kvconform run` failed as well).
    frame = "vllm/v1/core/single_type_kv_cache_manager.py:{} find_longest_cache_hit"
    patched = Signature("crash", "AssertionError", frame.format(1340))
    answer = BaselineAnswer(
        (Signature("crash", "AssertionError", frame.format(1333)),), "crash", ("raised",)
    )
    assert answer.shows(patched) and answer.message(patched) == "raised"
    elsewhere = Signature("crash", "AssertionError", "vllm/v1/core/block_pool.py:1333 f")
    assert not answer.shows(elsewhere)
    assert not answer.shows(Signature("crash", "IndexError", frame.format(1333)))
    # Other checks' signatures hold no line: compared as they are.
    assert not BaselineAnswer((FINDING_14,), "failed").shows(
        Signature("sanity", "SlidingWindowSpec", "shares a block between live requests")
    )


def test_a_triaged_failure_is_kept_as_met_not_shrunk(vllm: Any) -> None:
    # #14 is triaged (scenarios/explore-known.yaml): its first failing workload is recorded
    # as it was drawn, the round ends there, and no shrink run is spent on it.
    shrunk = SearchStats(seed=0, budget=20)
    search(Workloads(), vllm, shrunk, Budget(examples=20), max_findings=1)
    assert shrunk.shrink_runs > 0 and [extra_of(f.text) for f in shrunk.findings] == [1]

    kept = SearchStats(seed=0, budget=20)
    lines: list[str] = []
    search(Workloads(), vllm, kept, Budget(examples=20), max_findings=1, say=lines.append,
           unshrunk=lambda signature: signature == FINDING_14)  # fmt: skip
    (finding,) = kept.findings
    assert finding.signature == FINDING_14 and kept.shrink_runs == finding.shrink_runs == 0
    # The example that first failed, as drawn: the same seed's first failure. A triaged
    # finding does not count towards max_findings: the search went on past it.
    assert extra_of(finding.text) >= 1 and finding.examples_before < kept.examples
    assert any("triaged, kept as met" in line for line in lines), lines
    assert any("kept as met, " in line and "shrunk to" not in line for line in lines), lines
