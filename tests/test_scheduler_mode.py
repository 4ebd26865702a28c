"""Scheduler mode against the installed vLLM: its real Scheduler and AsyncScheduler.

Every test drives vLLM's own scheduler in-process (the session ``vllm``
fixture) and asserts on what it recorded: that the three ways of stepping
differ the way vLLM's engine does, that the scheduler's decisions (chunking,
preemption, prefix hits, the max_model_len cap) show up in the observations
and the reports, and that a stock vLLM raises no false alarm.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from kvconform.fronts.explain import explain
from kvconform.harness import runner
from kvconform.harness.expectations import load_expectations
from kvconform.harness.loader import load_file
from kvconform.model.floors import cdiv
from kvconform.model.observations import Observation
from kvconform.model.results import ErrorKind, RunReport, Verdict
from kvconform.reports import write_reports

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios" / "scheduler"

TWO_REQUESTS = """
name: two
kind: scheduler
model: {{block_size: 16, max_model_len: 1024, num_blocks: 64}}
speculative: {{method: eagle, num_speculative_tokens: 3}}
scheduler: {{mode: {mode}, max_num_seqs: 4, max_num_batched_tokens: 64}}
requests:
  a: {{prompt_len: 40, max_tokens: 20, accept: none}}
  b: {{prompt_len: 100, max_tokens: 12, arrival: 1, accept: {{rate: 0.5, seed: 3}}}}
