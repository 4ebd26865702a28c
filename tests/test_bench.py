"""Smoke tests for ``make bench`` (kvconform.bench): tiny sizes, no timing assertions.

They keep the benchmark from rotting: every figure is present (measured, or not
available with a reason), and the bare loop makes the same vLLM calls, on the
same trajectories, as the harness it is compared with.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from kvconform.bench import bare, overhead, processes, scaling
from kvconform.bench.cli import ROOT, SKIPPABLE, quick_options, run_bench
from kvconform.bench.processes import read_junit
from kvconform.bench.report import RESULTS_HEADING, append_row, write_json
from kvconform.errors import NotOffered
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.loader import load_paths
from kvconform.harness.runner import DRIVERS, run_scenario

# A small corpus that still takes every path of the bare loop (chunked prefill, spec
# steps, preemption, prefix caching, cross-attention) and every scenario kind.
SMOKE_CORPUS = [
    "scenarios/methods/eagle-chunked-prefill-then-spec.yaml",
    "scenarios/regressions/preempt-and-recompute-under-pressure.yaml",
    "scenarios/regressions/prefix-caching-shared-prefix.yaml",
    "scenarios/specs/cross-attention-encoder-blocks-fixed.yaml",
    "scenarios/scheduler/sched-ngram.yaml",
    "scenarios/warmup/warmup-ngram-no-lookahead.yaml",
    "scenarios/engine/engine-eagle-k5-block16.yaml",
    "scenarios/startup/startup-override-exact-fit.yaml",
]


@pytest.fixture(scope="module")
def quick_results(vllm) -> dict[str, Any]:
    return run_bench(vllm, quick_options(scenarios=SMOKE_CORPUS))


def test_quick_bench_reports_every_figure(quick_results):
    for key in ("schema", "date", "machine", "corpus", "targets", *SKIPPABLE):
        assert key in quick_results, key
    for fact in ("cores", "usable_cores", "python", "vllm", "torch", "load_average"):
        assert quick_results["machine"][fact] is not None, fact
    json.dumps(quick_results)  # bench.json must be writable as it is
    for name in ("import_seconds", "suite_seconds", "xdist_speedup"):
        assert quick_results[name] == {"available": False, "reason": f"skipped (--skip {name})"}
    ratio = quick_results["step_overhead_ratio"]
    assert ratio["available"], ratio
    by_kind = quick_results["corpus"]["by_kind"]
    assert ratio["value"] > 0 and ratio["scenarios"] == by_kind["trajectory"]
    # Other kinds have no bare loop: listed as excluded, with the reason.
    assert len(ratio["excluded"]) == quick_results["corpus"]["scenarios"] - by_kind["trajectory"]
    assert set(quick_results["targets"]) >= {"step_overhead_ratio", "suite_seconds"}
    points = quick_results["scaling"]["points"]
    assert [(p["steps"], p["requests"]) for p in points] == [(3, 1), (5, 1), (4, 1), (4, 2)]
    for point in points:
        assert (
            point["allocate_slots"]["harness"] == point["allocate_slots"]["bare"] == point["calls"]
        )


def test_the_bare_loop_made_as_many_vllm_calls_as_the_harness(quick_results):
    calls = quick_results["step_overhead_ratio"]["calls"]
    assert calls["harness"]["allocate_slots"] == calls["bare"]["allocate_slots"] > 0
    assert calls["harness"]["predictor"] == calls["bare"]["predictor"] > 0
    # The harness also reads the block tables around finish/preempt (the sanity check).
    assert calls["harness"]["get_block_ids"] >= calls["bare"]["get_block_ids"] > 0


def test_every_registered_kind_and_the_fuzzer_are_measured(quick_results):
    fuzz = quick_results["fuzz_examples_per_second"]
    assert fuzz["available"] and fuzz["value"] > 0, fuzz
    kinds = quick_results["kinds"]
    cuda = torch.cuda.is_available()
    for kind in DRIVERS:  # the smoke corpus has a scenario of each kind
        if kind == "engine" and not cuda:  # skipped without CUDA, and the figure says why
            assert not kinds[kind]["available"], kinds[kind]
            assert "engine mode cannot run here" in kinds[kind]["reason"], kinds[kind]
            continue
        assert kinds[kind]["available"] and kinds[kind]["value"] > 0, kinds[kind]
        # startup scenarios have no steps (vLLM plans the pool once): timed per scenario
        assert (kinds[kind]["unit"] == "ms/scenario") == (kind == "startup"), kinds[kind]
        assert kind == "startup" or kinds[kind]["steps"] > 0, kinds[kind]
    checks = quick_results["checks"]
    assert set(checks) >= set(CHECKS) | {"slots"}
    for name in DEFAULT_CHECKS:
        assert checks[name]["available"] and checks[name]["judge_us_per_step"] >= 0, name
    for name, figure in checks.items():
        assert figure["available"] or figure["reason"], name
    if checks.get("slots", {}).get("available"):
        assert checks["slots"]["party_sample_scenarios"] == 1  # the slots party, on a sample


def _record_block_tables(vllm, monkeypatch) -> list[Any]:
    """Wrap the managers vLLM builds so that every get_block_ids answer is kept."""
    seen: list[Any] = []
    new_manager = vllm.new_manager

    def recording_manager(*args: Any, **kwargs: Any) -> Any:
        manager = new_manager(*args, **kwargs)
        get = manager.get_block_ids

        def get_block_ids(request_id: str) -> Any:
            seen.append((request_id, [list(ids) for ids in get(request_id)]))
            return seen[-1][1]

        manager.get_block_ids = get_block_ids
        return manager

    monkeypatch.setattr(vllm, "new_manager", recording_manager)
    return seen


def test_bare_loop_walks_the_harness_trajectory_call_for_call(vllm, monkeypatch):
    """Counted through our own wrapper, per scenario: same allocate_slots, same block tables.

    Over every trajectory scenario of the corpus, so a path of the live oracle that
    the bare loop lacks (or takes differently) shows up as a different table.
    """
    loaded = load_paths([ROOT / "scenarios"]).scenarios + [scaling.scenario(6, 3)]
    work = overhead.workload(loaded, vllm)
    assert work.scenarios, work.excluded
    # What the bare loop does not make: the connector / admission-gate arguments.
    assert "admission options" in work.excluded["connector-tokens-after-sliding-window-hit"]
    allocations: Counter[str] = Counter()
    allocate_slots = vllm.allocate_slots

    def counted(*args: Any, **kwargs: Any) -> Any:
        allocations["calls"] += 1
        return allocate_slots(*args, **kwargs)

    monkeypatch.setattr(vllm, "allocate_slots", counted)
    tables = _record_block_tables(vllm, monkeypatch)
    for scenario, plan in zip(work.scenarios, work.plans, strict=True):
        allocations.clear()
        result = run_scenario(scenario, vllm, checks=())
        harness_calls = allocations["calls"]
        allocations.clear()
        del tables[:]
        returned = bare.run_bare(plan, vllm)
        assert allocations["calls"] == returned == harness_calls > 0, scenario.id
        # The bare loop reads the block table once per allocating call; the harness
        # recorded the same tables in its observations (one per group).
        assert result.trajectory is not None
        groups = len(result.trajectory.groups)
        recorded = result.trajectory.observations
        harness_tables = [
            (recorded[i].request, [list(o.block_ids or ()) for o in recorded[i : i + groups]])
            for i in range(0, len(recorded), groups)
        ]
        assert tables == harness_tables, scenario.id


def test_scaling_points_are_legal_trajectories_of_the_asked_size(vllm):
    scenario = scaling.scenario(12, 4)
    assert len(scenario.steps) == 12 and len(scenario.requests) == 4
    result = run_scenario(scenario, vllm)
    assert result.verdict.value == "passed", result.headline()
    with pytest.raises(ValueError):
        scaling.scenario_text(2, 1)


def test_rows_go_into_the_results_table_and_nowhere_else(quick_results, tmp_path: Path):
    doc = tmp_path / "benchmarks.md"
    append_row(doc, quick_results)
    text = doc.read_text()
    assert text.count(RESULTS_HEADING) == 1 and text.rstrip().endswith("|")
    # Another helper adds a section after the table; rows still land in the table.
    doc.write_text(text + "\n## Profiles\n\nhand-written notes\n")
    append_row(doc, quick_results)
    lines = doc.read_text().splitlines()
    table = [i for i, line in enumerate(lines) if line.startswith("| 20")]
    assert len(table) == 2 and table[1] == table[0] + 1
    assert lines[-1] == "hand-written notes"
    assert "n/a" in lines[table[1]]  # the skipped subprocess figures
    write_json(quick_results, tmp_path / "build" / "bench.json")
    assert json.loads((tmp_path / "build" / "bench.json").read_text())["schema"]


def test_read_junit_splits_import_from_scenarios_per_worker(tmp_path: Path):
    # The shape the pytest plugin writes: every item of a worker carries its pid
    # and the loads of that process so far; the first item's time includes the load.
    junit = tmp_path / "junit.xml"
    junit.write_text(
        """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase name="a" time="12.5"><properties><property name="pid" value="11"/>
