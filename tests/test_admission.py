"""Admissions: what a first chunk says the scheduler passes, and what it states vLLM does.

The loader's rules for ``external``, ``load_async``, ``reserved_blocks``,
``full_sequence_must_fit``, ``expect_hit``, ``model.watermark`` and
``model.max_in_flight_tokens`` (each bad input one message with file, line and
field), and the ``sanity`` check's stated hits: a hit vLLM does not give is a
failure, on the real ``KVCacheManager``; so is a refusal (``refused``) the
watermark should make and does not.
"""

from __future__ import annotations

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.checks import CHECKS
from kvconform.harness.loader import load_file
from kvconform.harness.runner import run_scenario
from kvconform.model.facts import AdmissionHit, Fact
from kvconform.model.observations import Trajectory
from kvconform.model.results import Verdict

SHARED = """\
model: {block_size: 16, num_blocks: 32, enable_caching: true}
requests:
  a: {prompt_len: 100}
  b: {prompt_len: 100, prefix_from: a, prefix_len: 64}
steps:
  - {a: {prefill: 64}}
  - {b: {prefill: 80, expect_hit: HIT}}
"""


def test_admission_fields_reach_the_call(scenario_from):
    scenario = scenario_from(
        """\
        model: {watermark: 0.25}
        requests: {a: {prompt_len: 100}, b: {prompt_len: 100}}
        steps:
          - {a: {prefill: 80, external: 32, full_sequence_must_fit: true, expect_hit: 0}}
          - {b: {prefill: 64, external: 64, load_async: true, reserved_blocks: 2}}
          - {b: {prefill: 36}}
        """
    )
    assert scenario.model.watermark == 0.25
    a, b, b_after = (step.calls[0] for step in scenario.steps)
    assert (a.options.external, a.options.full_sequence_must_fit, a.options.expect_hit) == (
        32,
        True,
        0,
    )
    assert (a.computed, a.scheduled, a.sampled) == (0, 80, 0)
    assert (b.options.external, b.options.load_async, b.options.reserved_blocks, b.sampled) == (
        64,
        True,
        2,
        0,
    )
    # After the load the request computes the rest of its prompt and samples.
    assert (b_after.computed, b_after.scheduled, b_after.sampled) == (64, 36, 1)
    assert not b_after.first_chunk and b_after.options.external == 0


def test_a_connector_admission_leaves_the_external_tokens_to_vllm(scenario_from):
    # With a connector the scheduler derives the external tokens (and may trim the hit),
    # so the loader does not count them: an asynchronous load needs none stated.
    scenario = scenario_from(
        """\
        requests: {a: {prompt_len: 100}}
        steps:
          - {a: {prefill: 96, connector: 96, load_async: true, expect_hit: 0}}
          - {a: {prefill: 4}}
        """
    )
    load, rest = (step.calls[0] for step in scenario.steps)
    assert (load.options.connector, load.options.external, load.sampled) == (96, 0, 0)
    assert (rest.computed, rest.scheduled, rest.sampled) == (96, 4, 1)


def test_a_refused_admission_leaves_the_request_waiting(scenario_from):
    scenario = scenario_from(
        """\
        requests: {a: {prompt_len: 40}}
        steps:
          - {a: {refused: {prefill: 40, full_sequence_must_fit: true}}}
          - {a: {prefill: 40}}
        """
    )
    refused, admitted = (step.calls[0] for step in scenario.steps)
    assert refused.refused and refused.first_chunk and refused.sampled == 0
    assert refused.options.full_sequence_must_fit  # the fields inside `refused` reach the call
    assert admitted.first_chunk and admitted.computed == 0 and admitted.sampled == 1


