"""The engine against the real vLLM 0.33.0: holdings, lookahead sources, and errors kept in their scenario."""

from __future__ import annotations

import gc

from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict


def test_live_holdings_follow_the_allocator_contract(vllm, scenario_from):
    # docs/gpu.md: the H200 run measured 7, 7, 7, 8, 8, 8, 8 blocks at 100..124 tokens with lookahead 4;
    # the same trajectory through kvconform must record exactly that.
    scenario = scenario_from(
        """
        model: {max_model_len: 1024}
        speculative: {method: eagle, num_speculative_tokens: 4}
        requests: {a: {prompt_len: 100}}
        steps:
          - {a: {prefill: 100}}
          - {repeat: 6, step: {a: {spec: 4, accepted: 3}}}
        """
    )
    run = drive(scenario, vllm)
    assert run.lookahead == 4 and run.lookahead_source == "VllmConfig.num_lookahead_tokens"
    assert [o.computed for o in run.observations] == [0, 100, 104, 108, 112, 116, 120]
    # cdiv(computed + 5 scheduled + 4 lookahead, 16): 104->7, 109->7, 113->8, 117, 121, 125->8, 129->9
    assert [o.live for o in run.observations] == [7, 7, 8, 8, 8, 8, 9]
    assert [o.floor for o in run.observations] == [7, 7, 8, 8, 8, 8, 9]
    assert [o.predicted for o in run.observations] == [7, 7, 8, 8, 8, 8, 9]


def test_rejected_drafts_keep_their_blocks(vllm, scenario_from):
    scenario = scenario_from(
        """
        speculative: {method: eagle, num_speculative_tokens: 5}
        requests: {a: {prompt_len: 26}}
        steps:
          - {a: {prefill: 26}}
          - {a: {spec: 5, accepted: 0}}
          - {a: {spec: 5, accepted: 0}}
        """
    )
    run = drive(scenario, vllm)
    # 26 + 6 + 5 = 37 tokens -> 3 blocks; after the rollback 27 + 6 + 5 = 38 -> still 3.
    assert [(o.computed, o.live) for o in run.observations] == [(0, 2), (26, 3), (27, 3)]
    assert run_scenario(scenario, vllm).verdict is Verdict.PASSED


def test_lookahead_comes_from_vllm_unless_overridden(vllm, scenario_from):
    base = "requests: {a: {prompt_len: 10}}\nsteps: [{a: {prefill: 10}}]\n"
    dflash = drive(
        scenario_from("speculative: {method: dflash, num_speculative_tokens: 3}\n" + base), vllm
    )
    ngram = drive(
        scenario_from("speculative: {method: ngram, num_speculative_tokens: 3}\n" + base), vllm
    )
    mtp_alias = drive(
        scenario_from("speculative: {method: deepseek_mtp, num_speculative_tokens: 2}\n" + base),
        vllm,
    )
    override = drive(
        scenario_from(
            "speculative: {method: eagle, num_speculative_tokens: 3, num_lookahead_tokens: 7}\n"
            + base
        ),
        vllm,
    )
    assert (dflash.lookahead, ngram.lookahead, mtp_alias.lookahead) == (4, 0, 2)
    assert mtp_alias.method == "mtp"
    assert (override.lookahead, override.lookahead_source) == (7, "scenario override")
    assert override.vllm_lookahead == 3


def test_unknown_method_is_an_input_error_with_its_location(vllm, scenario_from):
    scenario = scenario_from(
        "speculative: {method: eagel, num_speculative_tokens: 3}\n"
        "requests: {a: {prompt_len: 10}}\nsteps: [{a: {prefill: 10}}]\n"
    )
    result = run_scenario(scenario, vllm)
    assert result.error_kind is ErrorKind.INPUT
    assert ":1: speculative.method: unknown speculative method 'eagel'" in result.error
    assert "eagle3" in result.error  # the message lists what vLLM declares


