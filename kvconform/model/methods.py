"""The speculative methods kvconform knows: one registry entry per method.

A :class:`Method` entry says, for one of vLLM's canonical speculative methods:

* its **lookahead rule**: how many KV slots past the scheduled range its drafter
  writes, written from what the drafter does, with the reason. vLLM's own
  answer is ``VllmConfig.num_lookahead_tokens``; the ``lookahead`` check holds
  the two against each other, so a new method falling into vLLM's ``return 0``
  branch, or a ``+ 1`` lost, is caught;
* the **models** scheduler and engine scenarios build for it: the target (a
  plain decoder unless the method drafts from the target's own checkpoint) and
  the draft model, if the method has one (:class:`~kvconform.model.tiny_model.TinyModel`),
  plus the ``SpeculativeConfig`` options it needs;
* what the loader and the fuzzer need to know: whether it has DSpark's two
  layouts (``sample_from_anchor``), whether it stacks MTP modules, the vLLM
  literal type that lists its aliases, and where the fuzzer ranks it.

Method names vLLM declares but no entry knows are reported by the ``lookahead``
check and by ``kvconform methods`` / ``doctor``: a new method needs a deliberate
entry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvconform.model.tiny_model import SCHEDULER_TARGET, TinyModel

__all__ = [
    "LookaheadRule",
    "METHODS",
    "Method",
    "REGISTRY_FILE",
    "expected_lookahead",
    "method_for",
]

# Where the built-in entries live: what `methods`, `doctor` and the lookahead check
# tell a user to edit (or to extend with a methods file).
REGISTRY_FILE = "kvconform/model/methods.py"


@dataclass(frozen=True)
class LookaheadRule:
    """How many slots a drafter writes past the scheduled range, and why."""

    formula: str
    lookahead: Callable[[int, bool], int]  # (k, sample_from_anchor) -> slots
    reason: str


@dataclass(frozen=True)
class Method:
    name: str  # vLLM's canonical method name
    rule: LookaheadRule
    # Scheduler mode (and engine mode's draft): the target model, and the draft
    # model for methods whose drafter is a model of its own (None: no draft folder).
    target: TinyModel = SCHEDULER_TARGET
    draft: TinyModel | None = None
    speculative_options: Mapping[str, Any] = field(default_factory=dict)
    # DSpark: an anchor layout (k) and a fill-in layout (k + 1), by sample_from_anchor.
    anchor_layouts: bool = False
    # MTP: the target stacks num_nextn_predict_layers modules; more than one makes it
    # multi-module MTP, for which vLLM keeps k - 1 extra tokens below sliding windows.
    mtp_modules: bool = False
    # The name of vLLM's literal type listing the method's aliases (MTP's model types).
    vllm_aliases: str | None = None
    # The fuzzer draws methods in this order (Hypothesis shrinks towards the first);
    # None: after the ranked ones.
    fuzz_rank: int | None = None
    # Where the entry came from: the registry, or a methods file (its path).
    source: str = REGISTRY_FILE
    # vLLM's kernel that turns the drafter's positions into KV slots (the slots check
    # runs it): BlockTables.compute_slot_mappings for most drafters; DFlash and DSpark
    # build their queries with prepare_dflash_inputs from the gathered block table.
    drafter_kernel: str = "compute_slot_mappings"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "speculative_options", MappingProxyType(dict(self.speculative_options))
        )

    def lookahead(self, k: int, sample_from_anchor: bool = True) -> int:
        return self.rule.lookahead(k, sample_from_anchor)

    @property
    def has_draft_model(self) -> bool:
        """The drafter is a model of its own, whose shape an engine scenario may set."""
        return self.draft is not None


_EAGLE_FAMILY = LookaheadRule(
    "k",
    lambda k, anchor: k,
    "the drafter runs k autoregressive passes from the verified position and writes the KV "
    "of k positions past the scheduled range",
)
_NO_DRAFTER_KV = LookaheadRule(
    "0",
    lambda k, anchor: 0,
    "drafts come from matching earlier tokens; no drafter forward pass, no drafter KV",
)
# The draft of EAGLE-family methods and draft models: a one-layer copy of the target.
_ONE_LAYER_DRAFT = TinyModel(
    vocab=1000, hidden_size=64, intermediate_size=128, max_position_embeddings=131072, layers=1
)

BUILTIN_METHODS: tuple[Method, ...] = (
    Method("eagle", _EAGLE_FAMILY, draft=_ONE_LAYER_DRAFT, fuzz_rank=0),
    Method("eagle3", _EAGLE_FAMILY, draft=_ONE_LAYER_DRAFT),
    Method(
        "mtp",
        _EAGLE_FAMILY,
        target=TinyModel(
            "MiMoForCausalLM",
            vocab=1000,
            hidden_size=64,
            intermediate_size=128,
            max_position_embeddings=131072,
            extra={"num_nextn_predict_layers": 1},
        ),
        mtp_modules=True,
        vllm_aliases="MTPModelTypes",
        fuzz_rank=1,
    ),  # fmt: skip
    Method(
        "draft_model",
        LookaheadRule(
            "k",
            lambda k, anchor: k,
            "a separate draft model proposes k tokens autoregressively, writing their KV",
        ),
        draft=_ONE_LAYER_DRAFT,
        fuzz_rank=4,
    ),
    Method(
        "dflash",
        LookaheadRule(
            "k + 1",
            lambda k, anchor: k + 1,
            "fill-in drafting writes a bonus query plus one query per draft token",
        ),
        drafter_kernel="prepare_dflash_inputs",
        draft=TinyModel(
            "DFlashDraftModel",
            layers=1,
            vocab=1000,
            hidden_size=64,
            intermediate_size=128,
            max_position_embeddings=131072,
        ),
        fuzz_rank=2,
    ),  # fmt: skip
    Method(
        "dspark",
        LookaheadRule(
            "k (anchor) | k + 1 (fill-in)",
            lambda k, anchor: k if anchor else k + 1,
            "anchor sampling drafts k queries starting at the anchor; the fill-in layout "
            "(sample_from_anchor: false) adds a bonus query like DFlash",
        ),
        # DSpark drafts from the target's own checkpoint; DSparkSpeculator is a
        # DFlashSpeculator and writes through the same input kernel.
        anchor_layouts=True,
        drafter_kernel="prepare_dflash_inputs",
        fuzz_rank=3,
    ),
    Method(
        "ngram",
        _NO_DRAFTER_KV,
        speculative_options={"prompt_lookup_min": 2, "prompt_lookup_max": 4},
        fuzz_rank=5,
    ),
    Method(
        "ngram_gpu",
        _NO_DRAFTER_KV,
        speculative_options={"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    ),
    Method("suffix", _NO_DRAFTER_KV),
    Method(
        "extract_hidden_states",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "caches the target's hidden states at the scheduled positions only "
            "(slot_mappings[:num_tokens]); its one draft is always accepted",
        ),
    ),
    Method(
        "custom_class",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "a user-supplied proposer; vLLM reserves no drafter KV for it",
        ),
    ),
)


def registry(extra: Iterable[Method] = ()) -> Mapping[str, Method]:
    """The built-in entries, with ``extra`` ones added (a methods file); names unique."""
    entries: dict[str, Method] = {}
    for method in (*BUILTIN_METHODS, *extra):
        if method.name in entries:
            raise ValueError(
                f"method {method.name!r} is declared twice: in {entries[method.name].source} "
                f"and in {method.source}"
            )
        entries[method.name] = method
    return MappingProxyType(entries)


METHODS: Mapping[str, Method] = registry()


def method_for(name: str | None, methods: Mapping[str, Method] | None = None) -> Method | None:
    """The entry of a canonical method name, or None for a method no entry knows."""
    if name is None:
        return None
    return (METHODS if methods is None else methods).get(name)


def expected_lookahead(
    method: str | None,
    k: int,
    sample_from_anchor: bool = True,
    methods: Mapping[str, Method] | None = None,
) -> int | None:
    """The lookahead kvconform expects, or None for a method no entry knows."""
    if method is None:
        return 0
    entry = method_for(method, methods)
    return None if entry is None else entry.lookahead(k, sample_from_anchor)
