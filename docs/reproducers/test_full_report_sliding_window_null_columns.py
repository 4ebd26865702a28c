# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A full KV-cache report announces only the blocks each group's hit holds.

With ``kv_cache_report_mode`` "full", ``KVCacheManager.get_computed_blocks``
re-announces the prefix-cache blocks a request reuses
(``KVCacheCoordinator.emit_cached_block_events`` ->
``BlockPool.emit_cached_block_events``, one ``BlockStored`` per group). The
coordinator passes ``len(group_blocks)``, and the pool announces the request's
first that many block hashes. A sliding-window group's hit holds the null
block in the columns below the window (``SlidingWindowManager.
find_longest_cache_hit``), so their hashes are announced too: a KV-aware
router is told the group holds blocks it never cached (sparse retention, the
default) or already freed, and no ``BlockRemoved`` ever retracts them. The
same count over null placeholders is the cause of the Mamba-align crash of
vllm#57358; here nothing crashes, the announcement is wrong.

kvconform's scenario kv-events-full-report-sliding-window-null-columns
(scenarios/hybrid/) found it against vLLM 0.26.0 to vLLM 0.34.0. Written by hand
for vLLM 0.34.0; it belongs in tests/v1/core/ of that release's tree and uses its
test helpers.
"""

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager, make_request
from vllm.distributed.kv_events import BlockStored
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash, maybe_convert_block_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 16
SLIDING_WINDOW_GROUP = 1


def _manager(retention_interval: int | None):
    config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            ),
            KVCacheGroupSpec(
                ["sliding"],
                SlidingWindowSpec(
                    block_size=BLOCK_SIZE,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                    sliding_window=32,
                ),
            ),
        ],
    )
    return make_kv_cache_manager(
        config,
        max_model_len=256,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
        enable_kv_cache_events=True,
        retention_interval=retention_interval,
    )


# 0: sparse retention (CacheConfig's default); None: every block kept.
@pytest.mark.parametrize("retention_interval", [0, None])
def test_full_report_announces_no_null_column(retention_interval: int | None):
    init_none_hash(sha256)
    manager = _manager(retention_interval)
    prompt = list(range(96))
    a = make_request("a", prompt, BLOCK_SIZE, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(a)
    assert manager.allocate_slots(a, len(prompt), num_computed, computed) is not None
    manager.take_events()

    b = make_request("b", prompt, BLOCK_SIZE, sha256)
    b.kv_cache_report_mode = "full"
    hit_blocks, hit_tokens, _ = manager.get_computed_blocks(b)
    window_hit = hit_blocks.blocks[SLIDING_WINDOW_GROUP]
    assert hit_tokens > 0 and window_hit and window_hit[0].is_null, (
        "the scenario needs a hit whose sliding-window columns start with the null block"
    )

    held = [
        maybe_convert_block_hash(b.block_hashes[i])
        for i, block in enumerate(window_hit)
        if not block.is_null
    ]
    announced = [
        block_hash
        for event in manager.take_events()
        if isinstance(event, BlockStored) and event.group_idx == SLIDING_WINDOW_GROUP
        for block_hash in event.block_hashes
    ]
    assert announced == held, (
        f"b's hit ({hit_tokens} tokens) holds {len(held)} sliding-window blocks behind "
        f"{len(window_hit) - len(held)} null columns, but the full report announces "
        f"{len(announced)} hashes for the group: a router would route for blocks it "
        "does not hold, and no BlockRemoved retracts them"
    )
