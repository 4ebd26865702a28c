# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A DFlash or DSpark prefix-cache hit must keep its last full block.

EAGLE-family drafters write the KV of their lookahead positions into the target's
own groups, so on a prefix-cache hit the trailing matched block may hold such writes
and KVCacheManager drops it (use_eagle=True). DFlash and DSpark draft from their own
KV cache and never write the target's blocks: dropping the block for them only loses
a hit (vLLM #54163, #53477). The scheduler builds its KVCacheManager with
use_eagle=speculative_config.use_eagle_block_drop() (vllm/v1/core/sched/scheduler.py),
which this test does the same way.

Written by hand for kvconform's finding #6 (docs/findings.md), from the scenario
dflash-dspark-prefix-hit-keeps-last-block (scenarios/regressions/), which needs prefix
caching and so is not exportable. Against vLLM 0.32.0 (the last release that drops the
block for them; 0.33.0 keeps it, needs_eagle_block_drop()). It belongs in tests/v1/core/
and uses that folder's helpers.
"""

import pytest

from tests.v1.core.test_prefix_caching import (
    make_kv_cache_config,
    make_kv_cache_manager,
)
from tests.v1.core.utils import create_requests
from vllm.config.speculative import SpeculativeConfig

BLOCK_SIZE = 16
NUM_SPEC_STEPS = 3


def _speculative_config(method: str) -> SpeculativeConfig:
    """A real SpeculativeConfig built without __post_init__ (which needs a draft model);
    the block-drop predicates read the method and disable_eagle_block_drop only."""
    config = object.__new__(SpeculativeConfig)
    object.__setattr__(config, "method", method)
    object.__setattr__(config, "num_speculative_tokens", NUM_SPEC_STEPS)
    object.__setattr__(config, "disable_eagle_block_drop", False)
    object.__setattr__(config, "draft_model_config", None)
    return config


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("shared_tokens", [100, 128])
def test_dflash_dspark_prefix_hit_keeps_last_block(method: str, shared_tokens: int):
    use_eagle = _speculative_config(method).use_eagle_block_drop()
    manager = make_kv_cache_manager(
        make_kv_cache_config(BLOCK_SIZE, 64),
        max_model_len=1024,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
        use_eagle=use_eagle,
    )
    first, second = create_requests(
        num_requests=2,
        num_tokens=shared_tokens + 30,
        same_prompt=True,
        block_size=BLOCK_SIZE,
    )
    blocks = manager.allocate_slots(
        first, shared_tokens, num_lookahead_tokens=NUM_SPEC_STEPS + 1
    )
    assert blocks is not None
    first.num_computed_tokens = shared_tokens
    manager.free(first)

    computed_blocks, num_computed = manager.get_computed_blocks(second)[:2]
    cached = shared_tokens // BLOCK_SIZE * BLOCK_SIZE
    assert num_computed == cached, (
        f"{method}: a prefix-cache hit reuses {num_computed} of the {cached} cached tokens. "
        "DFlash and DSpark build their draft KV from the target's hidden states in their "
        "own cache and never write the target's blocks, so the trailing matched block is "
        "not volatile; only EAGLE-family drafters need it dropped"
    )
