# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The V2 mixed warmup must reserve the KV blocks the scheduler would reserve.

run_mixed_prefill_decode_warmup hand-builds its SchedulerOutputs and sizes every request
with _warmup_block_counter; what it hands the model runner must be what
KVCacheManager.allocate_slots gives the same request at the same step, or the warmup
reserves other blocks than serving does (the mixed warmup's requests carry no encoder
input (mm_features=[]), and the scheduler reserves cross-attention blocks only for the
encoder tokens it schedules).

kvconform's scenario warmup-encoder-decoder-mixed (scenarios/warmup/warmup-encoder-
decoder-mixed.yaml) found against vLLM 0.33.0:

    step 0 (run_mixed_prefill_decode_warmup #1: prefill 2) request
    _v2_mixed_warmup_decode_, group 1 (cross_attention): the live KVCacheManager
    holds 0 blocks but the warmup predictor _reserved_block_count predicts 13 for 0
    + 2 tokens with lookahead 0; step 1 (run_mixed_prefill_decode_warmup #2: prefill
    63) request _v2_mixed_warmup_prefill_, group 1 (cross_attention): the live
    KVCacheManager holds 0 blocks but the warmup predictor _reserved_block_count
    predicts 13 for 0 + 63 tokens with lookahead 0; and 1 more such records

Written by `kvconform export warmup-encoder-decoder-mixed --vllm-test` (kvconform 0.1.0)
against vLLM 0.33.0; it belongs in tests/v1/worker/ of that release's tree and uses its
test helpers.
"""

from types import SimpleNamespace

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager
from tests.v1.core.utils import create_requests
from vllm.v1.kv_cache_interface import (
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.worker.gpu.warmup import run_mixed_prefill_decode_warmup

HASH_BLOCK_SIZE = 16
SCHEDULER_BLOCK_SIZE = 16
MAX_MODEL_LEN = 448
MAX_ENCODER_LEN = 200
NUM_SPEC_STEPS = 0
NUM_LOOKAHEAD_TOKENS = 0  # VllmConfig.num_lookahead_tokens
NUM_BLOCKS = 1024


def _kv_cache_groups() -> list[KVCacheGroupSpec]:
    specs = [
        FullAttentionSpec(
            block_size=16,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float16,
            head_size_v=8,
        ),
        CrossAttentionSpec(
            block_size=16,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float16,
            head_size_v=8,
        ),
    ]
    return [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]


def _kv_cache_config() -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=_kv_cache_groups()
    )


def _make_runner(dcp_world_size: int) -> SimpleNamespace:
    """Stub model runner exposing only what the warmup entry points read."""
    return SimpleNamespace(
        num_speculative_steps=NUM_SPEC_STEPS,
        speculative_config=SimpleNamespace() if NUM_SPEC_STEPS else None,
        adaptive_verification=None,
        rejection_sampler=None,
        decode_query_len=NUM_SPEC_STEPS + 1,
        is_pooling_model=False,
        is_encoder_decoder=True,
        is_last_pp_rank=True,
        max_num_reqs=4,
        max_model_len=MAX_MODEL_LEN,
        dcp_size=dcp_world_size,
        model_config=SimpleNamespace(get_vocab_size=lambda: 64),
        model_state=SimpleNamespace(max_encoder_len=MAX_ENCODER_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=2048),
        kv_cache_config=SimpleNamespace(
            kv_cache_groups=_kv_cache_groups(), num_blocks=NUM_BLOCKS
        ),
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


def _scheduler_holds(
    steps: list[tuple[int, int, list[int]]], dcp_world_size: int
) -> list[list[int]]:
    """What KVCacheManager holds per group after each step of one request, allocated as
    the scheduler allocates (no encoder tokens: the warmup's requests carry none)."""
    manager = make_kv_cache_manager(
        _kv_cache_config(),
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        enable_caching=False,
        dcp_world_size=dcp_world_size,
    )
    num_computed, num_scheduled, _ = steps[-1]
    (request,) = create_requests(
        num_requests=1,
        num_tokens=num_computed + num_scheduled,
        block_size=HASH_BLOCK_SIZE,
    )
    held = []
    for num_computed, num_scheduled, _ in steps:
        request.num_computed_tokens = num_computed
        blocks = manager.allocate_slots(
            request, num_scheduled, num_lookahead_tokens=NUM_LOOKAHEAD_TOKENS
        )
        assert blocks is not None, f"{NUM_BLOCKS} blocks cannot serve the step"
        held.append([len(ids) for ids in manager.get_block_ids(request.request_id)])
    return held


@pytest.mark.parametrize("dcp_world_size", [1])
@pytest.mark.parametrize("num_tokens", [64])
def test_warmup_encoder_decoder_mixed(num_tokens: int, dcp_world_size: int):
    recorder = _StepRecorder()
    assert run_mixed_prefill_decode_warmup(
        _make_runner(dcp_world_size),
        worker_execute_model=recorder.execute_model,
        worker_sample_tokens=recorder.sample_tokens,
        num_tokens=num_tokens,
    ), "the mixed warmup skipped itself"

    for req_id, steps in recorder.steps.items():
        expected = _scheduler_holds(steps, dcp_world_size)
        warmup = [held for _, _, held in steps]
        assert warmup == expected, (
            f"{req_id}, steps (computed, scheduled) {[s[:2] for s in steps]}: the warmup "
            f"holds {warmup} blocks per group, KVCacheManager.allocate_slots {expected}. "
            "The warmup must reserve what the scheduler reserves: the mixed warmup's "
            "requests carry no encoder input (mm_features=[]), and the scheduler "
            "reserves cross-attention blocks only for the encoder tokens it schedules"
        )
