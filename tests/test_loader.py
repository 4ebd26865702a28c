"""The loader: defaults, matrix, repeat, and one clear message per bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.errors import FileErrors, ScenarioError
from kvconform.harness.loader import load_file, load_paths
from kvconform.model.scenario import Action

MINIMAL = """
name: minimal
requests:
  a: {prompt_len: 20}
steps:
  - {a: {prefill: 20}}
  - {a: decode}
  - {a: finish}
"""


def test_defaults_are_filled_in(scenario_from):
    scenario = scenario_from(MINIMAL)
    assert scenario.model.block_size == 16
    assert [g.type for g in scenario.model.groups] == ["full_attention"]
    assert scenario.speculative is None
    assert scenario.kind == "trajectory"


def test_steps_resolve_to_token_counts(scenario_from):
    scenario = scenario_from(
        """
        model: {max_model_len: 512}
        speculative: {method: eagle, num_speculative_tokens: 3}
        requests: {a: {prompt_len: 40}}
        steps:
          - {a: {prefill: 32}}
          - {a: {prefill: 8}}
          - {a: {spec: 3, accepted: 1}}
          - {a: decode}
          - {a: preempt}
          - {a: {prefill: 44}}
        """
    )
    calls = [step.calls[0] for step in scenario.steps]
    assert [(c.computed, c.scheduled, c.rejected, c.sampled) for c in calls] == [
        (0, 32, 0, 0),  # a chunk that does not finish the prompt samples nothing
        (32, 8, 0, 1),  # the chunk that finishes it samples one token
        (40, 4, 2, 2),  # last sampled token + 3 drafts; 2 rejected; 1 accepted + bonus
        (42, 1, 0, 1),
        (43, 0, 0, 0),  # preempt: 43 computed tokens were dropped
        (0, 44, 0, 1),  # recompute the prompt (40) and all 4 outputs, then sample
    ]
    assert calls[0].first_chunk and not calls[1].first_chunk and calls[5].first_chunk
    assert calls[4].action is Action.PREEMPT


def test_repeat_unrolls(scenario_from):
    scenario = scenario_from(
        """
        speculative: {method: eagle, num_speculative_tokens: 2}
        requests: {a: {prompt_len: 10}}
        steps:
          - {a: {prefill: 10}}
          - {repeat: 5, step: {a: {spec: 2, accepted: 0}}}
          - {repeat: 2, steps: [{a: decode}, {a: {spec: 1}}]}
        """
    )
    assert len(scenario.steps) == 1 + 5 + 4
    assert [s.calls[0].computed for s in scenario.steps[1:6]] == [10, 11, 12, 13, 14]


def test_matrix_makes_one_scenario_per_combination(write_scenario):
    path = write_scenario(
        """
        name: m
        matrix:
          method: [eagle, dflash, none]
          num_speculative_tokens: [1, 3]
        requests: {a: {prompt_len: 10}}
        steps: [{a: {prefill: 10}}, {a: decode}]
        """
    )
    scenarios = load_file(path)
    assert [s.id for s in scenarios] == [
        "m[eagle-k1]",
        "m[eagle-k3]",
        "m[dflash-k1]",
        "m[dflash-k3]",
        "m[nospec-k1]",
        "m[nospec-k3]",
    ]
    assert scenarios[3].speculative.method == "dflash"
    assert scenarios[3].speculative.num_speculative_tokens == 3
    assert scenarios[4].speculative is None


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (
            "name: x\nrequests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 6}}\n",
            4,
            "steps[0].a",
            "outside 1..5",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: decode}\n",
            3,
            "steps[0].a",
            "before its prefill",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {b: decode}\n",
            3,
            "steps[0].b",
            "unknown request",
        ),
        (
            "model:\n  groups: [full_atention]\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n",
            2,
            "model.groups[0].type",
            "unknown group type",
        ),
        (
            "model:\n  block_size: sixteen\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n",
            2,
            "model.block_size",
            "integer",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nrequests: {b: {prompt_len: 5}}\nsteps: []\n",
            2,
            "requests",
            "duplicate key",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {a: {spec: 2}}\n",
            4,
            "steps[1].a",
            "speculative",
        ),
        (
            "speculative: {method: eagle, num_speculative_tokens: 2}\nrequests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {a: {spec: 3}}\n",
            5,
            "steps[1].a",
            "at most num_speculative_tokens",
        ),
        (
            "model: {max_model_len: 8}\nrequests: {a: {prompt_len: 7}}\nsteps:\n  - {a: {prefill: 7}}\n  - {a: decode}\n",
            5,
            "steps[1].a",
            "max_model_len",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {a: finish}\n  - {a: decode}\n",
            5,
            "steps[2].a",
            "already finished",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\nsurprise: 1\n",
            3,
            "surprise",
            "unknown field",
        ),
        (
            "model: {groups: [{type: sliding_window}]}\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n",
            1,
            "model.groups[0].sliding_window",
            "required",
        ),
        ("requests: [a]\nsteps: [{a: {prefill: 5}}]\n", 1, "requests", "mapping"),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {reset_prefix_cache: yes please}\n",
            4,
            "steps[1].reset_prefix_cache",
            "states what KVCacheManager.reset_prefix_cache answers",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {evict_cached: {b: [0]}}\n",
            4,
            "steps[1].evict_cached.b",
            "unknown request",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {evict_cached: {a: [-1]}}\n",
            4,
            "steps[1].evict_cached.a",
            "column indices",
        ),
        (
            "requests: {a: {prompt_len: 5, kv_cache_report: all}}\nsteps: [{a: {prefill: 5}}]\n",
            1,
            "requests.a.kv_cache_report",
            "must be incremental or full",
        ),
        (
            "requests: {a: {prompt_len: 5, skip_reading_prefix_cache: 1}}\nsteps: [{a: {prefill: 5}}]\n",
            1,
            "requests.a.skip_reading_prefix_cache",
            "true or false",
        ),
        (
            "model: {mamba_shared_prefix_checkpoint: true}\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n",
            1,
            "model.mamba_shared_prefix_checkpoint",
            "has no mamba group",
        ),
        (
            "kind: scheduler\nmodel: {mamba_shared_prefix_checkpoint: true, groups: [full_attention, mamba]}\nrequests: {a: {prompt_len: 5}}\n",
            2,
            "model.mamba_shared_prefix_checkpoint",
            "trajectory",
        ),
        (
            "requests: {evict_cached: {prompt_len: 5}}\nsteps: [{evict_cached: {prefill: 5}}]\n",
            1,
            "requests.evict_cached.prompt_len",
            "reserved in steps",
        ),
        (
            "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  - {a: {finish: soon}}\n",
            4,
            "steps[1].a.finish",
            "a finish says only in_flight",
        ),
        (
            "kind: scheduler\nmodel: {log_stats: true}\nrequests: {a: {prompt_len: 5}}\n",
            2,
            "model.log_stats",
            "trajectory scenarios only",
        ),
        ("steps: [{a: {prefill: 5}}\n", 2, None, "invalid YAML"),
        (
            # Found by the loader fuzz test: a mapping here raised TypeError (unhashable).
            "requests:\n  a: {prompt_len: 64}\n  e: {prompt_len: 64, prefix_from: {x: [a]}}\n",
            3,
            "requests.e.prefix_from",
            "must be a non-empty string",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 64}\n"
            "  e: {prompt_len: 64, prefix_from: [a]}\n",
            4,
            "requests.e.prefix_from",
            "must be a non-empty string",
        ),
    ],
)
def test_bad_input_names_file_line_and_field(write_scenario, text, line, field, words):
    path = write_scenario(text)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert error.where.file == str(path)
    assert error.where.line == line, str(error)
    assert error.where.field == field, str(error)
    assert words in error.message, str(error)
    assert str(error).startswith(f"{path}:{line}: ")


def test_one_bad_file_does_not_hide_the_others(tmp_path: Path):
    (tmp_path / "good.yaml").write_text(MINIMAL)
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: jump}]\n"
    )
    (tmp_path / "expectations.yaml").write_text("- {id: x, reason: y}\n")  # not a scenario
    loaded = load_paths([tmp_path])
    assert [s.id for s in loaded.scenarios] == ["minimal"]
    assert len(loaded.errors) == 1 and "unknown action 'jump'" in str(loaded.errors[0])


def test_yaml_is_loaded_safely(write_scenario):
    path = write_scenario(
        "name: !!python/object/apply:os.system ['true']\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_file(path)


def test_duplicate_scenario_ids_are_an_error(tmp_path: Path):
    (tmp_path / "one.yaml").write_text(MINIMAL)
    (tmp_path / "two.yaml").write_text(MINIMAL)
    loaded = load_paths([tmp_path])
    assert len(loaded.scenarios) == 1
    assert "already used" in str(loaded.errors[0])


# -- messages that say what to write (issue 16, item 5) ---------------------------------


def _problems(write_scenario, text: str) -> list[ScenarioError]:
    result = load_paths([write_scenario(text)])
    assert result.scenarios == []
    return result.errors


def test_a_missing_field_names_the_unknown_field_probably_meant(write_scenario):
    (error,) = _problems(
        write_scenario,
        """
        speculative:
          methd: eagle
          num_speculative_tokens: 2
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """,
    )
    assert error.where.field == "speculative.method"
    assert "is required; line 2 has the unknown field 'methd': did you mean 'method'?" in str(error)


def test_known_here_lists_every_allowed_field_and_unknown_ones_get_a_did_you_mean(write_scenario):
    (error,) = _problems(
        write_scenario,
        """
        speculative: {method: eagle, num_speculative_tokens: 2, num_lookahed_tokens: 3}
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """,
    )
    # num_lookahead_tokens and sample_from_anchor were not given, and are still listed.
    assert (
        "unknown field (did you mean 'num_lookahead_tokens'?) (known here: "
        "disable_lookahead_block_hashes, method, num_lookahead_tokens, num_speculative_tokens, "
        "sample_from_anchor)"
    ) in error.message
    (top,) = _problems(write_scenario, MINIMAL + "matrx: {block_size: [16]}\n")
    assert (
        "did you mean 'matrix'?" in top.message and "matrix" in top.message.split("known here")[1]
    )


def test_a_misspelt_group_type_request_or_action_names_the_one_meant(write_scenario):
    errors = _problems(
        write_scenario,
        """
        model: {groups: [full_atention]}
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """,
    )
    assert "unknown group type 'full_atention' (did you mean 'full_attention'?)" in str(errors[0])
    errors = _problems(
        write_scenario,
        """
        requests: {alpha: {prompt_len: 20}}
        steps:
          - {alpha: {prefil: 20}}
          - {alpa: decode}
          - {alpa: finish}
        """,
    )
    assert [(e.where.line, e.where.field) for e in errors] == [
        (3, "steps[0].alpha"),
        (4, "steps[1].alpa"),
    ]
    assert "did you mean 'prefill'?" in errors[0].message
    assert "unknown request 'alpa' (did you mean 'alpha'?)" in errors[1].message


def test_tabs_and_empty_items_get_a_plain_hint(write_scenario):
    (tab,) = _problems(
        write_scenario, "requests:\n\ta: {prompt_len: 5}\nsteps: [{a: {prefill: 5}}]\n"
    )
    assert tab.where.line == 2
    assert (
        tab.message == "a tab character: YAML indents with spaces only; replace the tab with spaces"
    )
    empty_step, empty_action = _problems(
        write_scenario,
        "requests: {a: {prompt_len: 5}, b: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n  -\n"
        "  - b:\n",
    )
    assert (empty_step.where.line, empty_step.where.field) == (4, "steps[1]")
    assert "an empty step: a '-' with nothing after it" in empty_step.message
    assert empty_action.where.field == "steps[2].b" and "None" not in empty_action.message
    assert "no action after the request's name" in empty_action.message


def test_every_problem_in_a_file_is_reported_each_at_its_line(write_scenario, tmp_path):
    text = """
        model: {blok_size: 16}
        speculative: {method: eagle, num_speculative_tokens: 2, extra: 1}
        requests: {a: {prompt_len: 20}, b: {promt_len: 4}}
        steps: [{a: {prefill: 20}}]
        tags: [x]
        colour: blue
        """
    errors = _problems(write_scenario, text)
    assert [(e.where.line, e.where.field) for e in errors] == [
        (1, "model.blok_size"),
        (2, "speculative.extra"),
        (3, "requests.b.prompt_len"),
        (6, "colour"),
    ]
    # Callers that read one file get every problem too, in one error.
    with pytest.raises(FileErrors) as info:
        load_file(write_scenario(text))
    assert [str(e) for e in info.value.errors] == [str(e) for e in errors]
    assert str(info.value).count("\n") == 3


def test_a_matrix_reports_a_problem_once_not_per_combination(write_scenario):
    errors = _problems(
        write_scenario,
        """
        speculative: {method: eagle, num_speculative_tokens: 2}
        matrix: {num_speculative_tokens: [1, 2, 3]}
        requests: {a: {prompt_len: 20, colour: red}}
        steps: [{a: {prefill: 20}}]
        """,
    )
    assert [e.where.field for e in errors] == ["requests.a.colour"]


def test_an_unknown_method_names_the_declared_one_probably_meant(vllm, scenario_from):
    from kvconform.harness.runner import run_scenario

    scenario = scenario_from(
        """
        speculative: {method: eagel, num_speculative_tokens: 2}
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """
    )
    result = run_scenario(scenario, vllm)
    assert result.error_kind is not None and result.error_kind.value == "input"
    assert "unknown speculative method 'eagel' (did you mean 'eagle'?)" in (result.error or "")


def test_a_refused_call_is_checked_and_changes_no_count(scenario_from):
    scenario = scenario_from(
        """
        requests: {a: {prompt_len: 40}}
        steps:
          - {a: {prefill: 16}}
          - {a: {refused: {prefill: 24}}}
          - {a: {prefill: 24}}
          - {a: {refused: decode}}
          - {a: decode}
        """
    )
    calls = [step.calls[0] for step in scenario.steps]
    assert [(c.computed, c.scheduled, c.refused) for c in calls] == [
        (0, 16, False),
        (16, 24, True),  # the refused chunk is the chunk that follows
        (16, 24, False),
        (40, 1, True),
        (40, 1, False),
    ]
    assert calls[1].sampled == 0 and calls[1].label == "prefill 24 (refused)"


def test_a_refused_call_must_be_a_legal_allocating_action(write_scenario):
    path = write_scenario(
        "requests: {a: {prompt_len: 5}}\nsteps:\n  - {a: {prefill: 5}}\n"
        "  - {a: {refused: finish}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert "only an allocating action can be refused" in info.value.message
    assert info.value.where.line == 4


WARMUP_PASSES = """
kind: warmup
model: {num_blocks: 5}
warmup:
  entry_points: [warmup_kernels]
  expect_passes:
    - {requests: 4, sampling: random}
    - {requests: 4, sampling: {sampling}, vllm: "{vllm}"}
