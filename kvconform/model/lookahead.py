"""kvconform's own table of what each speculative method must reserve.

``VllmConfig.num_lookahead_tokens`` is vLLM's single source of the lookahead:
the KV slots past the scheduled range that the drafter writes. This table is
the independent statement of the same thing, written from what each drafter
does, so the ``lookahead`` check can catch vLLM's property drifting from the
drafters (a new method falling into the ``return 0`` branch, a ``+ 1`` lost).

Method names vLLM declares but this table does not know are reported by the
check and by ``kvconform methods``: a new method needs a deliberate row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LookaheadRule:
    methods: tuple[str, ...]
    formula: str
    lookahead: Callable[[int, bool], int]
    reason: str


LOOKAHEAD_TABLE: tuple[LookaheadRule, ...] = (
    LookaheadRule(
        ("eagle", "eagle3", "mtp"),
        "k",
        lambda k, anchor: k,
        "the drafter runs k autoregressive passes from the verified position and writes the KV "
        "of k positions past the scheduled range",
    ),
    LookaheadRule(
        ("draft_model",),
        "k",
        lambda k, anchor: k,
        "a separate draft model proposes k tokens autoregressively, writing their KV",
    ),
    LookaheadRule(
        ("dflash",),
        "k + 1",
        lambda k, anchor: k + 1,
        "fill-in drafting writes a bonus query plus one query per draft token",
    ),
    LookaheadRule(
        ("dspark",),
        "k (anchor) | k + 1 (fill-in)",
        lambda k, anchor: k if anchor else k + 1,
        "anchor sampling drafts k queries starting at the anchor; the fill-in layout "
        "(sample_from_anchor: false) adds a bonus query like DFlash",
    ),
    LookaheadRule(
        ("ngram", "ngram_gpu", "suffix"),
        "0",
        lambda k, anchor: 0,
        "drafts come from matching earlier tokens; no drafter forward pass, no drafter KV",
    ),
    LookaheadRule(
        ("extract_hidden_states",),
        "0",
        lambda k, anchor: 0,
        "caches the target's hidden states at the scheduled positions only "
        "(slot_mappings[:num_tokens]); its one draft is always accepted",
    ),
    LookaheadRule(
        ("custom_class",),
        "0",
        lambda k, anchor: 0,
        "a user-supplied proposer; vLLM reserves no drafter KV for it",
    ),
)


def rule_for(method: str) -> LookaheadRule | None:
    for rule in LOOKAHEAD_TABLE:
        if method in rule.methods:
            return rule
    return None


def expected_lookahead(method: str | None, k: int, sample_from_anchor: bool = True) -> int | None:
    """The lookahead kvconform expects, or None for a method the table lacks."""
    if method is None:
        return 0
    rule = rule_for(method)
    return None if rule is None else rule.lookahead(k, sample_from_anchor)
