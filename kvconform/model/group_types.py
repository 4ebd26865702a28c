"""The KV-cache group types a scenario can name: one registry entry per type.

A scenario says ``groups: [full_attention, {type: mamba, mamba_cache_mode:
align}]``; this module is the vocabulary of that list, and the one place that
knows what each type is. A :class:`GroupType` entry says:

* how a scenario names it (``name``) and the options it may set, with their
  defaults, choices and how the fuzzer draws them (:class:`Option`, :class:`Draw`);
* the vLLM ``KVCacheSpec`` class it becomes, by name (``vllm_class``);
* its floor rule, the contract a party is held to (:mod:`kvconform.model.floors`),
  chosen by an option where the type has several layouts (Mamba "align");
* whether its block table may hold the null block, and the span of positions a
  step of it reads (windowed attention);
* which scenario kinds take it (``modes``) and what else kvconform needs to know
  about it (encoder input, prefix-cache retention, speculative state blocks).

Every other module reads these entries; none spells a type's name. Adding a group
type is one entry here plus, where its behaviour is new, a floor rule.

Nothing here imports vLLM: the loader validates scenarios with this table
before vLLM is even imported, and :mod:`kvconform.oracles.vllm` turns a
validated group into a vLLM spec object by ``vllm_class``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kvconform.model.floors import (
    ENCODER_COLUMNS,
    HOT_REGION,
    MAMBA_ALIGNED_STATE,
    MAMBA_STATE,
    ONE_RING_BLOCK,
    TOKEN_COLUMNS,
    WINDOWED_COLUMNS,
    FloorRule,
)
from kvconform.model.kinds import EVERY_KIND_WITH_GROUPS, Kind


@dataclass(frozen=True)
class Draw:
    """How the fuzzer draws an option, as data (:mod:`kvconform.fuzz.strategies`).

    ``tokens``: any count of tokens from ``low`` to ``high`` blocks' worth;
    ``blocks``: a whole number of blocks, ``low`` to ``high`` of them;
    ``offered``: one of the values the loaded vLLM accepts for the option, the
    option's default first (so that the fuzzer shrinks towards it).
    """

    kind: str
    low: int = 1
    high: int = 1


@dataclass(frozen=True)
class Option:
    """One option of a group type: its Python type and default."""

    kind: type
    default: object = None
    required: bool = False
    choices: tuple[object, ...] = ()
    doc: str = ""
    # How the fuzzer draws it; None: the fuzzer leaves it at its default.
    draw: Draw | None = None
    # The simplest legal value at block size 16, for the fuzzer's probe of the type.
    probe: object = None
    # vLLM's literal type (``module.Name``) listing the values its config accepts,
    # where that is narrower than ``choices``; the fuzzer draws only those.
    vllm_literal: str | None = None
    # Left out, the option follows prefix caching as vLLM derives it: {caching on or
    # off: value}; a stated value implies the caching setting it follows from.
    follows_caching: Mapping[bool, object] | None = None


@dataclass(frozen=True)
class GroupType:
    name: str
    vllm_class: str
    doc: str
    floor: FloorRule
    options: Mapping[str, Option] = field(default_factory=dict)
    # An option that picks another floor rule: (option, {value: rule}).
    floor_by: tuple[str, Mapping[object, FloorRule]] | None = None
    # Sliding windows, chunked-local attention, R-SWA and Mamba "align" keep one
    # column per block of tokens and put the null block where a block has been
    # dropped (or was never needed); every other type must never show it.
    holds_null: bool = False
    # Attention that reads only a recent span of positions: ("window", option) for a
    # sliding window of that many tokens, ("chunk", option) for chunked local attention
    # (the positions of the token's own chunk). The blocks of that span must be real
    # blocks (model/floors.py: first_position_read); None: no such span is checked.
    reads: tuple[str, str] | None = None
    # The scenario kinds that take this type.
    modes: frozenset[str] = EVERY_KIND_WITH_GROUPS
    # Sized by the request's encoder input (an encoder-decoder model).
    encoder: bool = False
    # vLLM's prefix-cache retention interval sparsifies this type's checkpoints.
    retention: bool = False
    # The option holding speculative state blocks, which default to one per
    # speculative token (vLLM's MambaBase.get_kv_cache_spec); None: the type has none.
    speculative_blocks: str | None = None
    # vLLM caches this type's prefixes only when every group has its block size
    # (ChunkedLocalAttentionManager.find_longest_cache_hit asserts it): the fuzzer draws
    # such a model with prefix caching off.
    caching_needs_one_block_size: bool = False
    # vLLM's manager asserts that no EAGLE block drop reaches its prefix-cache lookup
    # (ChunkedLocalAttentionManager.find_longest_cache_hit: "Hybrid KV cache is not
    # supported for eagle + chunked local attention"): the explorer draws no
    # disable_lookahead_block_hashes beside it with prefix caching on.
    caching_refuses_block_drop: bool = False
    # Attention (KV per token); False for a recurrent state (Mamba). vLLM's default for
    # prefix caching depends on the model's attention type (ModelConfig.attn_type).
    attention: bool = True
    # Whether the fuzzer draws the type at all, and where it ranks it (Hypothesis
    # shrinks towards the first; None: after the ranked ones).
    fuzzed: bool = True
    fuzz_rank: int | None = None
    # vLLM's KVCacheGroupRole of the group (by name), for types that are a role of
    # another spec class (HiSparse's source and indexer are full-attention specs).
    role: str | None = None
    # Part of vLLM's HiSparse layout (:data:`HISPARSE_LAYOUT`).
    hisparse: bool = False
    # Its blocks come from a pool of its own (HiSparse's host pool), not the device
    # pool every other group shares: its block ids are another pool's.
    own_pool: bool = False
    # Whether the warmup predictor ``_reserved_block_count`` has a rule for the type;
    # where not, the ``agree`` check does not judge it (docs/findings.md names why).
    predicted: bool = True
    # Why kvconform's contract states no ceiling for the type (kvconform.model.contract,
    # check ``ceiling``); empty: it states one.
    no_ceiling: str = ""
    # How kvconform.model.prefix_hits bounds a prefix-cache hit of this type from below:
    # "dense" (every full block of computed tokens is cached, and any prefix of them
    # hits), "window" (a hit needs the blocks of the window before it, cached densely or
    # at the boundaries retention keeps); empty: no rule, and no bound for a model with it.
    hit_rule: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def floor_for(self, options: Mapping[str, object]) -> FloorRule:
        """The floor rule of a group of this type with ``options``."""
        if self.floor_by is not None:
            option, rules = self.floor_by
            return rules.get(options.get(option), self.floor)
        return self.floor

    def probe_options(self) -> dict[str, object]:
        """The options of the fuzzer's probe of this type (block size 16)."""
        return {name: o.probe for name, o in self.options.items() if o.probe is not None}


