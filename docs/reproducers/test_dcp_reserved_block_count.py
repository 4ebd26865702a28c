"""decode-context-parallel-block-span: _reserved_block_count reserves what KVCacheManager holds.

Against vLLM 0.33.0, the scenario decode-context-parallel-block-span
(scenarios/specs/decode-context-parallel-block-span.yaml) found:

    step 0 (line 22, prefill 50) request a, group 0 (full_attention): the live
    KVCacheManager holds 2 blocks but the warmup predictor _reserved_block_count
    predicts 4 for 0 + 50 tokens with lookahead 3; step 0 (line 22, prefill 50) request
    a, group 1 (mla): the live KVCacheManager holds 2 blocks but the warmup predictor
    _reserved_block_count predicts 4 for 0 + 50 tokens with lookahead 3; and 26 more
    such records

This test replays the scenario's calls on vLLM's own KVCacheManager, as the
scheduler makes them around allocate_slots, and asks the warmup predictor
_reserved_block_count for the same token counts. It fails while the finding holds.
Written by `kvconform export decode-context-parallel-block-span --vllm-test` (kvconform 0.1.0);
it needs vLLM only.
"""

import torch  # noqa: F401 - the specs' dtypes

from vllm import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    MambaSpec,
)
from vllm.v1.request import Request, RequestStatus
from vllm.v1.worker.gpu.warmup import _reserved_block_count

MAX_MODEL_LEN = 512
NUM_BLOCKS = 80
# The lookahead vLLM reserves with (VllmConfig.num_lookahead_tokens).
LOOKAHEAD = 3
SPECS = [
    FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, head_size_v=8),
    MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16),
    MambaSpec(block_size=32, shapes=((4,),), dtypes=(torch.float16,), mamba_cache_mode='align', num_speculative_blocks=3),
]
# Per request: (first token id, prompt length) and its encoder tokens.
PROMPTS = {'a': (1000000, 50), 'b': (2000000, 300)}
ENCODER_LENS = {'a': 0, 'b': 0}
FIRST_OUTPUT = {'a': 1500000, 'b': 2500000}
# (step, request, action, computed, scheduled, rejected, sampled, first chunk)
CALLS = [
    (0, 'a', 'prefill', 0, 50, 0, 1, True),
    (0, 'b', 'prefill', 0, 300, 0, 1, True),
    (1, 'a', 'spec', 50, 4, 2, 2, False),
    (1, 'b', 'spec', 300, 4, 3, 1, False),
    (2, 'a', 'spec', 52, 4, 2, 2, False),
    (2, 'b', 'spec', 301, 4, 3, 1, False),
    (3, 'a', 'spec', 54, 4, 2, 2, False),
    (3, 'b', 'spec', 302, 4, 3, 1, False),
    (4, 'a', 'spec', 56, 4, 2, 2, False),
    (4, 'b', 'spec', 303, 4, 3, 1, False),
    (5, 'a', 'spec', 58, 4, 2, 2, False),
    (5, 'b', 'spec', 304, 4, 3, 1, False),
    (6, 'a', 'spec', 60, 4, 2, 2, False),
    (6, 'b', 'spec', 305, 4, 3, 1, False),
    (7, 'a', 'finish', 62, 0, 0, 0, False),
    (7, 'b', 'finish', 306, 0, 0, 0, False),
]
# Blocks each (step, request, group) needs: the positions written, target and drafter.
FLOORS = {
    (0, 'a', 0): 2,
    (0, 'a', 1): 2,
    (0, 'a', 2): 5,
    (0, 'b', 0): 10,
    (0, 'b', 1): 10,
    (0, 'b', 2): 13,
    (1, 'a', 0): 2,
    (1, 'a', 1): 2,
    (1, 'a', 2): 5,
    (1, 'b', 0): 10,
    (1, 'b', 1): 10,
    (1, 'b', 2): 13,
    (2, 'a', 0): 2,
    (2, 'a', 1): 2,
    (2, 'a', 2): 5,
    (2, 'b', 0): 10,
    (2, 'b', 1): 10,
    (2, 'b', 2): 13,
    (3, 'a', 0): 2,
    (3, 'a', 1): 2,
    (3, 'a', 2): 5,
    (3, 'b', 0): 10,
    (3, 'b', 1): 10,
    (3, 'b', 2): 13,
    (4, 'a', 0): 2,
    (4, 'a', 1): 2,
    (4, 'a', 2): 5,
    (4, 'b', 0): 10,
    (4, 'b', 1): 10,
    (4, 'b', 2): 13,
    (5, 'a', 0): 3,
    (5, 'a', 1): 3,
    (5, 'a', 2): 5,
    (5, 'b', 0): 10,
    (5, 'b', 1): 10,
    (5, 'b', 2): 13,
    (6, 'a', 0): 3,
    (6, 'a', 1): 3,
    (6, 'a', 2): 5,
    (6, 'b', 0): 10,
    (6, 'b', 1): 10,
    (6, 'b', 2): 13,
}


def new_manager() -> KVCacheManager:
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(SPECS)]
    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(
        kv_cache_config=config,
        max_model_len=512,
        scheduler_block_size=32,
        hash_block_size=16,
        enable_caching=False,
        dcp_world_size=2,
        log_stats=False,
        use_eagle=True,
        num_prefill_lookahead=1,
    )


def new_request(name: str) -> Request:
    first, length = PROMPTS[name]
    return Request(
        request_id=name,
        prompt_token_ids=list(range(first, first + length)),
        sampling_params=SamplingParams(max_tokens=1 << 20, ignore_eos=True),
        pooling_params=None,
        block_hasher=None,
    )


def test_decode_context_parallel_block_span():
    manager = new_manager()
    requests = {name: new_request(name) for name in PROMPTS}
    outputs = dict(FIRST_OUTPUT)
    predicted_max: dict[str, list[int]] = {}
    problems = []
    for step, name, action, computed, scheduled, rejected, sampled, first in CALLS:
        request = requests[name]
        if action in ("finish", "preempt"):
            manager.free(request)
            predicted_max.pop(name, None)
            if action == "preempt":
                request.status = RequestStatus.PREEMPTED
                request.num_computed_tokens = 0
            continue
        encoder = ENCODER_LENS[name] if first else 0
        extra = {"num_encoder_tokens": encoder} if first else {}
        blocks = manager.allocate_slots(
            request, scheduled, num_lookahead_tokens=LOOKAHEAD, **extra
        )
        assert blocks is not None, f"step {step}: the pool cannot serve {name}"
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = computed + scheduled
        held = manager.get_block_ids(name)
        maxima = predicted_max.setdefault(name, [0] * len(SPECS))
        for group, spec in enumerate(SPECS):
            predicted = _reserved_block_count(
                computed + scheduled,
                spec,
                num_lookahead_tokens=LOOKAHEAD,
                max_model_len=MAX_MODEL_LEN,
                max_encoder_len=ENCODER_LENS[name],
            )
            maxima[group] = max(maxima[group], predicted)
            live = len(held[group])
            where = f"step {step}, request {name}, group {group} ({type(spec).__name__}), "
            where += f"{computed} + {scheduled} tokens, lookahead {LOOKAHEAD}"
            if maxima[group] != live:
                problems.append(
                    f"{where}: KVCacheManager holds {live}, "
                    f"_reserved_block_count reserves {maxima[group]}"
                )
        request.num_computed_tokens -= rejected
        if sampled:
            request.append_output_token_ids(list(range(outputs[name], outputs[name] + sampled)))
            outputs[name] += sampled
    assert not problems, "\n".join(problems[:10])