"""


def test_warmup_expect_passes_are_read_with_their_release_gate(scenario_from):
    text = WARMUP_PASSES.replace("{sampling}", "greedy").replace("{vllm}", ">=0.33.0")
    passes = scenario_from(text).warmup.expect_passes
    assert [(p.requests, p.sampling, p.vllm) for p in passes] == [
        (4, "random", None),
        (4, "greedy", ">=0.33.0"),
    ]
    assert passes[1].applies_to("0.33.0") and passes[1].applies_to("0.34.0.dev3+gabc")
    assert not passes[1].applies_to("0.32.0") and passes[0].applies_to("0.25.0")


def test_warmup_expect_passes_bad_input_names_the_line_and_field(write_scenario):
    text = WARMUP_PASSES.replace("{vllm}", ">=0.33.0")
    (sampling,) = _problems(write_scenario, text.replace("{sampling}", "beam"))
    assert sampling.where.line == 7 and sampling.where.field == "warmup.expect_passes[1].sampling"
    assert "unknown sampling 'beam'; known: random, greedy" in sampling.message
    (version,) = _problems(write_scenario, text.replace(">=0.33.0", "0.33+").replace(
        "{sampling}", "greedy"))  # fmt: skip
    assert version.where.field == "warmup.expect_passes[1].vllm"
    assert "not a version specifier: '0.33+'" in version.message
    mixed_only = text.replace("{sampling}", "greedy").replace(
        "[warmup_kernels]", "[run_mixed_prefill_decode_warmup]"
    )
    (entry,) = _problems(write_scenario, mixed_only)
    assert entry.where.field == "warmup.expect_passes"
    assert "needs warmup_kernels among the entry_points" in entry.message


def test_only_a_pooling_warmup_may_have_no_kv_cache_groups(write_scenario, scenario_from):
    pooling = """
    kind: warmup
    model:
      num_blocks: 16
      groups: []
    warmup: {entry_points: [warmup_kernels], pooling: true}
    """
    scenario = scenario_from(pooling)
    assert scenario.model.groups == () and scenario.warmup.pooling
    assert scenario.model.scheduler_block_size == scenario.model.hash_block_size == 16
    (error,) = _problems(write_scenario, pooling.replace("pooling: true", "pooling: false"))
    assert error.where.line == 4 and error.where.field == "model.groups"
    assert "an empty one, a model without KV cache, only for kind: warmup with" in error.message
    (trajectory,) = _problems(write_scenario, MINIMAL + "model: {groups: []}\n")
    assert trajectory.where.field == "model.groups"


_SWA_RETAIN = "  groups: [{type: sliding_window, sliding_window: 8, extra_retained_tokens: %d}]\n"


@pytest.mark.parametrize(
    ("speculative", "retained", "words"),
    [
        (
            "speculative: {method: mtp, num_speculative_tokens: 3}\n",
            1,
            "must be num_speculative_tokens - 1 (2)",
        ),
        ("speculative: {method: mtp, num_speculative_tokens: 1}\n", 0, "needs k >= 2"),
        ("", 2, "needs k >= 2"),
    ],
)
def test_extra_retained_tokens_only_as_vllm_sets_it(write_scenario, speculative, retained, words):
    path = write_scenario(
        speculative
        + "model:\n"
        + _SWA_RETAIN % retained
        + "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.groups[0].extra_retained_tokens", str(info.value)
    assert words in info.value.message, str(info.value)


def test_extra_retained_tokens_on_every_sliding_window_group(write_scenario):
    path = write_scenario(
        "speculative: {method: mtp, num_speculative_tokens: 3}\n"
        "model:\n  groups:\n"
        "    - {type: sliding_window, sliding_window: 8, extra_retained_tokens: 2}\n"
        "    - {type: sliding_window_mla, sliding_window: 8}\n"
        "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.groups[1]", str(info.value)
    assert "every sliding-window group" in info.value.message


def test_extra_retained_tokens_loads_and_widens_the_read_span(scenario_from):
    from kvconform.oracles.resolve import _read_span, extra_retained_tokens

    scenario = scenario_from(
        """
        speculative: {method: mtp, num_speculative_tokens: 3}
        model:
          groups: [full_attention, {type: sliding_window, sliding_window: 8, extra_retained_tokens: 2}]
        requests: {a: {prompt_len: 5}}
        steps: [{a: {prefill: 5}}]
        """
    )
    assert extra_retained_tokens(scenario.model) == 2
    # The window of 8 plus the 2 retained tokens (SlidingWindowSpec.num_retained_tokens + 1).
    assert _read_span(scenario.model.groups[1]) == ("window", 10)
    assert _read_span(scenario.model.groups[0]) is None


def test_extra_retained_tokens_needs_mtp(vllm, scenario_from):
    from kvconform.harness.runner import run_scenario

    scenario = scenario_from(
        """
        speculative: {method: eagle, num_speculative_tokens: 3}
        model:
          groups: [{type: sliding_window, sliding_window: 8, extra_retained_tokens: 2}]
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """
    )
    result = run_scenario(scenario, vllm)
    assert result.error_kind is not None and result.error_kind.value == "input"
    assert "needs speculative.method mtp" in (result.error or "")


def test_eagle_group_and_lookahead_hash_switch_load(scenario_from):
    scenario = scenario_from(
        """
        speculative: {method: eagle, num_speculative_tokens: 1, disable_lookahead_block_hashes: true}
        model:
          groups: [{type: full_attention, eagle_group: true}, {type: sliding_window, sliding_window: 17}]
        requests: {a: {prompt_len: 5}}
        steps: [{a: {prefill: 5}}]
        """
    )
    assert [g.eagle_group for g in scenario.model.groups] == [True, False]
    assert scenario.speculative is not None
    assert scenario.speculative.disable_lookahead_block_hashes is True


def test_eagle_group_must_be_a_flag(write_scenario):
    path = write_scenario(
        "model:\n  groups: [{type: full_attention, eagle_group: 1}]\n"
        "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.groups[0].eagle_group", str(info.value)
    assert "true or false" in info.value.message


def test_eagle_group_needs_a_method_with_the_block_drop(vllm, scenario_from):
    from kvconform.harness.runner import run_scenario

    scenario = scenario_from(
        """
        speculative: {method: ngram, num_speculative_tokens: 2}
        model:
          groups: [{type: full_attention, eagle_group: true}]
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}]
        """
    )
    result = run_scenario(scenario, vllm)
    assert result.error_kind is not None and result.error_kind.value == "input"
    assert "use_eagle_block_drop" in (result.error or "")


def test_eagle_group_only_in_trajectory_scenarios(write_scenario):
    path = write_scenario(
        "kind: scheduler\nspeculative: {method: eagle, num_speculative_tokens: 1}\n"
        "model:\n  groups: [{type: full_attention, eagle_group: true}]\n"
        "requests: {a: {prompt_len: 5}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "model.groups[0].eagle_group", str(info.value)
    assert "only in trajectory scenarios" in info.value.message


RELEASE_RANGED = """\
name: ranged
vllm: "{releases}"
model: {{groups: [full_attention]}}
requests: {{a: {{prompt_len: 20}}}}
steps:
  - {{a: {{prefill: 20}}}}
  - {{a: finish}}