_WINDOW = Option(
    int, required=True, doc="window size in tokens", draw=Draw("tokens", 1, 4), probe=32
)
# vLLM's planner tags every sliding-window spec with max(0, num_prefill_lookahead_tokens - 1)
# (kv_cache_planning.get_global_kv_cache_groups): k - 1 under multi-module MTP, else 0.
# None builds the spec without it (vLLM's default, 0); the loader admits only k - 1.
_EXTRA_RETAINED = Option(
    int, None, doc="trailing tokens kept below the window (multi-module MTP: k - 1)"
)
# Scheduler scenarios build vLLM's scheduler over a tiny plain decoder, so they take
# the types such a model's config can have; types that need an encoder-decoder or
# context-parallel model configuration would be scheduled without the model-driven
# behaviour they exist for (Mamba, which the scheduler reads from the KV-cache and
# cache configs kvconform builds, is taken too).
_PLAIN_DECODER = EVERY_KIND_WITH_GROUPS | {Kind.SCHEDULER}
# Startup scenarios hand vLLM's startup planning one layer per group and judge the pool
# it accepts by what one max_model_len request holds. They take the types whose floor
# for that request is the pool blocks it holds: token-indexed types without null
# columns, and Mamba outside "align" (its running state and speculative blocks). A
# windowed type's columns overstate the blocks it holds at once (those that left the
# window are null), so its one-request demand is not its floor.
_STARTUP = frozenset({Kind.STARTUP})
# HiSparse's groups exist only together, bound to vLLM's HiSparseCoordinator, which
# trajectory mode drives as the HiSparse connector's scheduler side does.
_HISPARSE = frozenset({Kind.TRAJECTORY})
_HISPARSE_PAGE = Option(int, 64, doc="bytes of a page (the layout's; neutral here)")

