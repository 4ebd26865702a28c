"""Which vLLM groups kvconform builds, and how it reads their block span.

Two false alarms found while building the corpus, each pinned here:
HiSparse groups are not buildable on their own (vLLM builds them only inside its
HiSparse layout), and releases without ``KVCacheSpec.dcp_sharded`` scale every
group's block by the DCP world size.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvconform.errors import ScenarioError
from kvconform.fronts.doctor import doctor
from kvconform.harness.loader import load_text
from kvconform.model.group_types import GROUP_TYPES, NOT_BUILDABLE


@pytest.mark.parametrize(
    "group", ["{type: hisparse_hot, blocks_per_request: 4}", "hisparse_resident"]
)
def test_hisparse_groups_are_rejected_with_their_location(group):
    text = f"model:\n  groups:\n    - {group}\nrequests: {{a: {{prompt_len: 4}}}}\nsteps: [{{a: {{prefill: 4}}}}]\n"
    with pytest.raises(ScenarioError) as caught:
        load_text(text, "hs.yaml")
    message = str(caught.value)
    assert message.startswith("hs.yaml:3: model.groups[0].type: unknown group type")
    assert "full_attention" in message


def test_doctor_says_why_hisparse_is_not_built(vllm):
    lines: list[str] = []
    doctor(vllm, lines.append)
    text = "\n".join(lines)
    for cls in ("HiSparseHotSpec", "HiSparseResidentSpec"):
        assert cls in NOT_BUILDABLE
        assert not any(t.vllm_class == cls for t in GROUP_TYPES.values())
        (line,) = [line for line in text.splitlines() if cls in line]
        assert "HiSparse layout" in line


def test_dcp_span_follows_the_spec_and_defaults_to_every_group(vllm):
    assert vllm.dcp_sharded(vllm.build_spec("full_attention", 16, {})) is True
    assert vllm.dcp_sharded(vllm.build_spec("mamba", 16, {"mamba_cache_mode": "none"})) is False
    # vLLM 0.28-0.30 specs have no dcp_sharded field; their managers scale every group.
    assert vllm.dcp_sharded(SimpleNamespace(block_size=16)) is True
