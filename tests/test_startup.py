"""Startup scenarios: the loader, and the ``startup`` check on recorded decisions (no vLLM).

What vLLM's own planning decides for the corpus's startup scenarios, and that it catches
the real bugs of that planning, is ``tests/test_realbugs_caught.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.checks import CHECKS, judge
from kvconform.harness.loader import load_file
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import GroupInfo, StartupRecord, Trajectory

STARTUP = """
name: s
kind: startup
model:
  block_size: 16
  max_model_len: 1024
  groups:
    - {type: mamba, mamba_cache_mode: none}
    - full_attention
startup:
  available_blocks: 4096
  num_gpu_blocks_override: 65
  expect: refuse
"""


def test_a_startup_scenario_is_parsed(scenario_from):
    scenario = scenario_from(STARTUP)
    assert scenario.kind == "startup" and scenario.requests == {} and scenario.steps == ()
    startup = scenario.startup
    assert startup is not None
    assert (startup.available_blocks, startup.num_gpu_blocks_override) == (4096, 65)
    assert (startup.auto_fit, startup.expect, startup.expect_max_model_len) == (
        False,
        "refuse",
        None,
    )


def test_the_memory_defaults_to_the_override(scenario_from):
    scenario = scenario_from("kind: startup\nstartup: {num_gpu_blocks_override: 70}\n")
    assert scenario.startup is not None and scenario.startup.available_blocks == 70


@pytest.mark.parametrize(
    "text, line, field, words",
    [
        (
            "kind: startup\nmodel: {num_blocks: 64}\nstartup: {available_blocks: 8}\n",
            2,
            "model.num_blocks",
            "pool is what vLLM's planning chooses",
        ),
        (
            "kind: startup\nstartup: {auto_fit: true}\n",
            2,
            "startup.available_blocks",
            "is required without num_gpu_blocks_override",
        ),
        (
            "kind: startup\nmodel:\n  groups: [{type: sliding_window, sliding_window: 64}]\n"
            "startup: {available_blocks: 8}\n",
            3,
            "model.groups[0]",
            "not available in startup scenarios",
        ),
        (
            "kind: startup\nmodel:\n  groups: [{type: mamba}]\nstartup: {available_blocks: 8}\n",
            3,
            "model.groups[0]",
            "state mamba_cache_mode: none",
        ),
        (
            "kind: startup\nmodel:\n  groups: [{type: mamba, mamba_cache_mode: align}]\n"
            "startup: {available_blocks: 8}\n",
            3,
            "model.groups[0].mamba_cache_mode",
            "must be 'none' in a startup scenario",
        ),
        (
            "kind: startup\nspeculative: {method: eagle, num_speculative_tokens: 2}\n"
            "startup: {available_blocks: 8}\n",
            2,
            "speculative.method",
            "takes no speculative section",
        ),
        (
            "kind: startup\nstartup: {available_blocks: 8, expect_max_model_len: 64}\n",
            2,
            "startup.expect_max_model_len",
            "needs auto_fit: true",
        ),
        (
            "kind: startup\nstartup: {available_blocks: 8, expect: start}\n",
            2,
            "startup.expect",
            "must be one of accept, refuse",
        ),
        (
            "kind: startup\nstartup: {available_blocks: 8}\nrequests: {a: {prompt_len: 4}}\n",
            3,
            "requests",
            "has no requests or steps",
        ),
    ],
)
def test_bad_startup_input_names_file_line_and_field(write_scenario, text, line, field, words):
    path = write_scenario(text)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (line, field), str(error)
    assert words in error.message, str(error)


# -- the check, on recorded decisions -------------------------------------------------------


def _group(index: int, type_name: str, **floor_args: object) -> GroupInfo:
    args = {"block_size": 16, "max_model_len": 1024, **floor_args}
    return GroupInfo(index, type_name, 16, type_name, GROUP_TYPES[type_name].holds_null, args)


FULL = (_group(0, "full_attention"),)
HYBRID = (_group(0, "mamba"), _group(1, "full_attention"))


def _record(**fields: object) -> StartupRecord:
    base: dict[str, object] = dict(
        accepted=True,
        function="get_kv_cache_configs",
        max_model_len=1024,
        original_max_model_len=1024,
        available_blocks=4096,
        bytes_per_block=512,
    )
    return StartupRecord(**{**base, **fields})  # type: ignore[arg-type]


def _failures(groups: tuple[GroupInfo, ...], record: StartupRecord) -> list[str]:
    trajectory = Trajectory(groups, 0, "no speculative decoding", 1024, startup=record)
    return [f.message for f in judge(trajectory, ("startup",)).failures]


def test_a_pool_one_request_fits_with_the_null_block_passes():
    assert _failures(FULL, _record(num_blocks=65, override=65, expect="accept")) == []
    assert _failures(HYBRID, _record(num_blocks=66, override=66)) == []


def test_an_accepted_pool_without_room_for_the_null_block_fails():
    (message,) = _failures(FULL, _record(num_blocks=64, override=64))
    assert "accepts a pool of 64 blocks" in message
    assert "needs 64 blocks by the floor (group 0 (full_attention) 64)" in message
    assert "the pool gives 63 (one block is the null block" in message


def test_an_accepted_pool_counting_the_first_group_only_fails():
    (message,) = _failures(HYBRID, _record(num_blocks=40, override=40))
    assert "needs 65 blocks by the floor (group 0 (mamba) 1, group 1 (full_attention) 64)" in (
        message
    )


def test_a_refused_pool_that_fits_fails_and_one_that_does_not_passes():
    refusal = {"accepted": False, "refusal": "To serve at least one request ..."}
    (message,) = _failures(FULL, _record(override=65, **refusal))
    assert "refuses to start" in message and "a pool of 65 blocks gives 64" in message
    assert _failures(FULL, _record(override=64, **refusal)) == []
    assert _failures(FULL, _record(available_blocks=64, **refusal)) == []


def test_auto_fit_must_pick_the_longest_length_that_fits():
    fitted = _record(num_blocks=50, available_blocks=50, auto_fit=True)
    assert _failures(FULL, replace(fitted, max_model_len=784)) == []
    (message,) = _failures(FULL, replace(fitted, max_model_len=768))
    assert "auto-fits max_model_len to 768" in message and "769 tokens needs only 49" in message
    (message,) = _failures(FULL, replace(fitted, max_model_len=800))
    assert "accepts a pool of 50 blocks" in message


def test_the_stated_outcome_is_held():
    (message,) = _failures(FULL, _record(num_blocks=65, override=65, expect="refuse"))
    assert "states that vLLM's startup planning (get_kv_cache_configs) refuses" in message
    record = _record(num_blocks=50, available_blocks=50, auto_fit=True, max_model_len=784)
    (message,) = _failures(FULL, replace(record, expect_max_model_len=768))
    assert "auto-fits max_model_len to 768" in message and "it fits 784" in message


def test_other_kinds_are_not_judged():
    trajectory = Trajectory(FULL, 0, "no speculative decoding", 1024)
    assert list(CHECKS["startup"].find(trajectory)) == []