"""


def _run(scenario_from, vllm, text):
    scenario = scenario_from(text)
    result = runner.run_scenario(scenario, vllm)
    return scenario, result


def _rows(result, group: int = 0) -> dict[str, list[Observation]]:
    rows: dict[str, list[Observation]] = defaultdict(list)
    assert result.trajectory is not None
    for obs in result.trajectory.observations:
        if obs.group == group:
            rows[obs.request].append(obs)
    return rows


@pytest.mark.parametrize("mode", ["sync", "async", "overlapped"])
def test_every_mode_conforms_and_holds_exactly_the_floor(scenario_from, vllm, mode):
    _, result = _run(scenario_from, vllm, TWO_REQUESTS.format(mode=mode))
    assert result.verdict is Verdict.PASSED, result.headline()
    run = result.trajectory
    assert run is not None and run.all_finished and run.lookahead == 3
    expected_class = "Scheduler" if mode == "sync" else "AsyncScheduler"
    assert run.lookahead_source == f"{expected_class}.num_lookahead_tokens"
    rows = _rows(result)
    assert set(rows) == {"a", "b"}
    for obs in rows["a"] + rows["b"]:
        # vLLM's allocator reserves computed + scheduled + lookahead; nothing less, and
        # on full attention nothing more at the step it allocates for.
        need = cdiv(min(obs.computed + obs.scheduled + 3, 1024), 16)
        assert obs.floor == need
        assert obs.live is not None and obs.live >= need
    # Blocks are never given back on rejection: holdings never shrink while running.
    for request_rows in rows.values():
        held = [o.live for o in request_rows]
        assert held == sorted(held)


def test_sync_and_overlapped_count_computed_tokens_differently(scenario_from, vllm):
    """Overlapped steps count the in-flight step as if all its drafts were accepted."""
    _, sync = _run(scenario_from, vllm, TWO_REQUESTS.format(mode="sync"))
    _, over = _run(scenario_from, vllm, TWO_REQUESTS.format(mode="overlapped"))
    # Request a rejects every draft: synchronously each verification advances by one
    # token (the sampled one), the rejected three rolled back before the next step.
    verify = [o for o in _rows(sync)["a"] if o.label.startswith("verify")]
    assert len(verify) > 3
    assert all(n.computed == o.computed + 1 for o, n in zip(verify, verify[1:], strict=False))
    # Overlapped, step N+1 is scheduled before N's rollback: it starts at N's
    # optimistic end, computed + 4, and the next one after the rollback of both.
    verify = [o for o in _rows(over)["a"] if o.label.startswith("verify")]
    steps = [n.computed - o.computed for o, n in zip(verify, verify[1:], strict=False)]
    assert 4 in steps, steps
    assert over.trajectory is not None
    notes = over.trajectory.step_notes
    assert any("1 in flight" in note for note in notes.values())
    assert not any("in flight" in note for note in sync.trajectory.step_notes.values())


def test_labels_show_chunking_and_acceptance(scenario_from, vllm):
    _, result = _run(scenario_from, vllm, TWO_REQUESTS.format(mode="sync"))
    labels = [o.label for o in _rows(result)["b"]]
    # 64-token budget, a's verification takes 4: b's prompt is chunked 60 + 40.
    assert labels[0] == "new, prefill 60/100"
    assert labels[1] == "prefill 40"
    assert all(label.startswith("verify 1+3 acc ") for label in labels[2:])
    assert result.trajectory is not None
    summary = result.trajectory.notes[-1]
    assert "Scheduler stepped synchronously" in summary and "chunked prefill b 60+40" in summary


def test_preemption_is_recorded_and_the_resumed_request_reserves_again(scenario_from, vllm):
    (scenario,) = load_file(SCENARIOS / "sched-pool-pressure.yaml")[:1]
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    run = result.trajectory
    assert run is not None
    preempts = [e for e in run.events if e.kind == "preempt"]
    assert preempts, "the pool is sized to force a preemption"
    victim = preempts[0].request
    assert all(not ids for ids in preempts[0].held_after)
    assert preempts[0].free_after - preempts[0].free_before == len(
        {b for ids in preempts[0].held for b in ids}
    )
    resumed = [o for o in _rows(result)[victim] if o.label.startswith("resumed")]
    # Recomputed from the start, less what prefix caching (vLLM's default) still holds.
    hit = re.search(r"hit (\d+)", resumed[0].label) if resumed else None
    assert resumed and resumed[0].computed == (int(hit.group(1)) if hit else 0)
    assert resumed[0].live == resumed[0].floor  # the lookahead is reserved again
    assert f"preempt {victim}" in run.step_notes[preempts[0].step]
    # After the run every block is back (sanity checks it; here, the numbers).
    assert run.final_free_blocks == scenario.model.num_blocks - 1


def test_prefix_cache_hits_are_adopted_at_admission(scenario_from, vllm):
    text = """
    kind: scheduler
    model: {max_model_len: 1024, num_blocks: 96, enable_caching: true}
    speculative: {method: dflash, num_speculative_tokens: 3}
    scheduler: {mode: sync, max_num_batched_tokens: 128}
    requests:
      a: {prompt_len: 100, max_tokens: 4}
      b: {prompt_len: 90, prefix_from: a, prefix_len: 64, max_tokens: 4, arrival: 2}
    """
    _, result = _run(scenario_from, vllm, text)
    assert result.verdict is Verdict.PASSED, result.headline()
    first_b = _rows(result)["b"][0]
    assert first_b.label == "new, hit 64, prefill 26"
    assert (first_b.computed, first_b.scheduled) == (64, 26)
    # DFlash's lookahead (k + 1 = 4) is reserved past the hit: cdiv(64 + 26 + 4, 16).
    assert first_b.live == first_b.floor == 6
    assert result.trajectory is not None and not result.trajectory.exclusive_blocks


def test_max_model_len_caps_scheduling_and_reservation(scenario_from, vllm):
    text = """
    kind: scheduler
    model: {max_model_len: 100, num_blocks: 32}
    speculative: {method: eagle, num_speculative_tokens: 3}
    scheduler: {mode: overlapped}
    requests:
      a: {prompt_len: 90, max_tokens: 100}
    """
    _, result = _run(scenario_from, vllm, text)
    assert result.verdict is Verdict.PASSED, result.headline()
    rows = _rows(result)["a"]
    assert all(o.computed + o.scheduled <= 99 for o in rows)
    capped = [o for o in rows if o.computed + o.scheduled + o.lookahead > 100]
    assert capped and all(o.floor == o.live == cdiv(100, 16) for o in capped)
    assert any(o.scheduled < 4 for o in rows[1:])  # drafts shrink near the end


@pytest.mark.parametrize("mode", ["sync", "overlapped"])
def test_no_speculation_reserves_no_lookahead(scenario_from, vllm, mode):
    text = f"""
    kind: scheduler
    model:
      num_blocks: 64
      groups: [full_attention, {{type: sliding_window, sliding_window: 32}}]
    scheduler: {{mode: {mode}, max_num_batched_tokens: 48}}
    requests:
      a: {{prompt_len: 70, max_tokens: 20}}
    """
    _, result = _run(scenario_from, vllm, text)
    assert result.verdict is Verdict.PASSED, result.headline()
    run = result.trajectory
    assert run is not None and run.lookahead == 0 and run.method is None
    for g in (0, 1):
        decode = [o for o in _rows(result, g)["a"] if o.label == "decode"]
        assert decode and all(o.live == cdiv(o.computed + 1, 16) for o in decode)


def test_runs_are_deterministic(scenario_from, vllm):
    text = TWO_REQUESTS.format(mode="overlapped")
    _, first = _run(scenario_from, vllm, text)
    _, second = _run(scenario_from, vllm, text)
    assert first.trajectory is not None and second.trajectory is not None
    strip = [o._replace(block_ids=None) for o in first.trajectory.observations]
    assert strip == [o._replace(block_ids=None) for o in second.trajectory.observations]


def test_a_pool_too_small_is_an_input_error(scenario_from, vllm):
    text = """
    kind: scheduler
    model: {num_blocks: 4}
    scheduler: {mode: sync}
    requests:
      a: {prompt_len: 200, max_tokens: 4}
    """
    _, result = _run(scenario_from, vllm, text)
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INPUT
    assert "model.num_blocks" in (result.error or "")
    assert "scheduled nothing" in (result.error or "")
    assert runner.exit_status([result]) == 2


def test_a_method_vllm_cannot_build_is_unsupported(scenario_from, vllm, monkeypatch):
    text = """
    kind: scheduler
    speculative: {method: suffix, num_speculative_tokens: 7}
    requests:
      a: {prompt_len: 20}
    """
    # Up to 0.33 vLLM's SpeculativeConfig raised here for suffix decoding without its
    # package (arctic_inference); 0.34 imports it later. The same refusal, put in vLLM's
    # config builder for this test, must still read as "not exercised", not as a finding.
    from kvconform.oracles.scheduler import config as scheduler_config
    from kvconform.oracles.vllm.scheduling import Scheduling

    def refuse(*args, **kwargs):
        raise ImportError("Arctic Inference is required for suffix decoding")

    monkeypatch.setattr(Scheduling, "model_speculative_config", refuse)
    monkeypatch.setattr(scheduler_config, "_CONFIGS", {})
    _, result = _run(scenario_from, vllm, text)
    # The machine, not the release (suffix decoding needs its own package): not exercised.
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.UNSUPPORTED
    assert "suffix" in (result.error or "") and vllm.version in (result.error or "")
    assert runner.exit_status([result]) == 3


def test_reports_and_explain_carry_the_decisions(scenario_from, vllm, tmp_path):
    scenario, result = _run(scenario_from, vllm, TWO_REQUESTS.format(mode="overlapped"))
    report = RunReport(
        results=[result],
        input_errors=[],
        vllm_version=vllm.version,
        vllm_source="installed",
        vllm_path=vllm.location,
    )
    written = write_reports(report, tmp_path)
    # Every writer copes with a scheduler trajectory (labels, step notes, no step lines).
    assert {"report.json", "junit.xml", "summary.md"} <= {p.name for p in written}
    entry = json.loads((tmp_path / "report.json").read_text())["scenarios"][0]
    assert entry["kind"] == "scheduler" and entry["verdict"] == "passed"
    assert any(n.startswith("scheduler: AsyncScheduler overlapped") for n in entry["notes"])
    text = explain(scenario, result, vllm.version)
    assert "new, prefill 60/100" in text and "^ 2 scheduled" in text and "in flight" in text


def test_the_scheduler_corpus_conforms(vllm):
    """The shipped scheduler scenarios pass on the installed vLLM (no false alarms), but for
    the known divergences scenarios/expectations.yaml lists, which must fail as listed."""
    scenarios = [s for path in sorted(SCENARIOS.glob("*.yaml")) for s in load_file(path)]
    assert len(scenarios) > 30
    modes = {s.scheduler.mode for s in scenarios if s.scheduler}
    assert modes == {"sync", "async", "overlapped"}
    known = load_expectations(SCENARIOS.parent / "expectations.yaml")
    results = list(runner.run_all(scenarios, vllm, expectations=known))
    # A scenario written for other releases (its vllm: field, e.g. the V1 runner's, which
    # 0.34.0 removed) is unsupported here by its own word; the release matrix runs it there.
    release = Version(Version(vllm.version).base_version)
    other = {
        s.id
        for s in scenarios
        if s.vllm_releases and not SpecifierSet(s.vllm_releases).contains(release)
    }
    bad = [
        f"{r.id}: {r.headline()}"
        for r in results
        if r.verdict not in (Verdict.PASSED, Verdict.XFAILED)
        and not (r.id in other and r.verdict is Verdict.UNSUPPORTED)
    ]
    assert not bad, "\n".join(bad)
    preempted = [
        r for r in results if r.trajectory and any(e.kind == "preempt" for e in r.trajectory.events)
    ]
    assert preempted, "the corpus must force at least one preemption"


def test_a_cold_vllm_cache_inspects_models_in_this_process(vllm, tmp_path, monkeypatch):
    """On a machine without CUDA, vLLM's model inspection starts no Python process of its
    own (seconds each on a fresh CI container), and vLLM still writes its cache file."""
    import importlib
    import subprocess

    import torch

    from kvconform.model.tiny_model import SCHEDULER_TARGET
    from kvconform.oracles.tiny_models import model_folder
    from kvconform.oracles.vllm.scheduling import Scheduling

    if torch.cuda.is_available():
        pytest.skip("with CUDA, vLLM's own subprocess inspection is left alone")
    registry = importlib.import_module("vllm.model_executor.models.registry")
    registry._try_inspect_model_cls.cache_clear()  # forget this process's answers
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    spawned: list[object] = []

    def no_process(*args, **kwargs):
        spawned.append(args)
        raise AssertionError("vLLM started a process to inspect a model")

    monkeypatch.setattr(subprocess, "run", no_process)
    config = vllm.part(Scheduling).model_config(str(model_folder(SCHEDULER_TARGET)), 256)
    assert config.architecture == "LlamaForCausalLM"
    assert not spawned
    cached = list((tmp_path / "modelinfos").glob("*.json"))
    assert cached, "vLLM wrote no model-info cache file"
    assert json.loads(cached[0].read_text())["hash"]


def test_a_failed_block_past_what_the_connector_loads_is_an_input_error(scenario_from, vllm):
    # Bounded replay makes vLLM's connector load one token short (_prefill_backoff): 48 of
    # 49 tokens, 6 blocks of 8 (the window's last two real). The loader bounds
    # remote_load_fails by the prompt's 7 blocks; block 6 is not in the load. The explorer drew it and kvconform's oracle
    # raised IndexError (an internal error); it is the scenario's error, with its field.
    text = """
    kind: scheduler
    model:
      block_size: 8
      max_model_len: 56
      num_blocks: 19
      groups: [{type: sliding_window_mla, sliding_window: 16, bounded_replay: true}]
    scheduler: {mode: sync, max_num_batched_tokens: 32}
    requests:
      a: {prompt_len: 49, max_tokens: 1, remote_prefill: true, remote_load_fails: FAILS}
    """
    _, result = _run(scenario_from, vllm, text.replace("FAILS", "6"))
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INPUT, (
        result.headline()
    )
    assert "requests.a.remote_load_fails: block 6 is past the 6 blocks" in str(result.error)
    _, result = _run(scenario_from, vllm, text.replace("FAILS", "5"))
    assert result.verdict is Verdict.PASSED, result.headline()


def test_a_failed_block_that_is_the_null_block_is_an_input_error(scenario_from, vllm):
    # A chunked group lays a whole-prompt load out for its end: the chunk before it is null,
    # and no KV is loaded there. Reporting the null block invalid made vLLM fail every
    # request whose table holds it (kvconform explore --seed 1: another request finished
    # with FINISHED_ERROR).
    text = """
    kind: scheduler
    model: {block_size: 16, max_model_len: 48, num_blocks: 9, groups: [{type: chunked_local, attention_chunk_size: 16}]}
    scheduler: {mode: sync}
    requests:
      c: {prompt_len: 20, max_tokens: 1, remote_prefill: true, remote_load_fails: FAILS}
    """
    _, result = _run(scenario_from, vllm, text.replace("FAILS", "0"))
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INPUT, (
        result.headline()
    )
    assert "requests.c.remote_load_fails: block 0 of the load of c is the null block" in str(
        result.error
    )
    _, result = _run(scenario_from, vllm, text.replace("FAILS", "1"))
    assert result.error_kind is not ErrorKind.INPUT, result.headline()


def test_chunked_local_attention_with_an_eagle_drafter_is_not_offered(scenario_from, vllm):
    # vLLM turns the hybrid KV-cache manager off for chunked local attention with a drafter
    # that reads the target's hidden states; built anyway, find_longest_cache_hit asserts
    # (kvconform explore --seed 1 reported the AssertionError as a crash).
    text = """
    kind: scheduler
    model: {block_size: 16, max_model_len: 48, num_blocks: 11, groups: [{type: chunked_local, attention_chunk_size: 16}]}
    speculative: {method: METHOD, num_speculative_tokens: 1}
    scheduler: {mode: sync}
    requests:
      a: {prompt_len: 20, max_tokens: 2}
    """
    _, result = _run(scenario_from, vllm, text.replace("METHOD", "eagle"))
    assert result.error_kind is ErrorKind.UNSUPPORTED, result.headline()
    assert "chunked local attention with eagle" in str(result.error)
    _, result = _run(scenario_from, vllm, text.replace("METHOD", "ngram"))
    assert result.verdict is Verdict.PASSED, result.headline()


def test_a_remote_prefill_loads_its_kv_asynchronously_without_lookahead(scenario_from, vllm):
    text = """
    kind: scheduler
    model: {block_size: 16, max_model_len: 512, num_blocks: 64}
    speculative: {method: eagle, num_speculative_tokens: 3}
    scheduler: {mode: sync, max_num_batched_tokens: 128}
    requests:
      a: {prompt_len: 64, max_tokens: 6, remote_prefill: 2}
      b: {prompt_len: 81, max_tokens: 6, remote_prefill: true, arrival: 1}
      c: {prompt_len: 40, max_tokens: 6}
    """
    _, result = _run(scenario_from, vllm, text)
    assert result.verdict is Verdict.PASSED, result.headline()
    run = result.trajectory
    assert run is not None and run.all_finished and run.final_free_blocks == 63
    rows = _rows(result)
    load_a, first_a = rows["a"][:2]
    # Admitted at step 0 into WAITING_FOR_REMOTE_KVS: blocks for the 64 loaded tokens,
    # cdiv(64, 16) = 4, and none for the lookahead (limit_lookahead_tokens).
    assert (load_a.step, load_a.label) == (0, "loading remote KV 64 (async)")
    assert (load_a.computed, load_a.scheduled, load_a.lookahead, load_a.live) == (64, 0, 0, 4)
    assert load_a.predicted is None
    # Received in the output of the second step, scheduled in the third with the prompt's
    # last token recomputed (63 computed), padded to 1 + k, and the lookahead reserved:
    # cdiv(63 + 4 + 3, 16) = 5.
    assert (first_a.step, first_a.label) == (2, "remote KV 63 loaded, verify 1+3 acc 3")
    assert (first_a.computed, first_a.scheduled, first_a.live) == (63, 4, 5)
    load_b = rows["b"][0]
    assert (load_b.step, load_b.computed, load_b.live) == (1, 81, 6)  # cdiv(81, 16)
    assert rows["b"][1].step == 2  # a one-step load: scheduled right after
    assert not any(r.label.startswith("loading") for r in rows["c"])
    assert {run.observations.index(load_a), run.observations.index(load_b)} == run.async_loads
    assert "remote KV loaded asynchronously a 64, b 81" in run.notes[-1]


def test_a_load_that_leaves_nothing_computed_is_looked_up_again_in_the_stats(vllm):
    """vLLM looks a request up whenever it takes it from the waiting queue with nothing
    computed (``Scheduler.schedule``): after a load of a 1-token prompt (whose one token it
    recomputes) or a failed load under ``kv_load_failure_policy`` recompute, the first
    schedule after the load is a lookup, counted in both prefix-cache stats; after a load
    that leaves tokens computed it is none. Without this in the recording, sanity blamed
    vLLM for the 1-token prompt's second lookup."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / "sched-remote-prefill-stats-lookup-again.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    stats = [fact.what for _, fact in facts_of(result.trajectory, StepStats)]
    # The loads (step 0's output), then the second lookups (step 1's): a's 1 token and
    # b's 40, with no hit; c is scheduled on its KV without one.
    first, second = stats[0], stats[1]
    assert [load[0] for load in first.loads] == ["a", "b", "c"]
    assert [(a[0], a[2], a[3]) for a in second.admissions] == [("a", 1, 0), ("b", 40, 0)]
    for kind in ("prefix_cache_stats", "connector_prefix_cache_stats"):
        assert (second.prefix[kind]["requests"], second.prefix[kind]["queries"]) == (2, 41)


