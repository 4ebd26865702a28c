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

from kvconform.model.floors import ENCODER_COLUMNS, ONE_RING_BLOCK, cdiv


@dataclass(frozen=True)
class GroupDemand:
    family: str  # the group's floor family (FloorRule.family)
    block_size: int
    extra_blocks: int = 0  # speculative state blocks (Mamba)

    def columns(self, tokens: int, encoder_len: int) -> int:
        if self.family == ENCODER_COLUMNS.family:
            return cdiv(encoder_len, self.block_size)
        if self.family == ONE_RING_BLOCK.family:
            return 1
        return cdiv(tokens, self.block_size) + self.extra_blocks


@dataclass
class PoolDemand:
    groups: tuple[GroupDemand, ...]
    max_model_len: int
    lookahead: int
    held: dict[str, int] = field(default_factory=dict)
    peak: int = 0

    def schedule(self, request: str, computed: int, scheduled: int, encoder_len: int) -> None:
        tokens = min(computed + scheduled + self.lookahead, self.max_model_len)
        need = sum(group.columns(tokens, encoder_len) for group in self.groups)
        self.held[request] = max(self.held.get(request, 0), need)
        self.peak = max(self.peak, sum(self.held.values()))

    def release(self, request: str) -> None:
        self.held.pop(request, None)
