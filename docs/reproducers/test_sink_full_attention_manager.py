# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""KVCacheManager must build and reserve for a SinkFullAttentionSpec group.

Every registered spec gets its manager, and a SinkFullAttentionSpec group's table is
indexed by token position: after allocate_slots a request holds cdiv(num_tokens +
num_lookahead_tokens, block_size) blocks, the columns the target and the drafter write.

kvconform's scenario sink-full-attention-manager-builds (scenarios/specs/sink-full-
attention-manager-builds.yaml) found against vLLM 0.33.0:

    vLLM 0.33.0 raised TypeError: SinkFullAttentionManager.__init__() got an
    unexpected keyword argument 'needs_kv_cache_zeroing' at
    vllm/v1/core/single_type_kv_cache_manager.py:2652 in
    get_manager_for_kv_cache_spec

Written by `kvconform export sink-full-attention-manager-builds --vllm-test` (kvconform
0.1.0) against vLLM 0.33.0; it belongs in tests/v1/core/ of that release's tree and uses
its test helpers.
"""

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager
from tests.v1.core.utils import create_requests
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    SinkFullAttentionSpec,
)

HASH_BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
NUM_BLOCKS = 32


def _kv_cache_groups() -> list[KVCacheGroupSpec]:
    specs = [
        SinkFullAttentionSpec(
            block_size=16,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float16,
            head_size_v=8,
            sink_len=32,
        ),
    ]
    return [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]


def _kv_cache_config() -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=_kv_cache_groups()
    )


@pytest.mark.parametrize("num_lookahead_tokens", [0, 2])
@pytest.mark.parametrize("num_tokens", [30])
def test_sink_full_attention_manager_builds(num_tokens: int, num_lookahead_tokens: int):
    try:
        manager = make_kv_cache_manager(
            _kv_cache_config(),
            max_model_len=MAX_MODEL_LEN,
            hash_block_size=HASH_BLOCK_SIZE,
            enable_caching=False,
        )
    except TypeError as exc:
        pytest.fail(
            "KVCacheManager must build a manager for every spec it registers; the "
            "coordinator passes every manager the same keywords, so a manager "
            "that spells out its own list breaks when one is added: "
            f"{type(exc).__name__}: {exc}"
        )
    (request,) = create_requests(
        num_requests=1, num_tokens=num_tokens, block_size=HASH_BLOCK_SIZE
    )
    blocks = manager.allocate_slots(
        request, num_tokens, num_lookahead_tokens=num_lookahead_tokens
    )
    assert blocks is not None, f"{NUM_BLOCKS} blocks cannot serve {num_tokens} tokens"

    held = [len(ids) for ids in manager.get_block_ids(request.request_id)]
    num_written = min(num_tokens + num_lookahead_tokens, MAX_MODEL_LEN)
    need = [
        cdiv(num_written, group.kv_cache_spec.block_size)
        for group in _kv_cache_groups()
    ]
    assert all(h >= n for h, n in zip(held, need)), (
        f"{num_tokens} tokens, lookahead {num_lookahead_tokens}: the manager holds {held} "
        f"blocks per group, but the target and the drafter write {need} blocks' worth of "
        "positions; a position past the held blocks is written wherever its block-table "
        "column points"
    )
