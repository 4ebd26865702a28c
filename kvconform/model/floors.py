"""The reference floor: the fewest blocks each group type must hold at a step.

This is the contract of the mission, per group type, written from what the
model runner and the drafter *write*, not from how vLLM's allocator happens to
count. At a step where a request has ``computed`` tokens and ``scheduled`` more
are scheduled, the target model writes KV for positions up to ``computed +
scheduled`` and a drafter with ``lookahead`` slots writes up to ``computed +
scheduled + lookahead`` (never past ``max_model_len``). A party that holds fewer
columns than the row below requires lets a write land outside the request's
blocks: vLLM's slot-mapping kernel does not bound the column index.

Every row carries its reason; the reports quote it next to a shortfall.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# A floor rule with one group's fixed inputs bound: (computed, scheduled,
# lookahead, encoder_len) -> blocks. The driver evaluates one per step and group.
StepFloor = Callable[[int, int, int, int], int]


class FloorInput(NamedTuple):
    """What a floor rule reads: a step's counts and its group's fixed inputs.

    A named tuple rather than a frozen dataclass: one is built per step and
    group wherever a floor is explained, and a frozen dataclass costs several
    times more to build (docs/benchmarks.md).
    """

    computed: int
    scheduled: int
    lookahead: int
    block_size: int
    max_model_len: int
    encoder_len: int = 0
    dcp_world_size: int = 1
    num_speculative_blocks: int = 0
    mamba_cache_mode: str = "none"
    # Mamba "align": the reserved column the worker exports a prefill checkpoint into.
    num_prefill_checkpoint_blocks: int = 0


@dataclass(frozen=True)
class FloorRule:
    reason: str
    blocks: Callable[[FloorInput], int]
    # How the number came about, with the step's own numbers filled in.
    formula: Callable[[FloorInput], str] = lambda f: ""
    # Optional: the same rule as a function of the step's counts, with a group's
    # fixed inputs bound once (``blocks`` is then written through it, so the two
    # cannot disagree). Without it, :meth:`for_group` wraps ``blocks``.
    bind: Callable[[FloorInput], StepFloor] | None = None
    # The rule's name where failures are gathered (the fuzzer's signatures, the
    # root causes): every rule that counts token columns is "token-indexed".
    family: str = ""

    @property
    def counts_token_columns(self) -> bool:
        """The rule counts one column per block of written positions (token-indexed)."""
        return self.blocks is token_columns

    def for_group(self, fixed: FloorInput) -> StepFloor:
        """This rule for one group: ``fixed`` holds its inputs; its counts are ignored."""
        if self.bind is not None:
            return self.bind(fixed)
        blocks, template = self.blocks, fixed

        def step_floor(computed: int, scheduled: int, lookahead: int, encoder_len: int) -> int:
            return blocks(
                template._replace(
                    computed=computed,
                    scheduled=scheduled,
                    lookahead=lookahead,
                    encoder_len=encoder_len,
                )
            )

        return step_floor


def _bind_token_columns(fixed: FloorInput) -> StepFloor:
    cap, per_column = fixed.max_model_len, fixed.block_size * fixed.dcp_world_size

    def columns(computed: int, scheduled: int, lookahead: int, encoder_len: int) -> int:
        """Columns up to the last position the target or the drafter writes."""
        return cdiv(min(computed + scheduled + lookahead, cap), per_column)

    return columns


def token_columns(f: FloorInput) -> int:
    """Columns up to the last position the target or the drafter writes."""
    return _bind_token_columns(f)(f.computed, f.scheduled, f.lookahead, f.encoder_len)


def _token_formula(f: FloorInput) -> str:
    per_column = (
        f"{f.block_size}" if f.dcp_world_size == 1 else f"{f.block_size} x {f.dcp_world_size}"
    )
    return (
        f"cdiv(min({f.computed} computed + {f.scheduled} scheduled + {f.lookahead} lookahead, "
        f"{f.max_model_len}), {per_column})"
    )


def _bind_mamba_state(fixed: FloorInput) -> StepFloor:
    speculative_blocks = fixed.num_speculative_blocks
    return lambda computed, scheduled, lookahead, encoder_len: 1 + speculative_blocks


def _bind_mamba_aligned(fixed: FloorInput) -> StepFloor:
    block_size, speculative_blocks = fixed.block_size, fixed.num_speculative_blocks
    return lambda computed, scheduled, lookahead, encoder_len: (
        cdiv(computed + scheduled, block_size) + speculative_blocks
    )


def _through(bind: Callable[[FloorInput], StepFloor]) -> Callable[[FloorInput], int]:
    """A rule's ``blocks`` written through its ``bind``, so that the two cannot disagree."""
    return lambda f: bind(f)(f.computed, f.scheduled, f.lookahead, f.encoder_len)


_TOKEN_INDEXED = (
    "one column per block_size tokens up to computed + scheduled + lookahead, capped at "
    "max_model_len: the target writes the scheduled positions and the drafter the lookahead "
    "positions past them (with decode context parallelism a column spans block_size tokens "
    "on each of dcp_world_size ranks)"
)
_WINDOWED = (
    _TOKEN_INDEXED + "; blocks that left the window stay as null columns, so the column count "
    "must still reach the drafter's last position"
)