"""


def test_a_scenario_may_name_the_releases_whose_behaviour_it_states(tmp_path: Path, vllm):
    from kvconform.harness.runner import run_scenario

    path = tmp_path / "ranged.yaml"
    path.write_text(RELEASE_RANGED.format(releases=f"=={vllm.version}"))
    (scenario,) = load_file(path)
    assert scenario.vllm_releases == f"=={vllm.version}"
    assert run_scenario(scenario, vllm).verdict.value == "passed"
    path.write_text(RELEASE_RANGED.format(releases="<0.1"))
    (scenario,) = load_file(path)
    result = run_scenario(scenario, vllm)
    assert result.verdict.value == "unsupported", result.error
    assert "<0.1" in (result.error or "")
    # The same words for every scenario of the range (not its id): the console folds them
    # into one UNSUPPORTED line that names the ids.
    assert scenario.id not in (result.error or "")
    assert (result.error or "").endswith("lacks what the scenario states: the scenario is "
                                         "written for vLLM <0.1")  # fmt: skip
    path.write_text(RELEASE_RANGED.format(releases="newer please"))
    with pytest.raises((ScenarioError, FileErrors)) as caught:
        load_file(path)
    assert ":2: vllm: not a version specifier" in str(caught.value)


def test_every_mistake_of_a_file_is_reported_once_even_after_a_broken_call(tmp_path):
    # issue 37: accepted: 1.5 broke a's call; a's later unknown action stayed hidden.
    path = tmp_path / "two-mistakes.yaml"
    path.write_text(
        "speculative: {method: eagle, num_speculative_tokens: 2}\n"
        "requests: {a: {prompt_len: 20}}\n"
        "steps:\n"
        "  - {a: {prefill: 20}}\n"
        "  - {a: {spec: 2, accepted: 1.5}}\n"
        "  - {a: decoed}\n"
        "  - {a: decode}\n"
        "  - {a: finish}\n",
        encoding="utf-8",
    )
    errors = load_paths([path]).errors
    assert [(e.where.line, e.where.field) for e in errors] == [
        (5, "steps[1].a.accepted"),
        (6, "steps[2].a"),
    ]
    assert "must be an integer, not 1.5" in errors[0].message
    assert "unknown action 'decoed' (did you mean 'decode'?)" in errors[1].message


def test_a_broken_section_leaves_the_steps_mistakes_reported(tmp_path):
    path = tmp_path / "broken-spec.yaml"
    path.write_text(
        "speculative: {method: eagle, num_speculative_tokens: [2]}\n"
        "requests: {a: {prompt_len: 20}}\n"
        "steps:\n"
        "  - {a: {prefill: 20}}\n"
        "  - repeat: 3\n"
        "    step: {a: decoed}\n",
        encoding="utf-8",
    )
    errors = load_paths([path]).errors
    assert [(e.where.line, e.where.field) for e in errors] == [
        (1, "speculative.num_speculative_tokens"),
        (6, "steps[1].step.a"),
    ]


def test_a_file_with_many_mistakes_lists_a_cap_and_says_how_many_more(tmp_path):
    from kvconform.harness.loader.files import MAX_FILE_ERRORS

    steps = "".join(f"  - {{a: decoed{i}}}\n" for i in range(MAX_FILE_ERRORS + 7))
    path = tmp_path / "many.yaml"
    path.write_text(
        "requests: {a: {prompt_len: 20}}\nsteps:\n  - {a: {prefill: 20}}\n" + steps,
        encoding="utf-8",
    )
    errors = load_paths([path]).errors
    assert len(errors) == MAX_FILE_ERRORS + 1
    assert all("unknown action 'decoed" in e.message for e in errors[:-1])
    assert "and 7 more problems in this file" in errors[-1].message
    assert errors[-1].where.line == 4 + MAX_FILE_ERRORS



def test_an_unknown_kind_names_the_kinds_and_the_one_meant(write_scenario) -> None:
    [error] = _problems(
        write_scenario,
        "name: k\nkind: schedular\n"
        "model: {block_size: 16, max_model_len: 256, num_blocks: 64, groups: [full_attention]}\n",
    )
    assert error.where.line == 2 and error.where.field == "kind"
    assert error.message == (
        "must be one of trajectory, warmup, scheduler, engine, startup, not 'schedular' "
        "(did you mean 'scheduler'?)"
    )