GROUP_TYPES: Mapping[str, GroupType] = MappingProxyType(
    {
        t.name: t
        for t in (
            GroupType(
                "full_attention",
                "FullAttentionSpec",
                "Full attention.",
                TOKEN_COLUMNS,
                # The engine builds its groups from the model: a plain decoder's one group.
                modes=_PLAIN_DECODER | {Kind.ENGINE} | _STARTUP,
                fuzz_rank=0,
                hit_rule="dense",
            ),
            GroupType(
                "mla",
                "MLAAttentionSpec",
                "Multi-head latent attention.",
                TOKEN_COLUMNS,
                modes=_PLAIN_DECODER | _STARTUP,
                fuzz_rank=3,
                hit_rule="dense",
            ),  # fmt: skip
            GroupType(
                "sliding_window",
                "SlidingWindowSpec",
                "Sliding-window attention; blocks that leave the window become null.",
                WINDOWED_COLUMNS,
                {"sliding_window": _WINDOW, "extra_retained_tokens": _EXTRA_RETAINED},
                holds_null=True,
                reads=("window", "sliding_window"),
                modes=_PLAIN_DECODER,
                retention=True,
                fuzz_rank=1,
                hit_rule="window",
            ),
            GroupType(
                "sliding_window_mla",
                "SlidingWindowMLASpec",
                "Sliding-window MLA.",
                WINDOWED_COLUMNS,
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
                modes=_PLAIN_DECODER,
                retention=True,
                hit_rule="window",
            ),
            GroupType(
                "chunked_local",
                "ChunkedLocalAttentionSpec",
                "Chunked local attention; blocks of finished chunks become null.",
                WINDOWED_COLUMNS,
                {
                    "attention_chunk_size": Option(
                        int,
                        required=True,
                        doc="chunk size in tokens",
                        draw=Draw("blocks", 1, 4),
                        probe=32,
                    )
                },  # fmt: skip
                holds_null=True,
                reads=("chunk", "attention_chunk_size"),
                modes=_PLAIN_DECODER,
                caching_needs_one_block_size=True,
                caching_refuses_block_drop=True,
            ),
            GroupType(
                "rswa",
                "RSWASpec",
                "Reference sliding-window attention: prompt kept, decode window slides.",
                WINDOWED_COLUMNS,
                {"rswa_window": _WINDOW},
                holds_null=True,
            ),
            GroupType(
                "mamba",
                "MambaSpec",
                "Mamba state. 'align' keeps block-aligned states with nulls between.",
                MAMBA_STATE,
                {
                    "mamba_cache_mode": Option(
                        str,
                        "none",
                        choices=("none", "align", "all"),
                        doc="vLLM's mamba_cache_mode",
                        draw=Draw("offered"),
                        vllm_literal="vllm.config.cache.MambaCacheMode",
                        # MambaModelConfig.verify_and_update_config: prefix caching on
                        # makes "none" "align"; off makes any mode "none".
                        follows_caching=MappingProxyType({True: "align", False: "none"}),
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
                },  # fmt: skip
                floor_by=("mamba_cache_mode", MappingProxyType({"align": MAMBA_ALIGNED_STATE})),
                # Scheduler scenarios too: vLLM's scheduler reads a Mamba group from the
                # KV-cache config and the cache config's mamba_cache_mode (its "align"
                # chunk split), not from the model (the tiny decoder has no Mamba layers).
                modes=_PLAIN_DECODER | _STARTUP,
                holds_null=True,
                retention=True,
                speculative_blocks="num_speculative_blocks",
                attention=False,
                fuzz_rank=2,
            ),
            GroupType(
                "cross_attention",
                "CrossAttentionSpec",
                "Cross-attention of an encoder-decoder model; sized by the encoder length.",
                ENCODER_COLUMNS,
                encoder=True,
            ),
            GroupType(
                "circular_buffer",
                "CircularBufferSpec",
                "One ring block per request for its whole lifetime.",
                ONE_RING_BLOCK,
            ),
            GroupType(
                "sink_full_attention",
                "SinkFullAttentionSpec",
                "Full attention with attention-sink tokens.",
                TOKEN_COLUMNS,
                {
                    "sink_len": Option(
                        int,
                        required=True,
                        doc="sink tokens, a multiple of block_size",
                        draw=Draw("blocks", 1, 2),
                        probe=16,
                    )
                },  # fmt: skip
            ),
            GroupType(
                "hidden_state",
                "HiddenStateCacheSpec",
                "Hidden-state cache of extract_hidden_states (MLA layout).",
                TOKEN_COLUMNS,
            ),
            GroupType(
                "hisparse_source",
                "FullAttentionSpec",
                "HiSparse's source: full attention kept in a host pool of its own (role "
                "HISPARSE_SOURCE), which owns the layout's prefix caching and may keep a "
                "longer hit than the device groups.",
                TOKEN_COLUMNS,
                modes=_HISPARSE,
                fuzzed=False,
                role="HISPARSE_SOURCE",
                hisparse=True,
                own_pool=True,
                no_ceiling="a host pool of its own; its columns follow the host copy",
            ),
            GroupType(
                "hisparse_indexer",
                "FullAttentionSpec",
                "HiSparse's indexer: full attention on the device (role HISPARSE_INDEXER).",
                TOKEN_COLUMNS,
                modes=_HISPARSE,
                fuzzed=False,
                role="HISPARSE_INDEXER",
                hisparse=True,
            ),
            GroupType(
                "hisparse_resident",
                "HiSparseResidentSpec",
                "HiSparse's GPU-resident pages of the source: one column per block of "
                "tokens, null for a page read from the host only.",
                TOKEN_COLUMNS,
                {"page_size": _HISPARSE_PAGE},
                holds_null=True,
                modes=_HISPARSE,
                fuzzed=False,
                hisparse=True,
                no_ceiling="the HiSparse connector adopts and drops resident pages, not the "
                "token count",
            ),
            GroupType(
                "hisparse_hot",
                "HiSparseHotSpec",
                "HiSparse's hot region: blocks_per_request blocks once a request reads "
                "host-backed history, none before.",
                HOT_REGION,
                {
                    "page_size": _HISPARSE_PAGE,
                    "blocks_per_request": Option(
                        int, 2, doc="blocks of the hot region (the layout's device buffer)"
                    ),
                },
                modes=_HISPARSE,
                fuzzed=False,
                hisparse=True,
                # _reserved_block_count counts the hot group by tokens (docs/findings.md #4).
                predicted=False,
                no_ceiling="allocated only while the request reads host-backed history",
            ),
            GroupType(
                "kpool_tail",
                "KpoolTailSpec",
                "K-pool tail (vLLM 0.30-0.31 only).",
                WINDOWED_COLUMNS,
                {"sliding_window": _WINDOW},
                holds_null=True,
                no_ceiling="a release-specific tail layout (vLLM 0.30-0.31), not modelled",
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
    }
)


def hisparse_layout_error(kinds: Sequence[str]) -> str | None:
    """Why a model's group types are not HiSparse's layout as vLLM builds it
    (``vllm/v1/hisparse/layout.py``), or None: the host source first, one indexer, then
    resident and hot groups, before any other group. A model without HiSparse groups
    passes."""
    hisparse = [i for i, kind in enumerate(kinds) if GROUP_TYPES[kind].hisparse]
    if not hisparse:
        return None
    roles = [GROUP_TYPES[kind].role for kind in kinds]
    classes = {GROUP_TYPES[kinds[i]].vllm_class for i in hisparse}
    layout = (
        roles[0] == "HISPARSE_SOURCE"
        and roles.count("HISPARSE_SOURCE") == 1
        and roles.count("HISPARSE_INDEXER") == 1
        and {"HiSparseResidentSpec", "HiSparseHotSpec"} <= classes
        and hisparse == list(range(len(hisparse)))
    )
    if layout:
        return None
    source, indexer = (
        name for role in ("HISPARSE_SOURCE", "HISPARSE_INDEXER")
        for name, t in GROUP_TYPES.items() if t.role == role
    )  # fmt: skip
    rest = " and ".join(n for n, t in GROUP_TYPES.items() if t.hisparse and t.role is None)
    return (
        f"HiSparse's groups come as vLLM's layout builds them: {source} first, one {indexer}, "
        f"then {rest} groups, before any other group; not {list(kinds)}"
    )


# The group list of a scenario that names none.
DEFAULT_GROUPS: tuple[str, ...] = ("full_attention",)


def group_type_for_class(class_name: str) -> GroupType | None:
    for group_type in GROUP_TYPES.values():
        if group_type.vllm_class == class_name:
            return group_type
    return None


def types_for(kind: str) -> tuple[str, ...]:
    """The group types a scenario of ``kind`` may name, in registry order."""
    return tuple(name for name, t in GROUP_TYPES.items() if kind in t.modes)
