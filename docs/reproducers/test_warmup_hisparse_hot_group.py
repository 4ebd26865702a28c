# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The V2 mixed warmup must reserve for a HiSparse hot group what the scheduler reserves.

A HiSparse layout's hot group (HiSparseHotSpec) holds nothing for a request until it
needs host-backed history, then exactly blocks_per_request blocks: its block-table row
has blocks_per_request columns (HiSparseHotSpec.max_num_blocks_per_req).
_reserved_block_count has no HiSparse case and counts the hot group by tokens plus the
lookahead, like full attention, so a warmup request longer than blocks_per_request x
block_size - lookahead tokens is given more hot blocks than its row holds.

Written by hand for kvconform's finding #4 (docs/findings.md): kvconform's HiSparse
scenarios leave the hot group out of the predictor comparison, so no scenario failure
exports it. Against vLLM
0.33.0 (HiSparse exists from 0.30.0). It belongs in tests/v1/worker/ and uses the
HiSparse layout helpers of tests/v1/core/test_prefix_caching.py.
"""

from types import SimpleNamespace

import pytest

from tests.v1.core.test_prefix_caching import (
    HISPARSE_BLOCK_SIZE,
    make_hisparse_kv_cache_config,
    make_hisparse_kv_cache_manager,
)
from tests.v1.core.utils import create_requests
from vllm.v1.kv_cache_interface import HiSparseHotSpec
from vllm.v1.worker.gpu.warmup import run_mixed_prefill_decode_warmup

MAX_MODEL_LEN = 512
NUM_SPEC_STEPS = 3
NUM_LOOKAHEAD_TOKENS = 3  # VllmConfig.num_lookahead_tokens (EAGLE family, k = 3)
NUM_BLOCKS = 1024


def _make_runner(kv_cache_config) -> SimpleNamespace:
    """Stub model runner exposing only what the warmup entry points read."""
    return SimpleNamespace(
        num_speculative_steps=NUM_SPEC_STEPS,
        speculative_config=SimpleNamespace(),
        adaptive_verification=None,
        rejection_sampler=None,
        decode_query_len=NUM_SPEC_STEPS + 1,
        is_pooling_model=False,
        is_encoder_decoder=False,
        is_last_pp_rank=True,
        max_num_reqs=4,
        max_model_len=MAX_MODEL_LEN,
        model_config=SimpleNamespace(get_vocab_size=lambda: 64),
        model_state=SimpleNamespace(max_encoder_len=0),
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=2048),
        kv_cache_config=kv_cache_config,
        vllm_config=SimpleNamespace(
            num_lookahead_tokens=NUM_LOOKAHEAD_TOKENS, is_mm_encoder_only=False
        ),
        kv_block_zeroer=None,
        kv_connector=SimpleNamespace(set_disabled=lambda disabled: None),
    )


class _StepRecorder:
    """Per warmup request, its steps: (num_computed, num_scheduled, blocks held per group)."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[int, int, list[int]]]] = {}
        self._held: dict[str, list[int]] = {}

    def execute_model(self, scheduler_output) -> None:
        for new_req in scheduler_output.scheduled_new_reqs:
            self._held[new_req.req_id] = [len(ids) for ids in new_req.block_ids]
            self._record(new_req.req_id, new_req.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_block_ids = cached.new_block_ids[i]
            if new_block_ids is not None:
                self._held[req_id] = [
                    held + len(ids)
                    for held, ids in zip(self._held[req_id], new_block_ids)
                ]
            self._record(req_id, cached.num_computed_tokens[i], scheduler_output)

    def _record(self, req_id: str, num_computed: int, scheduler_output) -> None:
        num_scheduled = scheduler_output.num_scheduled_tokens[req_id]
        self.steps.setdefault(req_id, []).append(
            (num_computed, num_scheduled, list(self._held[req_id]))
        )

    def sample_tokens(self, grammar_output=None) -> None:
        return None


def _scheduler_hot_blocks(
    steps: list[tuple[int, int, list[int]]], hot: list[int]
) -> list[int]:
    """The hot groups' blocks a KVCacheManager of the same layout holds after each step."""
    manager = make_hisparse_kv_cache_manager(
        num_blocks=NUM_BLOCKS, host_num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN
    )
    num_computed, num_scheduled, _ = steps[-1]
    (request,) = create_requests(
        num_requests=1,
        num_tokens=num_computed + num_scheduled,
        block_size=HISPARSE_BLOCK_SIZE,
    )
    held = []
    for num_computed, num_scheduled, _ in steps:
        request.num_computed_tokens = num_computed
        blocks = manager.allocate_slots(
            request, num_scheduled, num_lookahead_tokens=NUM_LOOKAHEAD_TOKENS
        )
        assert blocks is not None, f"{NUM_BLOCKS} blocks cannot serve the step"
        ids = manager.get_block_ids(request.request_id)
        held.append(sum(len(ids[g]) for g in hot))
    return held


@pytest.mark.parametrize("num_tokens", [16, 64, 256])
def test_warmup_hisparse_hot_group(num_tokens: int):
    kv_cache_config = make_hisparse_kv_cache_config(NUM_BLOCKS, NUM_BLOCKS)
    groups = kv_cache_config.kv_cache_groups
    hot = [
        i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, HiSparseHotSpec)
    ]
    recorder = _StepRecorder()
    assert run_mixed_prefill_decode_warmup(
        _make_runner(kv_cache_config),
        worker_execute_model=recorder.execute_model,
        worker_sample_tokens=recorder.sample_tokens,
        num_tokens=num_tokens,
    ), "the mixed warmup skipped itself"

    for req_id, steps in recorder.steps.items():
        warmup = [sum(held[g] for g in hot) for _, _, held in steps]
        expected = _scheduler_hot_blocks(steps, hot)
        assert warmup == expected, (
            f"{req_id}, steps (computed, scheduled) {[s[:2] for s in steps]}: the warmup "
            f"gives the hot group {warmup} blocks, KVCacheManager {expected}. The warmup "
            "must reserve what the scheduler reserves: the hot manager holds nothing for a "
            "request without host-backed history (a warmup request never has any), and "
            "its block-table row has only blocks_per_request columns"
        )
