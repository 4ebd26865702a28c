"""Which vLLM groups kvconform builds, and how it reads their block span.

Two false alarms found while building the corpus, each pinned here:
HiSparse groups are not buildable on their own (vLLM builds them only inside its
HiSparse layout, which kvconform builds whole), and releases without
``KVCacheSpec.dcp_sharded`` scale every group's block by the DCP world size.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvconform.errors import ScenarioError
from kvconform.fronts.doctor import doctor
from kvconform.harness.loader import load_text
from kvconform.model.group_types import GROUP_TYPES, NOT_BUILDABLE

HISPARSE_LAYOUT = (
    "    - hisparse_source\n    - hisparse_indexer\n    - hisparse_resident\n"
    "    - {type: hisparse_hot, blocks_per_request: 4}\n"
)


def _hisparse_text(groups: str, host: str = "  hisparse_host_blocks: 16\n") -> str:
    return (
        f"model:\n{host}  groups:\n{groups}requests: {{a: {{prompt_len: 4}}}}\n"
        "steps: [{a: {prefill: 4}}]\n"
    )


@pytest.mark.parametrize(
    "groups",
    [
        "    - {type: hisparse_hot, blocks_per_request: 4}\n",
        "    - hisparse_resident\n",
        "    - hisparse_indexer\n    - hisparse_source\n    - hisparse_resident\n"
        "    - hisparse_hot\n",
    ],
)
def test_hisparse_groups_come_only_as_vllms_layout(groups):
    # vLLM builds HiSparse's groups only together (vllm/v1/hisparse/layout.py); alone, the
    # resident manager asserts on free and the hot one holds nothing: false alarms.
    with pytest.raises(ScenarioError) as caught:
        load_text(_hisparse_text(groups), "hs.yaml")
    message = str(caught.value)
    assert message.startswith("hs.yaml:4: model.groups[0]: HiSparse's groups come as vLLM's")


def test_the_hisparse_layout_needs_its_host_pool_and_the_pool_its_layout():
    layout = load_text(_hisparse_text(HISPARSE_LAYOUT), "hs.yaml")[0].model
    assert layout.hisparse_host_blocks == 16
    assert [g.type for g in layout.groups][:2] == ["hisparse_source", "hisparse_indexer"]
    with pytest.raises(ScenarioError, match="needs its host pool: model.hisparse_host_blocks"):
        load_text(_hisparse_text(HISPARSE_LAYOUT, host=""), "hs.yaml")
    with pytest.raises(ScenarioError, match="has no HiSparse groups") as caught:
        load_text(_hisparse_text("    - full_attention\n"), "hs.yaml")
    assert caught.value.where.field == "model.hisparse_host_blocks"


def test_doctor_counts_the_hisparse_specs_as_built(vllm):
    lines: list[str] = []
    doctor(vllm, lines.append)
    text = "\n".join(lines)
    for cls in ("HiSparseHotSpec", "HiSparseResidentSpec"):
        assert cls not in NOT_BUILDABLE
        assert any(t.vllm_class == cls and t.hisparse for t in GROUP_TYPES.values())
        assert not any(cls in line and "not built" in line for line in text.splitlines())


def test_dcp_span_follows_the_spec_and_defaults_to_every_group(vllm):
    assert vllm.dcp_sharded(vllm.build_spec("full_attention", 16, {})) is True
    assert vllm.dcp_sharded(vllm.build_spec("mamba", 16, {"mamba_cache_mode": "none"})) is False
    # vLLM 0.28-0.30 specs have no dcp_sharded field; their managers scale every group.
    assert vllm.dcp_sharded(SimpleNamespace(block_size=16)) is True
