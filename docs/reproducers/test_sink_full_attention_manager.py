"""sink-full-attention-manager-builds: building and driving the KVCacheManager must not raise.

Against vLLM 0.33.0, the scenario sink-full-attention-manager-builds
(scenarios/specs/sink-full-attention-manager-builds.yaml) found:

    vLLM 0.33.0 raised TypeError: SinkFullAttentionManager.__init__() got an unexpected
    keyword argument 'needs_kv_cache_zeroing' at
    vllm/v1/core/single_type_kv_cache_manager.py:2652 in get_manager_for_kv_cache_spec

This test replays the scenario's calls on vLLM's own KVCacheManager, as the
scheduler makes them around allocate_slots, and asks the warmup predictor
_reserved_block_count for the same token counts. It fails while the finding holds.
Written by `kvconform export sink-full-attention-manager-builds --vllm-test` (kvconform 0.1.0);
it needs vLLM only.
"""

import torch  # noqa: F401 - the specs' dtypes

from vllm import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    SinkFullAttentionSpec,
)
from vllm.v1.request import Request, RequestStatus
from vllm.v1.worker.gpu.warmup import _reserved_block_count

MAX_MODEL_LEN = 512
NUM_BLOCKS = 32
# The lookahead vLLM reserves with (VllmConfig.num_lookahead_tokens).
LOOKAHEAD = 2
SPECS = [
    SinkFullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, head_size_v=8, sink_len=32),
]
# Per request: (first token id, prompt length) and its encoder tokens.
PROMPTS = {'a': (1000000, 30)}
ENCODER_LENS = {'a': 0}
FIRST_OUTPUT = {'a': 1500000}
# (step, request, action, computed, scheduled, rejected, sampled, first chunk)
CALLS = [
    (0, 'a', 'prefill', 0, 30, 0, 1, True),
    (1, 'a', 'spec', 30, 3, 2, 1, False),
    (2, 'a', 'spec', 31, 3, 2, 1, False),
    (3, 'a', 'spec', 32, 3, 2, 1, False),
    (4, 'a', 'spec', 33, 3, 2, 1, False),
    (5, 'a', 'finish', 34, 0, 0, 0, False),
]
# Blocks each (step, request, group) needs: the positions written, target and drafter.
FLOORS = {}  # none: the replay fails before it allocates


def new_manager() -> KVCacheManager:
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(SPECS)]
    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(
        kv_cache_config=config,
        max_model_len=512,
        scheduler_block_size=16,
        hash_block_size=16,
        enable_caching=False,
        dcp_world_size=1,
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


def test_sink_full_attention_manager_builds():
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
        request.num_computed_tokens -= rejected
        if sampled:
            request.append_output_token_ids(list(range(outputs[name], outputs[name] + sampled)))
            outputs[name] += sampled
    assert not problems, "\n".join(problems[:10])