def test_multi_module_mtp_hashes_cover_the_drafters_lookahead(vllm):
    """num_hash_lookahead_tokens = 3 for three MTP modules: a block's hash covers the 3
    tokens after it, so a prefix hit takes block 3 (tokens 48..63) only when tokens 64..66
    match too, and the trailing-block drop is off."""
    (scenario,) = load_file(SCENARIOS / "sched-mtp-hash-lookahead.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    rows = _rows(result)
    # b shares 67 tokens with a: blocks 0-3 and their 3 lookahead tokens match, a hit of 64
    # (the drop would leave 48); c shares 66, one short of block 3's lookahead: 48 (with a
    # lookahead hash of 1 token it would be 64).
    assert (rows["b"][0].label, rows["b"][0].computed) == ("new, hit 64, prefill 26", 64)
    assert (rows["c"][0].label, rows["c"][0].computed) == ("new, hit 48, prefill 32", 48)


def test_a_hit_other_than_the_stated_one_fails_sanity(scenario_from, vllm):
    text = """
    kind: scheduler
    model: {max_model_len: 1024, num_blocks: 96, enable_caching: true}
    scheduler: {mode: sync, max_num_batched_tokens: 128}
    requests:
      a: {prompt_len: 100, max_tokens: 4}
      b: {prompt_len: 90, prefix_from: a, prefix_len: 64, max_tokens: 4, arrival: 2, expect_hit: HIT}
    """
    # No speculation: legacy hashes and no trailing-block drop, so b adopts a's 4 full
    # shared blocks, 64 tokens.
    _, result = _run(scenario_from, vllm, text.replace("HIT", "64"))
    assert result.verdict is Verdict.PASSED, result.headline()
    _, result = _run(scenario_from, vllm, text.replace("HIT", "48"))
    assert result.verdict is Verdict.FAILED
    (failure,) = result.failures
    assert failure.check == "sanity" and failure.request == "b"
    assert "adopted a prefix-cache hit of 64 tokens at admission, but the scenario states 48" in (
        failure.message
    )


@pytest.mark.slow
def test_a_stated_kv_load_failure_leaves_vllms_error_log_out_of_the_console(tmp_path):
    # vLLM logs the failure the scenario asks for at ERROR ("Failing 1 request(s) due to KV
    # load failure"); the console is kvconform's: the verdict says what happened.
    from vllm_copy import REPO, run_kvconform

    done = run_kvconform(
        "run", REPO / "scenarios" / "scheduler" / "sched-remote-load-failure.yaml",
        "--report-dir", tmp_path / "report", "--progress", "off", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "due to KV load failure" not in done.stdout + done.stderr


def test_a_model_runner_the_release_removed_is_unsupported(vllm, tmp_path):
    """0.34.0 removed the V1 GPU model runner: a scheduler configured for it does not apply
    there (``unsupported``, saying why), whatever the scenario's own ``vllm:`` field says;
    a release that ships the runner builds it."""
    text = (SCENARIOS / "sched-model-runner-v1.yaml").read_text()
    path = tmp_path / "v1.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("vllm:")))
    (first, *_) = load_file(path)
    result = runner.run_scenario(first, vllm)
    if (Path(vllm.location) / "v1" / "worker" / "gpu_model_runner.py").exists():
        assert result.verdict is Verdict.PASSED, result.headline()
    else:
        assert result.verdict is Verdict.UNSUPPORTED, result.headline()
        assert "lacks the V1 GPU model runner: removed in 0.34.0" in result.error


def test_kv_cache_usage_counts_the_blocks_held_back_for_an_in_flight_step(vllm):
    """With overlapped batches and a kv_consumer connector vLLM defers a finished request's
    blocks until the output of the step in flight (``Scheduler.defer_block_free``): they are
    out of its table but still referenced, and ``kv_cache_usage`` counts them. c (3 blocks)
    finishes in step 1's output, applied after step 2 scheduled it: that output's stats
    count a's 4 blocks and c's 3. Without them in the recording, sanity blamed vLLM."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / "sched-remote-prefill-overlapped-stats.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    held = {fact.step: (fact.what.held, fact.what.pool) for _, fact in facts_of(
        result.trajectory, StepStats
    )}  # fmt: skip
    assert held[1] == (4 + 3, 11)


def test_a_block_back_from_the_pool_at_another_column_is_zeroed(vllm):
    """A sliding window's block that left the window (``remove_skipped_blocks`` nulls its
    column) and comes back from the pool in the same schedule() at another column is new
    there: on the zeroing list, rightly. Sanity blamed vLLM when it took any block held at
    the last step and still held for one with its KV written."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepZeroingList

    (scenario,) = load_file(SCENARIOS / "sched-sliding-window-reused-block-zeroed.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    null = result.trajectory.null_block
    lists = [fact.what for _, fact in facts_of(result.trajectory, StepZeroingList)]
    (window,) = lists[0].groups
    first, second = lists[0].tables["a"][window], lists[1].tables["a"][window]
    # Step 1 nulls column 0 and holds its old block at a later column, on the list.
    assert second[0] == null and first[0] in second[1:]
    assert first[0] in lists[1].listed


def test_a_loads_block_outside_the_window_is_zeroed(vllm):
    """An asynchronous load's block that holds only positions the next token does not read
    (a 1-token sliding window) is not the load's to write: vLLM's
    ``allocate_external_computed_blocks`` counts those tokens out and the block comes from
    ``allocate_new_blocks``, on the zeroing list, rightly. Sanity held every new block of a
    loading request valid and blamed vLLM (explore seed 0 on 0.34.0). The full-attention
    group's blocks under the loaded tokens stay off the list, and sanity still holds them
    valid."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepZeroingList
    from kvconform.model.zeroing import load_keeps_valid_kv

    (scenario,) = load_file(SCENARIOS / "sched-remote-load-window-skipped-block-zeroed.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    first = next(fact.what for _, fact in facts_of(result.trajectory, StepZeroingList))
    assert first.loading == {"a", "b"}
    full, window, _ = first.tables["b"]
    # b (1 token loaded): its window block is on the list, its full-attention block is not.
    assert window[0] in first.listed and full[0] not in first.listed
    assert first.valid_end == {"a": 16, "b": 1}
    assert not load_keeps_valid_kv(0, 16, 1, ("window", 1))
    assert load_keeps_valid_kv(0, 16, 1, None)


@pytest.mark.slow
def test_zeroing_a_loads_state_block_still_fails(tmp_path, pristine_tree):
    """The narrower rule still catches a vLLM that zeroes what a load writes: with
    ``skip_zeroing_group_ids`` ignored, the loads' full-attention blocks go on the list."""
    from vllm_copy import run_kvconform, tree_with_replacement

    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/core/kv_cache_coordinator.py",
        "record_for_zeroing=i not in skip_zeroing_group_ids,", "record_for_zeroing=True,",
    )  # fmt: skip
    path = SCENARIOS / "sched-remote-load-window-skipped-block-zeroed.yaml"
    done = run_kvconform("run", path, "--vllm-src", tree, "--report-dir", tmp_path / "r",
                         cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "hold KV that is valid before the step" in done.stdout, done.stdout


def test_a_same_step_hit_on_a_block_another_request_writes_is_zeroed(vllm):
    """b, beginning an asynchronous load, adopts as a prefix hit the full-attention block a
    gets new and computes in the same step (a's allocate_slots cached it): on the list, for
    a, rightly; b reads it only once its load lands, a step later. Sanity held every block
    under a loading request's computed tokens valid and blamed vLLM (explore seed 0 on
    0.34.0, example 378). What b's load writes stays off the list and valid."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepZeroingList

    (scenario,) = load_file(SCENARIOS / "sched-remote-load-same-step-hit-zeroed.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    first = next(fact.what for _, fact in facts_of(result.trajectory, StepZeroingList))
    assert first.loading == {"b"} and first.valid_end["b"] == 17
    (a_full, _), (b_full, b_mamba) = first.tables["a"], first.tables["b"]
    # b's column 0 is a's new block (the shared 16 tokens), its column 1 the loaded token's.
    assert b_full[0] == a_full[0] and a_full[0] in first.listed
    assert b_full[1] not in first.listed and b_mamba[1] not in first.listed


@pytest.mark.slow
def test_zeroing_a_loaded_block_beside_a_same_step_hit_still_fails(tmp_path, pristine_tree):
    """The exemption covers only blocks another request writes in the step: with
    ``skip_zeroing_group_ids`` ignored, b's loaded full-attention block goes on the list and
    fails, while the shared block a writes does not."""
    from vllm_copy import failure_messages, tree_with_replacement

    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/core/kv_cache_coordinator.py",
        "record_for_zeroing=i not in skip_zeroing_group_ids,", "record_for_zeroing=True,",
    )  # fmt: skip
    path = SCENARIOS / "sched-remote-load-same-step-hit-zeroed.yaml"
    messages = failure_messages(tree, path, tmp_path)
    assert any(
        m.startswith("step 0 ") and "request b: block(s) [3] hold KV that is valid" in m
        for m in messages
    ), messages


def test_a_loads_local_hit_is_the_one_shown_the_connector(vllm):
    """On a model of chunked local attention only, a remote prefill's local hit is null
    columns (``find_longest_cache_hit`` returns the chunks before the token's as null,
    cached or not), which vLLM's prefix-cache stats count as hits. The recording took a
    load's local hit from the cached blocks of group 0 and expected none (explore seed 0
    on 0.34.0); it now takes the hit the scheduler shows the connector."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / "sched-remote-prefill-chunked-local-stats-null-hit.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    loads = [load for _, fact in facts_of(result.trajectory, StepStats) for load in fact.what.loads]
    # f: 17 prompt tokens, a local hit of 16 (one chunk of null columns), 17 once loaded.
    assert loads == [("f", 17, 16, 17)]
    (stats,) = [fact.what for _, fact in facts_of(result.trajectory, StepStats) if fact.what.loads]
    assert stats.prefix["prefix_cache_stats"]["hits"] == 16
    assert stats.prefix["connector_prefix_cache_stats"]["hits"] == 1


def test_a_block_back_at_its_column_after_a_failed_load_is_zeroed(vllm):
    """A load that fails as a whole (``kv_load_failure_policy: recompute``) frees the
    request's blocks and allocates anew; a block landing at the column it held is new
    there, on the zeroing list, rightly. Sanity took it for one whose KV is kept (explore
    seed 0 on 0.34.0); the oracle now records the requests freed since the last list."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepZeroingList

    (scenario,) = load_file(SCENARIOS / "sched-remote-load-failed-same-block-zeroed.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    lists = [fact.what for _, fact in facts_of(result.trajectory, StepZeroingList)]
    first = lists[0]
    # The list of the step that allocates c again (its finish later frees it once more).
    (again,) = [what for what in lists if "c" in what.freed and "c" in what.tables]
    same = [
        block
        for group in again.groups
        for block, was in zip(again.tables["c"][group], first.tables["c"][group], strict=False)
        if block == was
    ]
    assert same and set(same) <= again.listed


def _admission_list(result, rid: str):
    """The zeroing list of the step that admits ``rid`` (the one judging its valid KV)."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepZeroingList

    assert result.trajectory is not None
    lists = [fact.what for _, fact in facts_of(result.trajectory, StepZeroingList)]
    return [what for what in lists if rid in what.valid_end][-1]


def test_a_replayed_hit_is_valid_up_to_its_end_except_in_the_group_that_replays(vllm):
    """SWA bounded replay: the scheduler counts a hit less its last window as computed
    (``Request.replay_start``). The groups that adopt the hit hold its KV past that count;
    the group that replays holds none below the replay start, so its new blocks are zeroed.
    Sanity took the computed count as the end of valid KV in every group and blamed vLLM
    both ways (explore seed 0 on 0.34.0, example 495: a preempted request resumed)."""
    (scenario,) = load_file(SCENARIOS / "sched-bounded-replay-hit-zeroing.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    assert [g.replay_tokens for g in result.trajectory.groups] == [0, 18, 0]
    what = _admission_list(result, "b")
    assert what.valid_end["b"] == 64 - 18  # the hit (4 blocks) less the window
    full, window, _ = what.tables["b"]
    null = result.trajectory.null_block
    # The full-attention hit's column 3 (positions 48..63) lies past the computed count
    # and is kept; the replaying group's column 2 (32..47) lies below it and is zeroed.
    assert full[3] not in what.listed and full[4] in what.listed
    assert window[:2] == (null, null) and set(window[2:]) <= what.listed

    (scenario,) = load_file(SCENARIOS / "sched-preempted-replay-window-block-zeroed.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    what = _admission_list(result, "c")
    assert what.valid_end["c"] == 32 - 18
    assert what.tables["c"][0][0] in what.listed


@pytest.mark.slow
def test_a_replaying_group_left_unzeroed_still_fails(tmp_path, pristine_tree):
    """The replay rule still catches a vLLM that stops zeroing the new blocks of the group
    that replays (its KV below the replay start is another request's)."""
    from vllm_copy import failure_messages, tree_with_replacement

    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", "v1/core/single_type_kv_cache_manager.py",
        "            if self._record_new_block_ids:\n"
        "                self.new_block_ids.extend(b.block_id for b in new_blocks)",
        "            if self._record_new_block_ids and not self.kv_cache_spec.prefix_replay_tokens:\n"
        "                self.new_block_ids.extend(b.block_id for b in new_blocks)",
    )  # fmt: skip
    path = SCENARIOS / "sched-preempted-replay-window-block-zeroed.yaml"
    messages = failure_messages(tree, path, tmp_path)
    # c's resumed admission: every new block of the group that replays, column 0 (below
    # the replay start, 14) included, which the rule before it held valid.
    assert any(
        m.startswith("step 3 ") and "request c: new block(s) [2, 1, 6] are not on" in m
        for m in messages
    ), messages


def test_a_replayed_hit_counts_whole_in_the_prefix_cache_stats(vllm):
    """vLLM's prefix-cache stats count the hit a lookup found (``record_prefix_cache_stats``
    at admission), the window that SWA bounded replay recomputes included. Sanity held
    them to the computed count, the hit less that window (explore seed 0 on 0.34.0)."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / "sched-bounded-replay-hit-stats.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    stats_facts = [fact.what for _, fact in facts_of(result.trajectory, StepStats)]
    (stats,) = [what for what in stats_facts if what.admissions and what.admissions[0][0] == "b"]
    assert stats.admissions == (("b", "new", 80, 64),)
    assert stats.prefix["prefix_cache_stats"]["hits"] == 64
    (b,) = [obs for obs in _rows(result)["b"] if obs.label.startswith("new")]
    assert b.computed == 64 - 18


def test_a_load_failed_at_a_block_is_held_to_the_loads_prediction(vllm):
    """A load that fails at a block under ``kv_load_failure_policy: recompute`` keeps the
    blocks it was given while its computed count is cut to the valid prefix: the live
    holdings are compared with the predictor's running maximum since the load began, as
    after rejected drafts. Agree compared them with the step's prediction alone (explore
    seed 0 on 0.34.0)."""
    (scenario,) = load_file(SCENARIOS / "sched-remote-load-failed-block-keeps-load-blocks.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    (load, recompute, decode) = _rows(result)["c"]
    assert load.label.startswith("loading remote KV 81")
    assert (recompute.computed, recompute.scheduled) == (16, 64)
    assert (recompute.live, recompute.predicted, recompute.predicted_max) == (6, 5, 6)
    assert decode.predicted_max == 6


def test_a_failed_loads_running_maximum_leaves_out_the_lookahead(vllm):
    """``Scheduler.schedule`` allocates an asynchronous load's slots without the drafter's
    lookahead (``effective_lookahead_tokens``), so the running maximum a failed load starts
    from is the predictor's count for the loaded tokens with no lookahead. With it (3 for
    31 + 2 tokens) agree blamed vLLM for holding the load's 2 blocks at the recompute
    (explore seed 0 on 0.34.0, 'agree / token-indexed / live below')."""
    path = SCENARIOS / "sched-remote-load-failed-block-drafter-lookahead.yaml"
    (scenario,) = load_file(path)
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    load, recompute, _ = _rows(result)["a"]
    assert load.label.startswith("loading remote KV 31") and load.live == cdiv(31, 16)
    assert (recompute.computed, recompute.scheduled, recompute.lookahead) == (16, 8, 2)
    # The load's blocks, the step's own prediction and the running maximum agree (the
    # count for the loaded tokens with the lookahead, cdiv(31 + 2, 16), is 3).
    assert recompute.live == recompute.predicted == recompute.predicted_max == 2


@pytest.mark.slow
def test_a_deferred_free_of_a_preemption_is_no_finish(tmp_path):
    """Releases before 0.30.0 preempt a request whose step is in flight under deferred
    frees: ``_preempt_request`` pops its blocks (``pop_blocks_for_free``) while its status
    is still RUNNING. The oracle took every deferred pop for a finish, and the scheduler
    bookkeeping family then blamed vLLM for keeping the preempted (live) requests in
    ``Scheduler.requests`` and ``Scheduler.waiting``. On 0.28.0 that failure is gone.

    The conservation family's failures from step 7 were kvconform's too: c's table holds
    the null block where its sliding window dropped blocks, ``pop_blocks_for_free`` hands
    it over as it is before 0.33.0 and the drain returns it, so the oracle, which left the
    null out of the popped side only, never matched c's drain and counted its blocks both
    free and deferred. What stays is vLLM's: the call that preempts all three and
    schedules nothing (docs/findings.md, vllm#49674)."""
    from vllm_copy import REPO, run_kvconform

    path = SCENARIOS / "sched-deferred-free-no-preemption.yaml"
    done = run_kvconform("run", path, "--vllm-release", "0.28.0", "--checks", "all",
                         "--no-expectations", "--report-dir", tmp_path / "r", cwd=REPO)  # fmt: skip
    (result,) = json.loads((tmp_path / "r" / "report.json").read_text())["scenarios"]
    messages = [failure["message"] for failure in result["failures"]]
    assert done.returncode == 1 and messages, done.stdout[-2000:]
    assert not [m for m in messages if "still holds ended request" in m], messages
    # The one failure left is the call that schedules nothing (the liveness family);
    # every deferred free is matched to its drain, so the pool adds up at every step.
    assert len(messages) == 1 and "scheduled nothing" in messages[0], messages
    assert messages[0].startswith("step 6 ") and "requests c, e, d," in messages[0], messages
    # The preemptions happened, deferred (vLLM 0.28.0 preempts c, d and e at step 6), and
    # the requests are taken up again as resumed ones, not as ended.
    shown = run_kvconform("explain", f"{path}::{path.stem}", "--vllm-release", "0.28.0", cwd=REPO)
    assert re.search(r"^ +7 +\d+ c +resumed", shown.stdout, re.M), shown.stdout[-3000:]


def test_a_dropped_replay_hit_still_counts_in_the_connectors_queries(vllm):
    """A hit no longer than the bounded-replay window is dropped after the KV connector was
    asked past it: ``connector_prefix_cache_stats`` count the queries past the hit found,
    ``prefix_cache_stats`` no hit. Sanity held the connector's queries to the adopted hit
    (explore seed 0 on 0.34.0)."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / "sched-bounded-replay-dropped-hit-connector-stats.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    (stats,) = [
        fact.what
        for _, fact in facts_of(result.trajectory, StepStats)
        if any(request == "d" for request, *_ in fact.what.admissions)
    ]
    assert stats.admissions == (("d", "new", 9, 0),)
    assert stats.connector_local == {"d": 8}
    assert stats.prefix["connector_prefix_cache_stats"]["queries"] == 1
    assert stats.prefix["prefix_cache_stats"]["queries"] == 9


@pytest.mark.slow
def test_vllms_cpu_platform_does_not_change_the_stated_scheduling(tmp_path):
    """On a GPU host kvconform runs vLLM's Python tree under ``VLLM_TARGET_DEVICE=cpu``, so
    vLLM picks its CPU platform, whose ``check_and_update_config`` turns asynchronous
    scheduling off for a CPU worker. The scheduler oracle still runs what the scenario
    states: the corpus's MTP trim scenario, asynchronous and overlapped, chunks its second
    request 50+3 as stated (49+4 when the platform's hook had its way, as it did on a GPU
    host). A process of its own: vLLM picks its platform once, at first use."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    run = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", "--report-dir", str(tmp_path),
         str(root / "scenarios/scheduler/sched-mtp-prefill-lookahead-trim.yaml")],
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
        capture_output=True, text=True, cwd=root, check=False,
    )  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    verdicts = {r["id"]: r["verdict"] for r in report["scenarios"]}
    assert run.returncode == 0, (verdicts, run.stdout[-2000:])
    assert len(verdicts) == 3 and set(verdicts.values()) == {"passed"}


