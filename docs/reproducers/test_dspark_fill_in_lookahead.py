# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VllmConfig.num_lookahead_tokens must reserve what dspark's drafter writes.

The scheduler and the warmup both reserve VllmConfig.num_lookahead_tokens KV slots past
the scheduled tokens, where the drafter writes. dspark: anchor sampling drafts k queries
starting at the anchor; the fill-in layout (sample_from_anchor: false) adds a bonus
query like DFlash. A lookahead one short leaves the drafter's last query without a block
at a block boundary.

kvconform's scenario dspark-fill-in-lookahead (scenarios/regressions/dspark-fill-in-
lookahead.yaml) found against vLLM 0.31.0:

    VllmConfig.num_lookahead_tokens is 3 for method 'dspark' with k=3, but the
    drafter needs k (anchor) | k + 1 (fill-in) = 4 (anchor sampling drafts k queries
    starting at the anchor; the fill-in layout (sample_from_anchor: false) adds a
    bonus query like DFlash; the rule of kvconform/model/methods.py)

Written by `kvconform export dspark-fill-in-lookahead --vllm-test` (kvconform 0.1.0)
against vLLM 0.31.0; it belongs in tests/v1/worker/ of that release's tree and uses its
test helpers.
"""

from types import SimpleNamespace

import pytest

from vllm.config.speculative import SpeculativeConfig
from vllm.config.vllm import VllmConfig

NUM_SPEC_STEPS = 3


def _config(method: str, draft_hf_config: dict) -> VllmConfig:
    """A real VllmConfig built without __post_init__ (which needs a resolvable draft
    model); the lookahead property reads the speculative and diffusion configs only."""
    speculative_config = object.__new__(SpeculativeConfig)
    object.__setattr__(speculative_config, "method", method)
    object.__setattr__(speculative_config, "num_speculative_tokens", NUM_SPEC_STEPS)
    object.__setattr__(
        speculative_config,
        "draft_model_config",
        SimpleNamespace(hf_config=SimpleNamespace(**draft_hf_config)),
    )
    config = object.__new__(VllmConfig)
    object.__setattr__(config, "speculative_config", speculative_config)
    object.__setattr__(config, "diffusion_config", None)
    return config


@pytest.mark.parametrize(
    ("draft_hf_config", "expected"),
    [
        ({"sample_from_anchor": True}, NUM_SPEC_STEPS),
        ({"sample_from_anchor": False}, NUM_SPEC_STEPS + 1),
    ],
)
def test_dspark_fill_in_lookahead(draft_hf_config: dict, expected: int):
    config = _config("dspark", draft_hf_config)
    assert config.num_lookahead_tokens == expected, (
        f"dspark with {draft_hf_config}: num_lookahead_tokens is "
        f"{config.num_lookahead_tokens}, but the drafter writes {expected} KV positions "
        "past the scheduled range (k (anchor) | k + 1 (fill-in): anchor sampling drafts"
        " k queries starting at the anchor; the fill-in layout (sample_from_anchor: "
        "false) adds a bonus query like DFlash); the scheduler and the warmup reserve "
        "num_lookahead_tokens, so the drafter's last query lands outside the request's "
        "blocks at a block boundary"
    )