@pytest.mark.parametrize(
    ("steps", "line", "field", "words"),
    [
        ("  - {a: {prefill: 40}}\n  - {a: {prefill: 10, external: 4}}\n", 4, "steps[1].a",
         "already running"),
        ("  - {a: {prefill: 40, external: 40}}\n", 3, "steps[0].a", "at least one token"),
        ("  - {a: {prefill: 30, external: 20, expect_hit: 10}}\n", 3, "steps[0].a",
         "at least one token"),
        ("  - {a: {prefill: 30, reserved_blocks: 2}}\n", 3, "steps[0].a", "needs load_async"),
        ("  - {a: {prefill: 30, load_async: true}}\n", 3, "steps[0].a", "external tokens"),
        ("  - {a: {prefill: 50, external: 50, load_async: true}}\n", 3, "steps[0].a",
         "last token"),
        ("  - {a: {prefill: 30, external: 16, load_async: true, expect_hit: 0}}\n", 3,
         "steps[0].a", "hit plus the external"),
        ("  - {a: {refused: {prefill: 30, expect_hit: 0}}}\n", 3,
         "steps[0].a.refused", "refused admission"),
        ("  - {a: {prefill: 30, external: -1}}\n", 3, "steps[0].a.external", "at least 0"),
        ("  - {a: {prefill: 30, load_async: 1}}\n", 3, "steps[0].a.load_async",
         "true or false"),
        ("  - {a: {prefill: 30, exernal: 4}}\n", 3, "steps[0].a.exernal", "did you mean 'external'"),
        ("  - {a: {prefill: 30, connector: 16, external: 4}}\n", 3, "steps[0].a",
         "state one of the two"),
        ("  - {a: {prefill: 40}}\n  - {a: {prefill: 10, connector: 4}}\n", 4, "steps[1].a",
         "already running"),
        ("  - {a: {prefill: 30, connector: -1}}\n", 3, "steps[0].a.connector", "at least 0"),
    ],
)  # fmt: skip
def test_bad_admission_fields_name_file_line_and_field(write_scenario, steps, line, field, words):
    path = write_scenario(f"requests: {{a: {{prompt_len: 50}}}}\nsteps:\n{steps}")
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.file, error.where.line, error.where.field) == (str(path), line, field), str(
        error
    )
    assert words in error.message, str(error)


@pytest.mark.parametrize(
    ("model", "kind_lines", "words"),
    [
        ("{watermark: 1.0}", "", "below 1"),
        ("{watermark: -0.1}", "", "at least 0"),
        ("{watermark: high}", "", "a number"),
        ("{watermark: 0.1}", "kind: warmup\n", "trajectory scenarios only"),
    ],
)
def test_bad_watermark_names_its_line(write_scenario, model, kind_lines, words):
    body = "" if kind_lines else "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    path = write_scenario(f"{kind_lines}model: {model}\n{body}")
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert error.where.field == "model.watermark", str(error)
    assert error.where.line == (2 if kind_lines else 1), str(error)
    assert words in error.message, str(error)


def test_sanity_reports_each_stated_hit_vllm_did_not_give():
    run = Trajectory(groups=(), lookahead=0, lookahead_source="test")
    run.facts.append(Fact(3, 12, "b", "prefill 80", AdmissionHit(48, 64)))
    run.facts.append(Fact(4, 13, "c", "prefill 16", AdmissionHit(16, 16)))  # as stated
    (failure,) = CHECKS["sanity"].find(run)
    assert failure.check == "sanity" and failure.request == "b" and failure.line == 12
    assert failure.message == (
        "step 3 (line 12, prefill 80) request b: gets a prefix-cache hit of 48 tokens, but "
        "the scenario states 64"
    )
    assert failure.detail == {"invariant": "gets a prefix-cache hit other than the one derived"}


def test_a_stated_hit_vllm_gives_passes_and_a_wrong_one_fails(vllm, scenario_from):
    # a's unfinished chunk of 64 tokens publishes 4 full blocks of 16: b's hit is 64.
    right = run_scenario(scenario_from(SHARED.replace("HIT", "64")), vllm)
    assert right.verdict is Verdict.PASSED, right.failures or right.error
    wrong = run_scenario(scenario_from(SHARED.replace("HIT", "48")), vllm)
    assert wrong.verdict is Verdict.FAILED
    (failure,) = wrong.failures
    assert failure.check == "sanity" and failure.request == "b"
    assert "hit of 64 tokens, but the scenario states 48" in failure.message


def test_the_watermark_refuses_an_admission_only_while_another_request_runs(vllm, scenario_from):
    # int(0.25 * 16) = 4 blocks of watermark, 15 usable blocks. a alone needs 12: the
    # watermark does not apply (nothing runs). b's 1 block with 3 free: 1 + 4 > 3.
    text = """\
        model: {block_size: 16, num_blocks: 16, watermark: WATERMARK}
        requests: {a: {prompt_len: 190}, b: {prompt_len: 16}}
        steps:
          - {a: {prefill: 190}}
          - {b: {refused: {prefill: 16}}}
          - {a: finish}
        """
    with_watermark = run_scenario(scenario_from(text.replace("WATERMARK", "0.25")), vllm)
    assert with_watermark.verdict is Verdict.PASSED, with_watermark.failures
    without = run_scenario(scenario_from(text.replace("WATERMARK", "0")), vllm)
    # Without the watermark b is granted: the refusal the scenario states fails.
    assert [f.detail["invariant"] for f in without.failures if f.detail] == [
        "grants a call the pool cannot hold"
    ]