<property name="vllm_loads" value="12.00"/></properties></testcase>
<testcase name="b" time="0.5"><properties><property name="pid" value="11"/>
<property name="vllm_loads" value="12.00"/></properties></testcase>
<testcase name="c" time="14.0"><properties><property name="pid" value="12"/>
<property name="vllm_loads" value="13.50"/></properties></testcase>
</testsuite></testsuites>"""
    )
    workers = read_junit(junit)
    assert workers["11"]["items"] == 2 and workers["11"]["vllm_loads"] == [12.0]
    assert workers["11"]["scenario_seconds"] == pytest.approx(1.0)
    assert workers["12"]["scenario_seconds"] == pytest.approx(0.5)


def test_a_table_begun_before_a_column_was_added_gets_the_new_header(quick_results, tmp_path):
    doc = tmp_path / "benchmarks.md"
    append_row(doc, quick_results)
    lines = doc.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| date"))
    # The table as it was before the mutation campaign's column existed.
    lines[header] = lines[header].replace(" mutation campaign s (<= 1800) |", "")
    lines[header + 1] = lines[header + 1][: -len("---|")]
    doc.write_text("\n".join(lines) + "\n")
    append_row(doc, quick_results)
    lines = doc.read_text().splitlines()
    rows = [line for line in lines if line.startswith("| 20")]
    assert len(rows) == 2
    assert lines[header].count("|") == rows[1].count("|") == lines[header + 1].count("|")
    assert "mutation campaign s" in lines[header]


def test_the_mutation_campaign_figure_reads_its_own_report(tmp_path: Path):
    """A two-mutant campaign (_warmup_block_counter's, both equivalent) over one scenario:
    the figure is the subprocess's wall time with the report's own numbers."""
    targets = tmp_path / "targets.yaml"
    targets.write_text(
        "targets:\n  - module: vllm.v1.worker.gpu.warmup\n"
        "    function: _warmup_block_counter\n    why: the bench's smoke campaign\n"
    )
    figure = processes.mutation_campaign(
        ROOT, ["scenarios/warmup/warmup-no-speculation.yaml"], str(targets), jobs=1
    )
    assert figure["available"], figure
    assert figure["mutants"] == 2 and figure["jobs"] == 1 and figure["exit_status"] == 0
    assert figure["value"] >= figure["campaign_seconds"] > 0
    assert isinstance(figure["meets_target"], bool)
    missing = processes.mutation_campaign(ROOT, ["scenarios"], str(tmp_path / "none.yaml"))
    assert not missing["available"] and "without mutation.json" in missing["reason"]


def test_the_explorer_figures_are_measured(quick_results):
    rate = quick_results["explore_workloads_per_second"]
    assert rate["available"] and rate["value"] > 0 and rate["scheduler_steps"] > 0, rate
    ratio = quick_results["explore_step_ratio"]
    assert ratio["available"] and ratio["value"] > 0, ratio
    # The harness records a step where a request is scheduled; the bare loop counts every call.
    assert ratio["bare_steps"] >= ratio["harness_steps"] > 0, ratio


def test_the_explorers_bare_loop_makes_the_harness_schedule_calls(vllm):
    """On the plain workloads, the bare loop calls schedule() exactly as often as the
    scheduler oracle does on the same scenario (its StepRecords): the same steps."""
    from kvconform.bench import explorer
    from kvconform.oracles.resolve import resolve_settings
    from kvconform.oracles.scheduler import StepRecord, run_scheduler

    for scenario in explorer.drawn_workloads(vllm, 6, seed=1, plain=True):
        resolved, _ = resolve_settings(scenario, vllm)
        k = resolved.speculative.num_speculative_tokens if resolved.speculative else 0
        try:
            run = run_scheduler(vllm, resolved, k)
        except NotOffered:
            continue  # unsupported on this release (the explorer counts it as rejected)
        if run.stall is not None:
            continue  # stopped where the harness judged a stall
        steps = sum(1 for event in run.events if isinstance(event, StepRecord))
        assert explorer.bare_loop(vllm, scenario) == steps, scenario.name
