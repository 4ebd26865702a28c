"""The recorded warmup: vLLM's real warmup_kernels as a third party, on the installed vLLM."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvconform.fronts import cli
from kvconform.harness.expectations import load_expectations
from kvconform.harness.loader import load_paths
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.model.floors import cdiv
from kvconform.model.kind_specs import WarmupPass
from kvconform.model.results import ErrorKind, Verdict
from kvconform.oracles.vllm import warmup_stubs
from kvconform.oracles.vllm.warmup_stubs import (
    STUB_FAMILIES,
    RunnerSettings,
    StubModelRunner,
    StubModelRunner027,
    StubModelRunner028,
    StubModelRunner029,
    StubModelRunner030,
    StubModelRunner032,
    StubModelRunner033,
    StubModelRunner034,
    stub_family,
)
from kvconform.oracles.warmup import SchedulerOutputRecorder, WarmupRecording, record_warmup

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "scenarios" / "warmup"

EAGLE = """
name: eagle-warmup
kind: warmup
model: {block_size: 16, max_model_len: 2048, num_blocks: 512}
speculative: {method: eagle, num_speculative_tokens: 3}
warmup: {max_num_seqs: 4, max_num_batched_tokens: 512, mixed_num_tokens: 64}
"""


def _settings(vllm, *, k: int = 3, speculative: bool = True, num_blocks: int = 512):
    spec = vllm.build_spec("full_attention", 16, {})
    return RunnerSettings(
        kv_cache_config=vllm.kv_cache_config(num_blocks, [spec]),
        num_speculative_tokens=k if speculative else 0,
        num_lookahead_tokens=k if speculative else 0,
        speculative_config=vllm.speculative_config("eagle", k) if speculative else None,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        max_model_len=2048,
        max_encoder_len=0,
        is_encoder_decoder=False,
        # 0.34's warmup reads the parallel config's DCP size, as the scenarios' settings give it.
        parallel_config=vllm.predictor_vllm_config(1).parallel_config,
    )


def test_warmup_is_a_third_party_that_agrees_with_live_and_predicted(vllm, scenario_from):
    result = run_scenario(scenario_from(EAGLE), vllm)
    assert result.verdict is Verdict.PASSED, result.failures
    run = result.trajectory
    assert run.parties == ("live", "predicted", "warmup")
    obs = run.observations
    assert obs and all(o.warmup is not None and o.live is not None for o in obs)
    assert all(o.warmup == o.live == o.predicted_max for o in obs)
    assert all(o.warmup >= o.floor for o in obs)
    # The scenario exercises what the bug was about: a step whose token range
    # fits in fewer blocks than the range plus the lookahead.
    assert any(cdiv(o.computed + o.scheduled, 16) < o.floor for o in obs)
    entry_points = {o.label.split(" #")[0] for o in obs}
    assert entry_points == {"warmup_kernels", "run_mixed_prefill_decode_warmup"}
    # Every warmup request finished and the live pool got every block back.
    assert run.all_finished and run.final_free_blocks == 511
    assert run.events and all(e.kind == "finish" for e in run.events)


def test_speculation_adds_vllm_033s_greedy_pass(vllm):
    if stub_family(vllm.version) is not StubModelRunner033:
        pytest.skip("the greedy second pass is vLLM 0.33's")
    with_spec = record_warmup(vllm, _settings(vllm), ["warmup_kernels"], 64)
    without = record_warmup(vllm, _settings(vllm, speculative=False), ["warmup_kernels"], 64)
    # Without speculation: prefill, 3 decode steps, cleanup. With it: prefill, 5
    # decode steps (spec and non-spec batch shapes), cleanup, twice (docs/gpu.md: 14
    # on the H200 too).
    assert len(without.steps) == 5
    assert len(with_spec.steps) == 14
    # Each pass prefills the batch of 4 requests (max_num_seqs); the second one greedily.
    assert with_spec.passes == [WarmupPass(4, "random"), WarmupPass(4, "greedy")]
    assert without.passes == [WarmupPass(4, "random")]
    assert any(call.num_draft_tokens == 3 for step in with_spec.steps for call in step.calls)


def test_recorder_rebuilds_block_tables_from_scheduler_outputs():
    recording = WarmupRecording()
    recorder = SchedulerOutputRecorder(recording, is_encoder_decoder=True)
    recorder.entry_point = "warmup_kernels"
    feature = SimpleNamespace(mm_position=SimpleNamespace(length=40))
    empty_cached = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[])
    recorder.execute_model(
        SimpleNamespace(
            finished_req_ids=set(),
            scheduled_spec_decode_tokens={},
            scheduled_new_reqs=[
                SimpleNamespace(
                    req_id="a",
                    block_ids=([1, 2], [3]),
                    prompt_token_ids=list(range(20)),
                    mm_features=[feature],
                    num_computed_tokens=0,
                    sampling_params=SimpleNamespace(sampling_type=SimpleNamespace(name="GREEDY")),
                )
            ],
            scheduled_cached_reqs=empty_cached,
            num_scheduled_tokens={"a": 20},
        )
    )
    for new_blocks, computed in ((([4], []), 20), (None, 24)):
        recorder.execute_model(
            SimpleNamespace(
                finished_req_ids=set(),
                scheduled_spec_decode_tokens={"a": [0, 0, 0]},
                scheduled_new_reqs=[],
                scheduled_cached_reqs=SimpleNamespace(
                    req_ids=["a"], new_block_ids=[new_blocks], num_computed_tokens=[computed]
                ),
                num_scheduled_tokens={"a": 4},
            )
        )
    recorder.execute_model(
        SimpleNamespace(
            finished_req_ids={"a"},
            scheduled_spec_decode_tokens=None,
            scheduled_new_reqs=[],
            scheduled_cached_reqs=empty_cached,
            num_scheduled_tokens={},
        )
    )
    calls = [step.calls for step in recording.steps]
    assert [len(c) for c in calls] == [1, 1, 1, 0]
    first, second, third = calls[0][0], calls[1][0], calls[2][0]
    assert first.held == ((1, 2), (3,)) and first.new and first.label == "prefill 20"
    assert first.encoder_len == 40 and first.prompt_len == 20
    assert second.held == ((1, 2, 4), (3,)) and (second.computed, second.scheduled) == (20, 4)
    assert second.label == "spec 3" and not second.new
    assert third.held == second.held and third.computed == 24  # None: nothing new
    assert recording.steps[3].finished == ("a",)
    assert [s.number for s in recording.steps] == [1, 2, 3, 4]
    # One pass: the step that entered "a", greedily.
    assert recording.passes == [WarmupPass(1, "greedy")]


def test_on_cpu_warmup_runs_without_its_final_synchronize_and_says_so(vllm):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on CUDA the warmup runs unchanged")
    original = torch.accelerator.synchronize
    recording = record_warmup(vllm, _settings(vllm), ["warmup_kernels"], 64)
    assert recording.steps
    assert any("without its torch.accelerator.synchronize()" in n for n in recording.notes)
    # Patched for the duration of the call only.
    assert torch.accelerator.synchronize is original


@pytest.mark.cuda
def test_on_cuda_warmup_runs_unchanged(vllm):
    recording = record_warmup(vllm, _settings(vllm), ["warmup_kernels"], 64)
    assert recording.steps
    assert not any("synchronize" in note for note in recording.notes)


def test_cli_run_notes_the_cpu_warmup_in_the_report(write_scenario, tmp_path):
    import json

    import torch

    if torch.cuda.is_available():
        pytest.skip("on CUDA the warmup runs unchanged")
    path = write_scenario(EAGLE)
    status = cli.main(["run", str(path), "--report-dir", str(tmp_path / "report")])
    assert status == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert any("synchronize" in note for note in report["notes"])
    (scenario,) = report["scenarios"]
    assert scenario["parties"] == ["live", "predicted", "warmup"]


class _StubLackingDecodeQueryLen(StubModelRunner033):
    """Stands in for GPUModelRunner attributes, minus one the warmup reads (a test stub)."""

    def _attributes(self, s, misses):
        attributes = super()._attributes(s, misses)
        del attributes["decode_query_len"]
        return attributes


def test_a_stub_lacking_an_attribute_names_the_version_and_the_attribute(
    vllm, scenario_from, monkeypatch, write_scenario, tmp_path
):
    monkeypatch.setattr(warmup_stubs, "stub_family", lambda version: _StubLackingDecodeQueryLen)
    result = run_scenario(scenario_from(EAGLE), vllm)
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.UNSUPPORTED
    assert f"vLLM {vllm.version}" in result.error
    assert "GPUModelRunner.decode_query_len" in result.error
    assert exit_status([result]) == 3
    path = write_scenario(EAGLE)
    assert cli.main(["run", str(path), "--report-dir", str(tmp_path / "report")]) == 3


@pytest.mark.parametrize(
    ("version", "stub"),
    [
        ("0.25.0", StubModelRunner),
        ("0.26.0", StubModelRunner),
        ("0.27.1", StubModelRunner027),
        ("0.28.0", StubModelRunner028),
        ("0.29.0", StubModelRunner029),
        ("0.31.0", StubModelRunner030),
        ("0.32.0", StubModelRunner032),
        ("0.33.0", StubModelRunner033),
        ("0.34.0", StubModelRunner034),
        ("0.34.0.dev12+g0123abc", StubModelRunner034),
        ("0.35.0.dev3+g0123abc", StubModelRunner034),
        ("unknown", StubModelRunner034),
        ("0.24.0", None),
    ],
)
def test_each_release_family_has_its_stub(version, stub):
    assert stub_family(version) is stub


def test_the_034_stub_holds_what_vllms_runner_holds(vllm):
    parallel = vllm.predictor_vllm_config(2).parallel_config
    settings = replace(_settings(vllm, num_blocks=40), parallel_config=parallel)
    runner = StubModelRunner034(settings)
    # GPUModelRunner.__init__: max_num_tokens = scheduler_config.max_num_batched_tokens.
    assert runner.max_num_tokens == 512
    assert runner.vllm_config.parallel_config.decode_context_parallel_size == 2
    assert runner.speculator.reset_state() is None
    assert runner.speculator.acceptance_estimator is None
    assert StubModelRunner034(replace(settings, speculative_config=None)).speculator is None
    # The extensible KV cache: the null block committed at first, grown on demand.
    cache = runner.extensible_kv_cache
    assert (cache.capacity_blocks, cache.warmup_committable_blocks) == (40, 40)
    assert runner.committed_blocks() == 1
    cache.commit(9)
    cache.commit(5)  # grow-only
    assert runner.committed_blocks() == 9
    cache.commit(100)  # capped at the capacity, as ExtensibleKVCache.commit caps it
    assert runner.committed_blocks() == 40
    cache.commit(1, shrink=True)  # gpu_worker shrinks it between its warmups
    assert runner.committed_blocks() == 1 and cache.commits == [9, 5, 100, 1]
    assert not runner.stub_misses
    assert StubModelRunner033(settings).committed_blocks() is None  # every block, from the start


def test_every_stub_says_what_it_stands_in_for():
    for _, stub in STUB_FAMILIES:
        assert "Stands in for the ``GPUModelRunner`` attributes" in (stub.__doc__ or "")


def test_warmup_corpus_conforms_with_its_known_divergences(vllm):
    loaded = load_paths([CORPUS])
    assert not loaded.errors
    assert {s.kind for s in loaded.scenarios} == {"warmup"}
    expectations = load_expectations(REPO / "scenarios" / "expectations.yaml")
    results = {s.id: run_scenario(s, vllm, expectations=expectations) for s in loaded.scenarios}
    bad = {
        i: r.headline() for i, r in results.items() if r.verdict in (Verdict.FAILED, Verdict.ERROR)
    }
    assert not bad
    xfailed = [i for i, r in results.items() if r.verdict is Verdict.XFAILED]
    # The mixed warmup's cross-attention over-reservation (#3) and warmup_kernels' crash
    # under a budget that fits no request (#21).
    assert sorted(xfailed) == ["warmup-budget-below-one-request", "warmup-encoder-decoder-mixed"]


def test_mixed_warmup_over_reserves_cross_attention(vllm):
    """DESIGN's suspicion, confirmed: the mixed warmup's requests carry no encoder
    input, so the scheduler holds no cross-attention blocks; the warmup holds
    cdiv(max_encoder_len, block_size) = 13. A disagreement, never a shortfall."""
    (scenario,) = load_paths([CORPUS / "warmup-encoder-decoder-mixed.yaml"]).scenarios
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.FAILED
    assert {(f.check, f.group) for f in result.failures} == {("agree", 1)}
    cross = [o for o in result.trajectory.observations if o.group == 1]
    assert cross and all((o.live, o.warmup, o.floor) == (0, 13, 0) for o in cross)


def test_a_pooling_model_without_kv_cache_warms_one_batch_uncapped(vllm):
    """Encoder-only pooling models keep no KV cache: no groups, no block, no pool cap."""
    settings = replace(
        _settings(vllm, speculative=False, num_blocks=2),
        kv_cache_config=vllm.kv_cache_config(2, []),
        is_pooling_model=True,
    )
    recording = record_warmup(vllm, settings, ["warmup_kernels"], 64)
    # One prefill of max_num_seqs requests with pooling parameters, then the cleanup;
    # a pool of 2 blocks would cap a model with KV cache at 1 request.
    assert recording.passes == [WarmupPass(4, "none")]
    prefill, cleanup = recording.steps
    assert all(call.held == () and call.scheduled == 2 for call in prefill.calls)
    assert not cleanup.calls and len(cleanup.finished) == 4


def test_redirected_writes_lift_the_pool_cap(vllm):
    if not stub_family(vllm.version).REDIRECTS_WRITES:
        pytest.skip("BlockTables.redirect_writes_to_null_block is vLLM 0.32's")
    # EAGLE k 2: 2 blocks a request at worst, so 12 blocks cap the warmup at 5 requests.
    capped = replace(_settings(vllm, k=2, num_blocks=12), max_num_seqs=8)
    redirected = replace(capped, redirect_writes_to_null_block=True)
    assert record_warmup(vllm, capped, ["warmup_kernels"], 64).passes[0] == WarmupPass(5, "random")
    assert record_warmup(vllm, redirected, ["warmup_kernels"], 64).passes[0] == WarmupPass(
        8, "random"
    )


def test_redirected_writes_do_not_apply_before_vllm_032(vllm, scenario_from, monkeypatch):
    monkeypatch.setattr(warmup_stubs, "stub_family", lambda version: StubModelRunner030)
    redirected = EAGLE.replace("warmup: {", "warmup: {redirect_writes_to_null_block: true, ")
    scenario = scenario_from(redirected)
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.UNSUPPORTED, result  # does not apply: no failure
    assert "BlockTables.redirect_writes_to_null_block" in result.error
