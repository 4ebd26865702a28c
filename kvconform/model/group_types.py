"""The KV-cache group types a scenario can name, as plain data.

A scenario says ``groups: [full_attention, {type: mamba, mamba_cache_mode:
align}]``; this module is the vocabulary of that list. Each :class:`GroupType`
names the vLLM ``KVCacheSpec`` class it becomes, the options the scenario may
set (with their defaults), and whether the group's block table may legitimately
hold the null block (a placeholder for blocks the allocator has dropped or never
needed).

Nothing here imports vLLM: the loader validates scenarios with this table
before vLLM is even imported, and :mod:`kvconform.oracles.specs` turns a
validated group into a vLLM spec object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Option:
    """One option of a group type: its Python type and default."""

    kind: type
    default: object = None
    required: bool = False
    choices: tuple[object, ...] = ()
    doc: str = ""


@dataclass(frozen=True)
class GroupType:
    name: str
    vllm_class: str
    doc: str
    options: Mapping[str, Option] = field(default_factory=dict)
    # Sliding windows, chunked-local attention, R-SWA and Mamba "align" keep one
    # column per block of tokens and put the null block where a block has been
    # dropped (or was never needed); every other type must never show it.
    holds_null: bool = False
    # Attention that reads only a recent span of positions: ("window", option) for a
    # sliding window of that many tokens, ("chunk", option) for chunked local attention
    # (the positions of the token's own chunk). The blocks of that span must be real
    # blocks (model/floors.py: first_position_read); None: no such span is checked.
    reads: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


_WINDOW = Option(int, required=True, doc="window size in tokens")
# vLLM's planner tags every sliding-window spec with max(0, num_prefill_lookahead_tokens - 1)
# (kv_cache_planning.get_global_kv_cache_groups): k - 1 under multi-module MTP, else 0.
# None builds the spec without it (vLLM's default, 0); the loader admits only k - 1.
_EXTRA_RETAINED = Option(
    int, None, doc="trailing tokens kept below the window (multi-module MTP: k - 1)"
)

GROUP_TYPES: Mapping[str, GroupType] = MappingProxyType(
    {
        t.name: t
        for t in (
            GroupType("full_attention", "FullAttentionSpec", "Full attention."),
            GroupType("mla", "MLAAttentionSpec", "Multi-head latent attention."),
            GroupType(
                "sliding_window",
                "SlidingWindowSpec",
                "Sliding-window attention; blocks that leave the window become null.",
                {"sliding_window": _WINDOW, "extra_retained_tokens": _EXTRA_RETAINED},
                holds_null=True,
                reads=("window", "sliding_window"),
            ),
            GroupType(
                "sliding_window_mla",
                "SlidingWindowMLASpec",
                "Sliding-window MLA.",
                {
                    "sliding_window": _WINDOW,
                    "extra_retained_tokens": _EXTRA_RETAINED,
                    # DeepSeek V4.1's SWA bounded replay (prefix_replay_tokens = the
                    # window): the group is left out of prefix caching and the scheduler
                    # recomputes the last window of a hit instead.
                    "bounded_replay": Option(
                        bool, default=False, doc="DeepSeek V4.1's SWA bounded replay"
                    ),
                },
                holds_null=True,
                reads=("window", "sliding_window"),
            ),
            GroupType(
                "chunked_local",
                "ChunkedLocalAttentionSpec",
                "Chunked local attention; blocks of finished chunks become null.",
                {"attention_chunk_size": Option(int, required=True, doc="chunk size in tokens")},
                holds_null=True,
                reads=("chunk", "attention_chunk_size"),
            ),
            GroupType(
                "rswa",
                "RSWASpec",
                "Reference sliding-window attention: prompt kept, decode window slides.",
                {"rswa_window": _WINDOW},
                holds_null=True,
            ),
            GroupType(
                "mamba",
                "MambaSpec",
                "Mamba state. 'align' keeps block-aligned states with nulls between.",
                {
                    "mamba_cache_mode": Option(
                        str, "none", choices=("none", "align", "all"), doc="vLLM's mamba_cache_mode"
                    ),
                    "num_speculative_blocks": Option(
                        int,
                        None,
                        doc="speculative state blocks; default num_speculative_tokens, "
                        "as vLLM's MambaBase.get_kv_cache_spec sets it",
                    ),
                    "num_prefill_checkpoint_blocks": Option(
                        int,
                        None,
                        doc="align only: a reserved column the worker exports a mid-chunk "
                        "prefill checkpoint into (vLLM's Mamba2/GDN layers set 1)",
                    ),
                    "prefill_checkpoint_alignment": Option(
                        int,
                        None,
                        doc="tokens the checkpoint must lie from the chunk start in multiples "
                        "of (the kernel's chunk grid; Mamba2 sets 1)",
                    ),
                },
                holds_null=True,
            ),
            GroupType(
                "cross_attention",
                "CrossAttentionSpec",
                "Cross-attention of an encoder-decoder model; sized by the encoder length.",
            ),
            GroupType(
                "circular_buffer",
                "CircularBufferSpec",
                "One ring block per request for its whole lifetime.",
            ),
            GroupType(
                "sink_full_attention",
                "SinkFullAttentionSpec",
                "Full attention with attention-sink tokens.",
                {
                    "sink_len": Option(
                        int, required=True, doc="sink tokens, a multiple of block_size"
                    )
                },
            ),
            GroupType(
                "hidden_state",
                "HiddenStateCacheSpec",
                "Hidden-state cache of extract_hidden_states (MLA layout).",
            ),
            GroupType(
                "kpool_tail",
                "KpoolTailSpec",
                "K-pool tail (vLLM 0.30-0.31 only).",
                {"sliding_window": _WINDOW},
                holds_null=True,
            ),
        )
    }
)

# vLLM spec classes that kvconform deliberately does not build, with why. A
# class vLLM offers that is neither here nor in GROUP_TYPES shows up in
# `kvconform doctor` and in the coverage report as new.
NOT_BUILDABLE: Mapping[str, str] = MappingProxyType(
    {
        "KVCacheSpec": "abstract base class",
        "AttentionSpec": "abstract base class",
        "UniformTypeKVCacheSpecs": "a wrapper of several specs of one type, not a group type",
        "EncoderOnlyAttentionSpec": "encoder-only layers hold no KV blocks (no manager is registered)",
        # vLLM builds these only inside its HiSparse layout: a host-resident MLA
        # source group (role HISPARSE_SOURCE) with its own host pool, bound to a
        # HiSparseCoordinator that the HiSparse KV connector drives. Standalone,
        # the resident manager asserts on free (no coordinator) and the hot
        # manager legitimately holds nothing for a cold request, so a scenario
        # group of either type would report vLLM crashes and shortfalls that
        # no real configuration has. See docs/findings.md (HiSparse).
        "HiSparseHotSpec": "exists only inside vLLM's HiSparse layout (host source group, "
        "host pool, coordinator, connector), which kvconform does not build",
        "HiSparseResidentSpec": "exists only inside vLLM's HiSparse layout (host source group, "
        "host pool, coordinator, connector), which kvconform does not build",
    }
)


def group_type_for_class(class_name: str) -> GroupType | None:
    for group_type in GROUP_TYPES.values():
        if group_type.vllm_class == class_name:
            return group_type
    return None