_MAMBA_REASON = (
    "Mamba keeps a running state, not per-token KV, and drafters have no Mamba layers, "
    "so lookahead needs no state: mode 'align' writes the state into the column of the "
    "last scheduled token's block, then one column per speculative block; other modes "
    "need the running state plus one block per speculative block"
)

# The rules a group type's registry entry (model/group_types.py) names.
TOKEN_COLUMNS = FloorRule(
    _TOKEN_INDEXED, token_columns, _token_formula, _bind_token_columns, "token-indexed"
)
WINDOWED_COLUMNS = FloorRule(
    _WINDOWED, token_columns, _token_formula, _bind_token_columns, "token-indexed"
)
MAMBA_STATE = FloorRule(
    _MAMBA_REASON,
    _through(_bind_mamba_state),
    lambda f: f"1 + {f.num_speculative_blocks} speculative blocks",
    _bind_mamba_state,
    "mamba-state",
)
MAMBA_ALIGNED_STATE = FloorRule(
    _MAMBA_REASON,
    _through(_bind_mamba_aligned),
    lambda f: f"cdiv({f.computed} + {f.scheduled}, {f.block_size}) + {f.num_speculative_blocks}",
    _bind_mamba_aligned,
    "mamba-align",
)
ENCODER_COLUMNS = FloorRule(
    "cross-attention holds the encoder's K/V: one column per block_size encoder tokens, "
    "written once; decoder tokens and drafts add nothing",
    lambda f: cdiv(f.encoder_len, f.block_size),
    lambda f: f"cdiv({f.encoder_len} encoder tokens, {f.block_size})",
    family="encoder",
)
HOT_REGION = FloorRule(
    "HiSparse's hot region is allocated only while the request reads host-backed history "
    "(then blocks_per_request blocks); no token count asks for it",
    lambda f: 0,
    lambda f: "0",
    family="hot-region",
)
ONE_RING_BLOCK = FloorRule(
    "a circular buffer is one ring block for the request's whole lifetime",
    lambda f: 1,
    lambda f: "1",
    family="ring",
)


def pool_columns(
    rule: FloorRule, tokens: int, encoder_len: int, block_span: int, speculative_blocks: int = 0
) -> int:
    """The most pool blocks a group of this rule's family asks for at ``tokens`` tokens.

    The floor says what a party must hold at least; this bounds what the allocator
    may take from the pool, column by column (a column holds at most one block): the
    encoder's columns for cross-attention, one ring block, else one column per
    ``block_span`` tokens plus the speculative state blocks (vLLM's MambaManager sizes
    its non-align modes from the tokens too). A step whose columns by this count do not
    fit the free pool is the scenario's to fix, not vLLM's (kvconform.oracles.live), and
    the fuzzer sizes its pools from it (kvconform.fuzz.pool).
    """
    if rule.family == ENCODER_COLUMNS.family:
        return cdiv(encoder_len, block_span)
    if rule.family == ONE_RING_BLOCK.family:
        return 1
    return cdiv(tokens, block_span) + speculative_blocks


def aligned_state_call_blocks(
    speculative_blocks: int, checkpoint_blocks: int, partial_hit: bool
) -> int:
    """The most new blocks one ``allocate_slots`` call takes for a Mamba "align" group.

    :func:`pool_columns` counts every column of the table, but in align mode all columns
    but a few hold the null block: vLLM's ``MambaManager.get_num_blocks_to_allocate``
    caps a call at the running state, the copy of a partial prefix hit, the prefill
    checkpoint column and the speculative blocks (``physical_block_cap``, vLLM 0.31.0 on;
    0.30.0 asks a running request's checkpoint chunk for every column, more than this).
    A refusal within this bound is vLLM's to answer for (the capacity check), not the
    scenario's.
    """
    return 1 + int(partial_hit) + checkpoint_blocks + speculative_blocks


# What a windowed group's attention reads, beside the floor's count of columns: the
# token at ``position`` attends to the positions from ``first_position_read(...)``
# through itself. vLLM replaces the blocks before that with the null block
# (``get_num_skipped_tokens``: its docstrings give the same spans); a block inside it
# that is null, or freed, is KV the step reads that is gone.
READ_SPAN_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "window": "a sliding window of W tokens: the token at position p attends to "
        "positions p - W + 1 through p",
        "chunk": "chunked local attention with chunks of C tokens: the token at position p "
        "attends to the positions of its own chunk, from p // C * C through p",
    }
)


def first_position_read(kind: str, size: int, position: int) -> int:
    """The earliest position the token at ``position`` attends to (READ_SPAN_REASONS)."""
    if kind == "window":
        return max(0, position - size + 1)
    if kind == "chunk":
        return position // size * size
    raise ValueError(f"unknown read span {kind!r}; known: {', '.join(READ_SPAN_REASONS)}")