def test_max_in_flight_tokens_reaches_the_model_and_must_be_positive(write_scenario, scenario_from):
    steps = "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    assert (
        scenario_from(f"model: {{max_in_flight_tokens: 64}}\n{steps}").model.max_in_flight_tokens
        == 64
    )
    path = write_scenario(f"model: {{max_in_flight_tokens: 0}}\n{steps}")
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.max_in_flight_tokens", str(info.value)
    assert "at least 1" in info.value.message


# -- in_flight: the tokens an asynchronous scheduler has not applied yet ------------------

IN_FLIGHT = """\
model: {block_size: 1, max_model_len: 64, num_blocks: 9, scheduler_reserve_full_isl: false,
        groups: [{type: sliding_window, sliding_window: 1}]}
requests: {a: {prompt_len: 8}, b: {prompt_len: 2}}
steps:
  - {a: {prefill: 4}}
  - {a: {prefill: 4, in_flight: INFLIGHT}}
  - {b: {refused: {prefill: 1}}}
  - {a: finish}
"""


def test_in_flight_reaches_a_later_chunk(scenario_from):
    scenario = scenario_from(IN_FLIGHT.replace("INFLIGHT", "3"))
    first, second = (step.calls[0] for step in scenario.steps[:2])
    assert first.options.in_flight == 0 and first.first_chunk
    assert (second.computed, second.scheduled, second.options.in_flight) == (4, 4, 3)
    assert not second.first_chunk


@pytest.mark.parametrize(
    ("steps", "line", "field", "words"),
    [
        ("  - {a: {prefill: 10, in_flight: 4}}\n", 3, "steps[0].a", "later chunk"),
        ("  - {a: {prefill: 10}}\n  - {a: {prefill: 10, in_flight: 11}}\n", 4, "steps[1].a",
         "exceeds the 10 tokens"),
        ("  - {a: {prefill: 10}}\n  - {a: {prefill: 10, in_flight: -1}}\n", 4,
         "steps[1].a.in_flight", "at least 0"),
        ("  - {a: {prefill: 10}}\n  - {a: {prefill: 10, inflight: 4}}\n", 4,
         "steps[1].a.inflight", "did you mean 'in_flight'"),
    ],
)  # fmt: skip
def test_bad_in_flight_names_file_line_and_field(write_scenario, steps, line, field, words):
    path = write_scenario(f"requests: {{a: {{prompt_len: 50}}}}\nsteps:\n{steps}")
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.file, error.where.line, error.where.field) == (str(path), line, field), str(
        error
    )
    assert words in error.message, str(error)


def test_tokens_in_flight_keep_their_window_blocks(vllm, scenario_from):
    # Window 1, blocks of 1: a's second chunk at computed 4. With its first chunk (4
    # tokens) in flight nothing is processed and no block is freed: a holds all 8 usable
    # blocks and b is refused. With 3 in flight, one token is processed and the window
    # drops block 0: b fits, which the scenario says it must not.
    held = run_scenario(scenario_from(IN_FLIGHT.replace("INFLIGHT", "4")), vllm)
    assert held.verdict is Verdict.PASSED, held.failures or held.error
    freed = run_scenario(scenario_from(IN_FLIGHT.replace("INFLIGHT", "3")), vllm)
    assert freed.verdict is Verdict.FAILED
    (failure,) = freed.failures
    assert failure.check == "sanity" and failure.request == "b"
    assert "granted a call the scenario says the pool cannot hold" in failure.message


# -- bounded_replay: a boolean group option ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [("true", True), ("false", True), ("1", False), ("yes please", False)],
)
def test_bounded_replay_takes_true_or_false(write_scenario, value, ok):
    path = write_scenario(
        "model:\n  groups:\n    - {type: mla}\n"
        f"    - {{type: sliding_window_mla, sliding_window: 64, bounded_replay: {value}}}\n"
        "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    if ok:
        (scenario,) = load_file(path)
        assert scenario.model.groups[1].options["bounded_replay"] is (value == "true")
        return
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert error.where.field == "model.groups[1].bounded_replay", str(error)
    assert error.where.line == 4, str(error)
    assert "must be bool" in error.message, str(error)


def test_an_integer_option_still_refuses_a_boolean(write_scenario):
    path = write_scenario(
        "model:\n  groups:\n    - {type: sliding_window, sliding_window: true}\n"
        "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.groups[0].sliding_window"
    assert "must be int" in info.value.message
