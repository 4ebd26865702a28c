"""An upper bound of the pool blocks a drawn trajectory holds at once.

Pool pressure is part of what the fuzzer must reach, but a pool that runs dry
makes ``allocate_slots`` return ``None`` -- an input error (``PoolExhausted``),
not a finding -- and such an example is thrown away. So the strategies size the
pool from this bound plus a small drawn slack: a slack of 0 leaves the pool
exactly full at the trajectory's peak wherever the bound is tight (full
attention and its kin), and the example still runs.

The bound counts block-table *columns*, and a column holds at most one pool
block (the null placeholders of windowed and Mamba groups hold none):

* token-indexed groups: ``cdiv(min(computed + scheduled + lookahead,
  max_model_len), block_size)``, the columns ``allocate_slots`` sizes to;
* Mamba: the same plus its speculative blocks (``align`` mode sizes from fewer
  tokens, so this bounds it too);
* cross-attention: the encoder's columns; circular buffer: one.

Blocks are not returned when drafts are rejected, so a request's demand is its
running maximum since it last (re)started; ``preempt`` and ``finish`` give it
all back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconform.model.floors import FloorRule, pool_columns


@dataclass(frozen=True)
class GroupDemand:
    rule: FloorRule  # the group's floor rule
    block_size: int
    extra_blocks: int = 0  # speculative state blocks (Mamba)

    def columns(self, tokens: int, encoder_len: int) -> int:
        return pool_columns(self.rule, tokens, encoder_len, self.block_size, self.extra_blocks)


@dataclass
class PoolDemand:
    groups: tuple[GroupDemand, ...]
    max_model_len: int
    lookahead: int
    held: dict[str, int] = field(default_factory=dict)
    peak: int = 0

    def schedule(
        self, request: str, computed: int, scheduled: int, encoder_len: int, admission: int = 0
    ) -> None:
        """One call; ``admission``: at an admission under full-sequence admission (vLLM's
        default), the whole sequence's tokens, whose blocks must be free at that moment."""
        tokens = min(computed + scheduled + self.lookahead, self.max_model_len)
        need = sum(group.columns(tokens, encoder_len) for group in self.groups)
        if admission:
            whole = min(admission, self.max_model_len)
            others = sum(held for name, held in self.held.items() if name != request)
            full = sum(group.columns(whole, encoder_len) for group in self.groups)
            self.peak = max(self.peak, others + full)
        self.held[request] = max(self.held.get(request, 0), need)
        self.peak = max(self.peak, sum(self.held.values()))

    def release(self, request: str) -> None:
        self.held.pop(request, None)
