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


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FloorInput:
    computed: int
    scheduled: int
    lookahead: int
    block_size: int
    max_model_len: int
    encoder_len: int = 0
    dcp_world_size: int = 1
    num_speculative_blocks: int = 0
    mamba_cache_mode: str = "none"


@dataclass(frozen=True)
class FloorRule:
    reason: str
    blocks: Callable[[FloorInput], int]
    # How the number came about, with the step's own numbers filled in.
    formula: Callable[[FloorInput], str] = lambda f: ""


def token_columns(f: FloorInput) -> int:
    """Columns up to the last position the target or the drafter writes."""
    last = min(f.computed + f.scheduled + f.lookahead, f.max_model_len)
    return cdiv(last, f.block_size * f.dcp_world_size)


def _token_formula(f: FloorInput) -> str:
    per_column = (
        f"{f.block_size}" if f.dcp_world_size == 1 else f"{f.block_size} x {f.dcp_world_size}"
    )
    return (
        f"cdiv(min({f.computed} computed + {f.scheduled} scheduled + {f.lookahead} lookahead, "
        f"{f.max_model_len}), {per_column})"
    )


def _mamba_formula(f: FloorInput) -> str:
    if f.mamba_cache_mode == "align":
        return f"cdiv({f.computed} + {f.scheduled}, {f.block_size}) + {f.num_speculative_blocks}"
    return f"1 + {f.num_speculative_blocks} speculative blocks"


def _mamba(f: FloorInput) -> int:
    if f.mamba_cache_mode == "align":
        return cdiv(f.computed + f.scheduled, f.block_size) + f.num_speculative_blocks
    return 1 + f.num_speculative_blocks


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

FLOORS: Mapping[str, FloorRule] = MappingProxyType(
    {
        "full_attention": FloorRule(_TOKEN_INDEXED, token_columns, _token_formula),
        "mla": FloorRule(_TOKEN_INDEXED, token_columns, _token_formula),
        "hidden_state": FloorRule(_TOKEN_INDEXED, token_columns, _token_formula),
        "sink_full_attention": FloorRule(_TOKEN_INDEXED, token_columns, _token_formula),
        "sliding_window": FloorRule(_WINDOWED, token_columns, _token_formula),
        "sliding_window_mla": FloorRule(_WINDOWED, token_columns, _token_formula),
        "chunked_local": FloorRule(_WINDOWED, token_columns, _token_formula),
        "rswa": FloorRule(_WINDOWED, token_columns, _token_formula),
        "kpool_tail": FloorRule(_WINDOWED, token_columns, _token_formula),
        "mamba": FloorRule(
            "Mamba keeps a running state, not per-token KV, and drafters have no Mamba layers, "
            "so lookahead needs no state: mode 'align' writes the state into the column of the "
            "last scheduled token's block, then one column per speculative block; other modes "
            "need the running state plus one block per speculative block",
            _mamba,
            _mamba_formula,
        ),
        "cross_attention": FloorRule(
            "cross-attention holds the encoder's K/V: one column per block_size encoder tokens, "
            "written once; decoder tokens and drafts add nothing",
            lambda f: cdiv(f.encoder_len, f.block_size),
            lambda f: f"cdiv({f.encoder_len} encoder tokens, {f.block_size})",
        ),
        "circular_buffer": FloorRule(
            "a circular buffer is one ring block for the request's whole lifetime",
            lambda f: 1,
            lambda f: "1",
        ),
    }
)


def floor_blocks(group_type: str, f: FloorInput) -> int:
    return FLOORS[group_type].blocks(f)
