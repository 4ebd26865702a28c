"""Coverage: computed from a run's scenarios and results, against what vLLM offers."""

from __future__ import annotations

import json

import pytest

from kvconform.fronts.cli import main
from kvconform.harness.coverage import (
    EDGE,
    NO_METHOD,
    POOL_PRESSURE,
    ROLLBACK,
    Offered,
    compute_coverage,
    offered_by,
    pool_peak,
    render_text,
)
from kvconform.harness.runner import run_scenario
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict

# Speculative, squeezed: a 5-block pool (4 usable) that the request fills, and a
# max_model_len of 64 that computed + scheduled + lookahead passes at the end.
SQUEEZED = """
name: squeezed
model: {block_size: 16, max_model_len: 64, num_blocks: 5, groups: [full_attention]}
speculative: {method: eagle, num_speculative_tokens: 2}
requests: {a: {prompt_len: 40}}
steps:
  - {a: {prefill: 24}}
  - {a: {prefill: 16}}
  - {repeat: 6, step: {a: {spec: 2, accepted: 1}}}   # computed 40 -> 52
  - {a: {spec: 2, accepted: 2}}                       # -> 55
  - {a: {spec: 2, accepted: 2}}                       # -> 58
  - {a: {spec: 2, accepted: 1}}                       # -> 60
  - {a: {spec: 2, accepted: 0}}                       # 60 + 3 + 2 lookahead passes 64
  - {a: preempt}
  - {a: {prefill: 62}}                                # prompt 40 + 22 outputs
  - {a: finish}
"""

ROOMY = """
name: roomy
model: {groups: [{type: sliding_window, sliding_window: 32}]}
requests: {a: {prompt_len: 20}}
steps:
  - {a: {prefill: 20}}
  - {a: decode}
"""

SINK = """
name: sinks
model: {groups: [{type: sink_full_attention, sink_len: 16}]}
requests: {a: {prompt_len: 20}}
steps:
  - {a: {prefill: 20}}
  - {a: finish}
"""


@pytest.fixture
def run(vllm, scenario_from):
    squeezed, roomy, sink = (scenario_from(t) for t in (SQUEEZED, ROOMY, SINK))
    results = [run_scenario(squeezed, vllm), run_scenario(roomy, vllm)]
    assert [r.verdict for r in results] == [Verdict.PASSED, Verdict.PASSED], results
    # A scenario whose run raised: only attempted (whatever this vLLM does with sinks).
    crashed = ScenarioResult(sink.id, sink.file, Verdict.ERROR, error_kind=ErrorKind.CRASH)
    crashed.error = "vLLM raised TypeError"
    return [(squeezed, results[0]), (roomy, results[1]), (sink, crashed)]


def test_exercised_triples_come_from_the_steps_and_the_trajectory(run, vllm):
    coverage = compute_coverage(run, offered_by(vllm))
    assert (coverage.scenarios, coverage.exercised) == (3, 2)
    kinds = coverage.kinds_for("full_attention", "eagle")
    assert kinds == ["prefill", "spec", ROLLBACK, "preempt", "finish", EDGE, POOL_PRESSURE]
    assert coverage.kinds_for("sliding_window", NO_METHOD) == ["prefill", "decode"]
    assert coverage.scenarios_for("full_attention", EDGE) == {"squeezed"}
    assert ("sink_full_attention", NO_METHOD) in coverage.attempted
    assert not coverage.kinds_for("sink_full_attention", NO_METHOD)
    assert coverage.group_types() == ["full_attention", "sliding_window", "sink_full_attention"]
    assert coverage.methods() == [NO_METHOD, "eagle"]


def test_pool_peak_counts_distinct_blocks_of_live_requests(run):
    (squeezed, result), (roomy, roomy_result), _ = run
    assert pool_peak(result.trajectory) == 4  # the whole usable pool
    assert pool_peak(roomy_result.trajectory) == 2


def test_what_vllm_offers_and_no_scenario_covers(run, vllm):
    coverage = compute_coverage(run, offered_by(vllm))
    classes = {item.name: item for item in coverage.offered_spec_classes()}
    assert classes["FullAttentionSpec"].status == "covered"
    assert classes["SlidingWindowSpec"].status == "covered"
    assert classes["SinkFullAttentionSpec"].status == "attempted"
    assert classes["CrossAttentionSpec"].status == "uncovered"
    assert classes["CrossAttentionSpec"].group_type == "cross_attention"
    assert classes["KVCacheSpec"].status == "not built"
    methods = {item.name: item.status for item in coverage.offered_methods()}
    assert methods["eagle"] == "covered"
    assert methods["dflash"] == "uncovered"
    gaps = coverage.gaps()
    assert any(g.startswith("vLLM spec class CrossAttentionSpec") for g in gaps)
    assert "speculative method dflash: no scenario uses it" in gaps
    assert any(g.startswith("group type sliding_window never sees: spec, rollback") for g in gaps)
    json.dumps(coverage.to_json())  # plain data all the way down


def test_new_spec_classes_and_method_aliases():
    offered = Offered(
        ("FullAttentionSpec", "BrandNewSpec"),
        ("mtp", "deepseek_mtp", "eagle"),
        {"deepseek_mtp": "mtp"},
    )
    coverage = compute_coverage([], offered)
    assert {i.name: i.status for i in coverage.offered_spec_classes()} == {
        "FullAttentionSpec": "uncovered",
        "BrandNewSpec": "new",
    }
    coverage.cells[("full_attention", "mtp", "spec")].add("x")
    methods = {i.name: i for i in coverage.offered_methods()}
    assert methods["deepseek_mtp"].status == "covered" and methods["deepseek_mtp"].alias_of == "mtp"
    assert methods["eagle"].status == "uncovered"
    assert coverage.method_variants() == {"mtp": ["deepseek_mtp"]}
    assert [i.name for i in coverage.primary_methods()] == ["mtp", "eagle"]
    assert "vLLM spec class BrandNewSpec (no group type): kvconform has no group type for it" in (
        coverage.gaps()
    )


def test_text_view_shows_the_matrix(run, vllm):
    text = render_text(compute_coverage(run, offered_by(vllm)))
    assert "coverage: 2 of 3 scenarios exercised" in text
    rows: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line)  # the first table: types x methods
    assert "psrxfem" in rows["full_attention"]  # prefill spec rollback preempt finish edge pool
    assert rows["sink_full_attention"].split()[1] == "!"
    assert "UNCOVERED  CrossAttentionSpec -> cross_attention" in text
    assert "UNCOVERED  method dflash" in text


def test_coverage_command(vllm, write_scenario, tmp_path, capsys):
    write_scenario(SQUEEZED, "squeezed.yaml")
    write_scenario(ROOMY, "roomy.yaml")
    out = tmp_path / "out" / "coverage.json"
    status = main(["coverage", str(tmp_path), "--json", str(out), "--progress", "off"])
    text = capsys.readouterr().out
    assert status == 0
    assert "group type x method" in text and "UNCOVERED" in text
    data = json.loads(out.read_text())
    assert data["exercised"] == 2
    assert data["group_types"]["full_attention"]["methods"]["eagle"][-1] == POOL_PRESSURE
    assert {c["name"]: c["status"] for c in data["offered"]["spec_classes"]}[
        "SlidingWindowSpec"
    ] == "covered"