def test_a_spec_type_the_release_does_not_offer_is_unsupported_not_an_error(vllm, scenario_from):
    # KpoolTailSpec exists in vLLM 0.30-0.31 only; the installed 0.33.0 lacks it.
    scenario = scenario_from(
        "model: {groups: [{type: kpool_tail, sliding_window: 32}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.UNSUPPORTED and result.error_kind is ErrorKind.UNSUPPORTED
    assert result.error == f"vLLM {vllm.version} lacks vllm.v1.kv_cache_interface.KpoolTailSpec"
    other = run_scenario(
        scenario_from("requests: {a: {prompt_len: 8}}\nsteps: [{a: {prefill: 8}}]\n"), vllm
    )
    assert exit_status([result, other]) == 0  # counted apart, not against the release
    assert exit_status([result]) == 3  # nothing was exercised at all
    # An expectations entry neither excuses nor xpasses it: it did not run.
    from kvconform.harness.expectations import Expectation

    listed = run_scenario(scenario, vllm, expectations=[Expectation("*", "listed")])
    assert listed.verdict is Verdict.UNSUPPORTED and listed.expectation is None


def test_a_method_of_another_release_is_unsupported_an_unknown_one_bad_input(
    vllm, scenario_from, monkeypatch
):
    declared = tuple(m for m in vllm.declared_methods() if m != "dspark")
    monkeypatch.setattr(type(vllm), "declared_methods", lambda self: declared)
    text = "requests: {a: {prompt_len: 10}}\nsteps: [{a: {prefill: 10}}]\n"
    older = run_scenario(
        scenario_from("speculative: {method: dspark, num_speculative_tokens: 3}\n" + text), vllm
    )
    assert older.verdict is Verdict.UNSUPPORTED
    assert older.error.startswith(f"vLLM {vllm.version} lacks speculative method 'dspark': it")
    typo = run_scenario(
        scenario_from("speculative: {method: dsprak, num_speculative_tokens: 3}\n" + text), vllm
    )
    assert typo.error_kind is ErrorKind.INPUT


def test_a_dry_pool_is_a_scenario_error_not_a_crash(vllm, scenario_from):
    scenario = scenario_from(
        """
        model: {num_blocks: 4}
        requests: {a: {prompt_len: 100}}
        steps:
          - {a: {prefill: 100}}
        """
    )
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INPUT
    # By the floor's arithmetic the prompt needs 7 blocks (full-sequence admission, vLLM's
    # default, asks them at once); the pool has 3 usable.
    assert "prefill 100 of request 'a' needs 7 blocks for the whole sequence" in result.error
    assert "the pool of 4 blocks has 3 to give (the null block kept back)" in result.error
    assert ":4: steps[0].a" in result.error


def test_vllm_raising_on_a_valid_scenario_is_a_crash_naming_the_vllm_frame(vllm, scenario_from):
    scenario = scenario_from(
        "model: {groups: [{type: sink_full_attention, sink_len: 16}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    result = run_scenario(scenario, vllm)
    assert result.error_kind is ErrorKind.CRASH
    assert result.error.startswith(f"vLLM {vllm.version} raised TypeError")
    assert "at vllm/v1/core/" in result.error


def test_preemption_returns_every_block_and_recompute_reallocates(vllm, scenario_from):
    scenario = scenario_from(
        """
        model: {num_blocks: 20}
        speculative: {method: draft_model, num_speculative_tokens: 2}
        requests: {a: {prompt_len: 60}, b: {prompt_len: 60}}
        steps:
          - {a: {prefill: 60}, b: {prefill: 60}}
          - {a: preempt, b: {spec: 2}}
          - {a: {prefill: 61}}
          - {a: finish, b: finish}
        """
    )
    run = drive(scenario, vllm)
    preempt = run.events[0]
    assert preempt.kind == "preempt" and preempt.free_after - preempt.free_before == 4
    assert run.all_finished and run.final_free_blocks == 19
    assert run_scenario(scenario, vllm).verdict is Verdict.PASSED


def _result(verdict, kind=None) -> ScenarioResult:
    return ScenarioResult("x", "f.yaml", verdict, error_kind=kind)


def test_exit_status_precedence():
    assert exit_status([_result(Verdict.PASSED), _result(Verdict.XFAILED)]) == 0
    assert exit_status([_result(Verdict.PASSED), _result(Verdict.XPASSED)]) == 0
    assert exit_status([_result(Verdict.FAILED)]) == 1
    assert exit_status([_result(Verdict.ERROR, ErrorKind.CRASH)]) == 1
    assert exit_status([_result(Verdict.ERROR, ErrorKind.UNSUPPORTED)]) == 3
    assert (
        exit_status([_result(Verdict.FAILED), _result(Verdict.ERROR, ErrorKind.UNSUPPORTED)]) == 1
    )
    # A failure is 1 whatever input errors came with it (docs/cli.md, "Precedence").
    assert exit_status([_result(Verdict.FAILED)], input_errors=1) == 1
    assert exit_status([_result(Verdict.PASSED)], input_errors=1) == 2
    assert exit_status([_result(Verdict.ERROR, ErrorKind.INPUT)]) == 2
    unsupported = _result(Verdict.UNSUPPORTED, ErrorKind.UNSUPPORTED)
    assert exit_status([_result(Verdict.PASSED), unsupported]) == 0
    assert exit_status([_result(Verdict.FAILED), unsupported]) == 1
    assert exit_status([unsupported, unsupported]) == 3
    assert exit_status([unsupported], input_errors=1) == 2


def test_loading_vllm_takes_its_import_heap_out_of_the_collectors_scans(vllm):
    # Full collections rescanning vLLM's import cost a third of a corpus pass
    # (docs/benchmarks.md, item 6); load() freezes what the import left.
    assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
