# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An EAGLE prefix hit shorter than the sliding window keeps its aligned blocks.

When a sliding-window group's block is smaller than the cache-hit alignment (a
hybrid whose full-attention layers use larger blocks, e.g. Gemma 4: full
attention in blocks of 32, sliding window in blocks of 16), the coordinator
looks the window group up to the candidate hit plus one block, the block EAGLE
drops, and the search accepts a run whose length after that drop is aligned.
For a run shorter than a full window (``match_found`` false),
``SlidingWindowManager.find_longest_cache_hit`` aligns the run first, then pops
EAGLE's block and re-aligns: the pop removes a real block and the hit loses a
whole alignment unit (3 blocks of 16 with alignment 32: 3 -> 2 -> 1 -> 0, where
dropping first gives 2). Every EAGLE hit shorter than the window plus one block
comes out one alignment unit short of what the full-attention group reaches.

kvconform's scenario sliding-window-eagle-short-hit-realigned (scenarios/hybrid/)
found it against vLLM 0.28.0 to vLLM 0.34.0. Written by hand for vLLM 0.34.0; it
belongs in tests/v1/core/ of that release's tree and uses its test helpers.
"""

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager, make_request
from tests.v1.core.test_single_type_kv_cache_manager import get_sliding_window_manager
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

pytestmark = pytest.mark.cpu_test


def _sliding_window_spec(block_size: int, sliding_window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )


def test_eagle_hit_of_three_window_blocks_keeps_two():
    """Block 16, alignment 32, EAGLE: blocks 0..2 cached, searched up to 48 tokens
    (the candidate 32 plus EAGLE's block). EAGLE drops block 2; blocks 0 and 1
    (32 tokens, aligned) are the hit."""
    block_size, alignment = 16, 32
    spec = _sliding_window_spec(block_size, sliding_window=1024)
    block_pool = BlockPool(num_gpu_blocks=100, enable_caching=True, hash_block_size=block_size)
    get_sliding_window_manager(spec, block_pool)
    block_hashes = [BlockHash(str(i).encode()) for i in range(3)]
    for block_hash, block in zip(block_hashes, block_pool.blocks[10:13]):
        block_pool.cached_block_hash_to_block.insert(
            make_block_hash_with_group_id(block_hash, 0), block
        )

    computed_blocks, hit_length = SlidingWindowManager.find_longest_cache_hit(
        block_hashes=block_hashes,
        max_length=3 * block_size,
        kv_cache_group_ids=[0],
        block_pool=block_pool,
        kv_cache_spec=spec,
        drop_eagle_block=True,
        alignment_tokens=alignment,
    )

    assert hit_length == 2 * block_size, (
        f"3 cached blocks, EAGLE drops the last: the hit is 2 blocks ({2 * block_size} "
        f"tokens, a multiple of {alignment}), not {hit_length} tokens"
    )
    assert computed_blocks[0] == block_pool.blocks[10:12]


def _gemma4_like_config(with_sliding_window: bool) -> KVCacheConfig:
    groups = [
        KVCacheGroupSpec(
            ["full"],
            FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=1, dtype=torch.float32),
        )
    ]
    if with_sliding_window:
        groups.append(KVCacheGroupSpec(["sliding"], _sliding_window_spec(16, 1024)))
    return KVCacheConfig(num_blocks=200, kv_cache_tensors=[], kv_cache_groups=groups)


def _eagle_hit(with_sliding_window: bool, shared: int, num_tokens: int) -> int:
    """b's hit, in tokens, after a has computed its whole prompt; b shares a's
    first ``shared`` tokens."""
    init_none_hash(sha256)
    # Requests are hashed at the smallest block size of the groups.
    hash_block_size = 16 if with_sliding_window else 32
    manager = make_kv_cache_manager(
        _gemma4_like_config(with_sliding_window),
        max_model_len=2048,
        hash_block_size=hash_block_size,
        enable_caching=True,
        use_eagle=True,
    )
    a_tokens = list(range(num_tokens))
    b_tokens = a_tokens[:shared] + [10_000 + i for i in range(num_tokens - shared)]
    a = make_request("a", a_tokens, hash_block_size, sha256)
    b = make_request("b", b_tokens, hash_block_size, sha256)
    computed, num_computed, _ = manager.get_computed_blocks(a)
    assert num_computed == 0
    assert manager.allocate_slots(a, num_tokens, num_computed, computed) is not None
    _, hit, _ = manager.get_computed_blocks(b)
    return hit


@pytest.mark.parametrize("shared", [80, 112, 176])
def test_gemma4_like_eagle_hit_matches_full_attention(shared: int):
    """Full attention in blocks of 32 beside a 1024-token sliding window in blocks
    of 16, EAGLE: every hit here is shorter than the window, so the window group
    has every block of it and the hybrid's hit is full attention's alone."""
    num_tokens = 256
    full_attention_hit = _eagle_hit(False, shared, num_tokens)
    hybrid_hit = _eagle_hit(True, shared, num_tokens)
    assert full_attention_hit > 0
    assert hybrid_hit == full_attention_hit, (
        f"b shares {shared} tokens: full attention alone hits {full_attention_hit} "
        f"tokens, the hybrid {hybrid_hit}; the window (1024) covers the whole hit, so "
        "the sliding-window group must not cut it"
    )