@pytest.mark.parametrize(
    ("name", "check"),
    [
        # docs/findings.md #24 (a waiting request never admitted) and #26 (a running prefill
        # cut to nothing, a waiting one behind it): written for sync mode.
        ("sched-mm-input-past-request-budget-shift", "capacity"),
        ("sched-mtp-prefill-lookahead-past-threshold", "capacity"),
    ],
)
def test_an_overlapped_stall_is_judged_not_run_into_max_steps(scenario_from, vllm, name, check):
    """Overlapped mode keeps every step in flight, the empty ones too: a step in flight
    that scheduled nothing changes no request, so the calls around it are still idle and
    the stall is seen (it used to end at max_steps, a bad-input error, exit 2)."""
    text = (SCENARIOS / f"{name}.yaml").read_text()
    assert "\n  mode: sync\n" in text
    overlapped = text.replace("\n  mode: sync\n", "\n  mode: overlapped\n")
    _, result = _run(scenario_from, vllm, overlapped)
    assert result.verdict is Verdict.FAILED, result.headline()
    # (#26's running prefill is also the liveness family's, check sanity.)
    assert check in {failure.check for failure in result.failures}


def test_a_failed_load_rewound_by_bounded_replay_is_looked_up_again(vllm):
    """A failed KV load keeps its valid prefix, which ``_update_waiting_for_remote_kv`` then
    rewinds by the SWA bounded-replay window (a failed load may have lost the window): a
    prefix no longer than the window leaves nothing computed, and ``schedule()`` looks the
    request up afresh, counted in ``connector_prefix_cache_stats``. Sanity read the prefix
    before the rewind and blamed vLLM for c's second lookup (explore seed 13 on 0.33.0)."""
    stats = _admission_stats(vllm, "sched-bounded-replay-failed-load-stats-lookup-again", "c")
    assert [(a[0], a[2], a[3]) for a in stats.admissions] == [("c", 18, 0)]
    assert stats.prefix["connector_prefix_cache_stats"]["queries"] == 18


