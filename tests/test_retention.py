"""``model.prefix_cache_retention_interval``: vLLM's prefix-cache retention policy.

The loader's rules (vLLM's ``_validate_prefix_cache_retention_interval``: non-negative, a
multiple of the scheduler block size, nonzero only with a sliding-window or Mamba group;
each bad input one message with file, line and field), and that the value reaches the
real ``KVCacheManager``: under sparse retention (0) a Mamba "align" chunk short of the
prefill's end reserves no checkpoint block, under dense retention (none) it does.
"""

from __future__ import annotations

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.loader import load_file
from kvconform.harness.runner import run_scenario
from kvconform.model.results import Verdict

MAMBA = (
    "[{type: mamba, mamba_cache_mode: align, num_speculative_blocks: 0, "
    "num_prefill_checkpoint_blocks: 1, prefill_checkpoint_alignment: 1}]"
)
STEPS = "requests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n"


def test_the_interval_reaches_the_model(scenario_from):
    text = (
        f"model: {{enable_caching: true, prefix_cache_retention_interval: 32, groups: {MAMBA}}}\n"
    )
    assert scenario_from(text + STEPS).model.prefix_cache_retention_interval == 32
    assert scenario_from(STEPS).model.prefix_cache_retention_interval is None


@pytest.mark.parametrize(
    ("value", "groups", "words"),
    [
        ("-16", MAMBA, "at least 0"),
        ("24", MAMBA, "multiple of the scheduler block size (16), not 24"),
        ("16", "[full_attention]", "no sliding_window or sliding_window_mla or mamba group"),
    ],
)
def test_a_bad_interval_is_one_message_at_its_field(write_scenario, value, groups, words):
    path = write_scenario(
        f"model:\n  groups: {groups}\n  prefix_cache_retention_interval: {value}\n{STEPS}"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.file, error.where.line, error.where.field) == (
        str(path),
        3,
        "model.prefix_cache_retention_interval",
    ), str(error)
    assert words in error.message


def test_zero_is_allowed_without_a_sparse_group(scenario_from):
    # vLLM accepts 0 for any model (retention then changes nothing).
    text = "model: {prefix_cache_retention_interval: 0}\n"
    assert scenario_from(text + STEPS).model.prefix_cache_retention_interval == 0


SPARSE = f"""\
model: {{block_size: 16, num_blocks: 3, enable_caching: true, scheduler_reserve_full_isl: false,
        prefix_cache_retention_interval: RETENTION, groups: {MAMBA}}}
requests: {{a: {{prompt_len: 100}}, b: {{prompt_len: 100}}}}
steps:
  - {{a: {{prefill: 32}}, b: {{prefill: 32}}}}
"""


def test_sparse_retention_reserves_no_checkpoint_before_the_prefill_end(vllm, scenario_from):
    # 2 usable blocks. A chunk 0 -> 32 of a 100-token prompt could export a checkpoint at
    # 16 (column 0); under sparse retention only the chunk reaching 100 keeps one, so a
    # and b take their running state only: 1 block each, both fit.
    sparse = run_scenario(scenario_from(SPARSE.replace("RETENTION", "0")), vllm)
    assert sparse.verdict is Verdict.PASSED, sparse.failures or sparse.error
    # Dense retention keeps every chunk's checkpoint: a takes 2 blocks, b finds none.
    dense = run_scenario(scenario_from(SPARSE.replace("RETENTION", "null")), vllm)
    assert dense.verdict is not Verdict.PASSED
