# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A padded spec-decode row keeps one token plus its drafts under a small threshold.

``Scheduler.schedule`` pads a waiting request with one token to compute (here a
full prefix-cache hit) to ``1 + num_spec_tokens`` rows with placeholder drafts,
then clips it to ``long_prefill_token_threshold``, which is in force while
another request runs. A threshold below ``1 + num_spec_tokens`` leaves the
padding flag set on a shorter row, and ``if pad_spec_decode: assert
num_new_tokens == 1 + self.num_spec_tokens`` raises (0.29.0 on; before, the
worker got 2 tokens with 3 placeholder drafts). The open vllm#54028 skips the
padding there.

kvconform's scenario sched-spec-decode-pad-clipped-by-long-prefill-threshold
(scenarios/scheduler/) found it against vLLM 0.29.0 to vLLM 0.34.0. Written by
hand for vLLM 0.34.0; it belongs in tests/v1/core/ of that release's tree and
uses its test helpers.
"""

from tests.v1.core.test_scheduler import _model_output
from tests.v1.core.utils import create_requests, create_scheduler
from vllm.v1.outputs import DraftTokenIds


def test_spec_decode_padding_respects_long_prefill_threshold():
    num_spec = 3
    scheduler = create_scheduler(
        num_speculative_tokens=num_spec,
        enable_prefix_caching=True,
        long_prefill_token_threshold=2,
        block_size=16,
    )
    r1, r2 = create_requests(num_requests=2, num_tokens=33, same_prompt=True, max_tokens=16)
    scheduler.add_request(r1)
    out = scheduler.schedule()
    _model_output(scheduler, out, [[100]])
    scheduler.update_draft_token_ids(DraftTokenIds([r1.request_id], [[1, 2, 3]]))

    # r2's whole prompt but its last token is a prefix-cache hit; with r1 running
    # the threshold (2) is in force.
    scheduler.add_request(r2)
    out = scheduler.schedule()

    for req_id, num_tokens in out.num_scheduled_tokens.items():
        drafts = out.scheduled_spec_decode_tokens.get(req_id, [])
        assert num_tokens == 1 + len(drafts), (req_id, num_tokens, drafts)