def _admission_stats(vllm, name: str, request: str):
    """The recorded stats of the step that admitted ``request`` in scenario ``name`` (it must
    pass)."""
    from kvconform.harness.checks.records import facts_of
    from kvconform.model.facts import StepStats

    (scenario,) = load_file(SCENARIOS / f"{name}.yaml")
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    (stats,) = [
        fact.what
        for _, fact in facts_of(result.trajectory, StepStats)
        if any(admitted == request for admitted, *_ in fact.what.admissions)
    ]
    return stats


def test_a_relookup_after_a_failed_load_counts_the_hit_before_the_replay(vllm):
    """A request looked up again after its failed KV load counts the hit its lookup found,
    as any admission does (``record_prefix_cache_stats``), not the computed count SWA
    bounded replay rewinds it to; the connector's queries are past that hit. Sanity counted
    the rewound hit and blamed vLLM (explore seed 11 on 0.34.0)."""
    stats = _admission_stats(vllm, "sched-bounded-replay-relookup-stats-count-the-hit-found", "b")
    assert [(a[0], a[2], a[3]) for a in stats.admissions] == [("b", 18, 16)]
    assert stats.prefix["prefix_cache_stats"]["hits"] == 16
    assert stats.prefix["connector_prefix_cache_stats"]["queries"] == 2
