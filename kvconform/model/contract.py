"""The KV-cache contract as an independent model: what each group must hold, at most.

The floor (:mod:`kvconform.model.floors`) says the fewest blocks a request's table
must hold at a step so that every write lands in it. This module says the other
side: how many it may hold, exactly where the layout fixes the number, and a stated
upper bound where it does not. Holding more costs concurrency: a pool of N blocks
serves fewer requests than the scenario's arithmetic says it should, and nothing
downstream reads the extra blocks.

It is written from what the consumers of the blocks read and write (the model
runner's slot mapping writes positions ``0 .. reach - 1`` of a table; a windowed
kernel reads the window; a Mamba kernel reads its state column; a cross-attention
kernel the encoder's columns) and from vLLM's stated promises in
``vllm/v1/core/single_type_kv_cache_manager.py`` (``allocate_new_blocks`` "gives it
at least ``num_tokens`` token slots"; blocks allocated for drafts that are later
rejected are kept: "num_required_blocks may be smaller than num_req_blocks" in
``get_num_blocks_to_allocate``), never from what vLLM answers at run time. Each
number comes with its reason; docs/contract.md lists where kvconform still takes
"what is right" from vLLM and why.

**Reach.** A step writes positions up to ``computed + scheduled + lookahead`` (capped
at ``max_model_len``): the target's scheduled tokens and the drafter's lookahead
slots. A table is never shortened when drafts are rejected, so what it must hold is
the columns up to the *largest* reach since the request last started (admission or
the resumption after a preemption, which returns every block).

The families, by the floor rule's family and the type's flags:

* token columns (full attention, MLA, sink, hidden-state, HiSparse's indexer; and
  for their column count sliding window, chunked local, R-SWA): exactly
  ``cdiv(min(max reach, max_model_len), block_size x dcp)`` columns, null
  placeholders included;
* windowed (sliding window, chunked local): of those columns, at most the blocks that
  intersect the span from the first position a step still reads to the reach
  (:func:`windowed_real_bound`) hold a real block; the rest are null;
* cross-attention: exactly ``cdiv(encoder_len, block_size)``;
* a ring (circular buffer): exactly one;
* Mamba, modes other than "align": the running state and one block per speculative
  block, ``1 + num_speculative_blocks``, exactly where a block spans
  ``max_model_len``; with a smaller block the allocator sizes the table by tokens,
  ``cdiv(min(max reach, max_model_len), block_size) + num_speculative_blocks`` at most;
* Mamba "align": at most the previous and the running state, the prefill
  checkpoint column and the speculative blocks hold a real block
  (``2 + num_prefill_checkpoint_blocks + num_speculative_blocks``), and under
  asynchronous scheduling the states the steps in flight wrote
  (:func:`align_states_in_flight`);
* the others (HiSparse's source, resident pages and hot region, the K-pool tail):
  not modelled here; their registry entry says why (``GroupType.no_ceiling``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvconform.model.floors import cdiv
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import GroupInfo


class Allowance(NamedTuple):
    """What a group's table may hold after a step: ``columns`` (null placeholders
    included), exactly when ``exact`` else at most, and at most ``real`` blocks that
    are not the null block (None: no bound beyond the columns)."""

    columns: int
    exact: bool
    real: int | None
    formula: str
    reason: str
    real_reason: str = ""


_TOKEN_REASON = (
    "the target writes the scheduled positions and the drafter the lookahead ones; a "
    "table keeps the columns of rejected drafts, so it holds the columns up to the "
    "largest reach since the request started, and no more: nothing reads a column past it"
)
_WINDOW_REASON = (
    "a windowed kernel reads from the first position of its window (or chunk); "
    "remove_skipped_blocks returns the blocks before it, so only the blocks from there to "
    "the reach are real"
)
_ENCODER_REASON = "cross-attention holds the encoder's K/V, written once: its columns only"
_RING_REASON = "a circular buffer is one ring block for the request's whole lifetime"
_MAMBA_REASON = (
    "a Mamba kernel reads and writes one running state (and one per speculative block); "
    "drafters have no Mamba layers"
)
_ALIGN_REASON = (
    "Mamba 'align' keeps the previous state until the step that replaces it is "
    "processed, the running state, a prefill checkpoint column and the speculative "
    "states, and under asynchronous scheduling the states the steps in flight write; the "
    "other columns are null"
)


def token_span(group: GroupInfo) -> int:
    """Tokens one column of ``group`` covers: block_size on each of dcp_world_size ranks."""
    return group.block_size * int(group.floor_args.get("dcp_world_size", 1))


def reach(computed: int, scheduled: int, lookahead: int, max_model_len: int) -> int:
    """The positions a step writes: through the target's and the drafter's last one."""
    written = computed + scheduled + lookahead
    return min(written, max_model_len) if max_model_len > 0 else written


def windowed_real_bound(
    group: GroupInfo, scheduled: int, lookahead: int, in_flight: int
) -> int | None:
    """The most real (non-null) blocks a windowed table holds after a step.

    ``remove_skipped_blocks`` runs before the step's allocation, on the positions already
    processed (``computed - in_flight``: under asynchronous scheduling the previous
    step's tokens are not yet), and returns the blocks wholly before the first position
    a next token reads: ``p - W + 1 - extra_retained_tokens`` for a window of W tokens
    (``extra_retained_tokens``: the trailing tokens multi-module MTP keeps), the chunk's
    start for chunked local attention. The real blocks run from the block holding that
    position to the reach, a span of at most ``scheduled + lookahead + in_flight + W - 1
    + extra`` (``C - 1`` for a chunk of C) positions, which meets at most one block more
    than its own count. None for a group that reads no bounded span.
    """
    if group.read_span is None:
        return None
    _, size = group.read_span
    # A window's size in read_span already counts extra_retained_tokens
    # (kvconform.oracles.resolve: vLLM's SlidingWindowSpec.num_retained_tokens).
    span = scheduled + lookahead + in_flight + size - 1
    return cdiv(span, token_span(group)) + 1


def align_states_in_flight(in_flight: int, block_size: int) -> int:
    """The most blocks Mamba "align" states written by steps still in flight may hold.

    A step writes its running state (and, in a checkpoint step, its checkpoint) into the
    column of its last scheduled token's block (and the one before); the state it read,
    written by the step before, is freed (``MambaManager.remove_skipped_blocks``,
    ``last_state_block_idx``) only once the tokens past it are *processed*
    (``processed_computed_tokens``, computed less in flight), as for a window. So every
    step in flight may still hold the states it wrote besides the two a synchronous step
    holds; they lie in the columns of the ``in_flight`` positions, at most
    ``cdiv(in_flight - 1, block_size) + 1`` (0 with nothing in flight).
    """
    return cdiv(in_flight - 1, block_size) + 1 if in_flight > 0 else 0


# A group's ceiling with its fixed inputs bound: (largest reach, encoder_len, scheduled,
# lookahead, tokens in flight) -> (the most columns, the most real blocks or None). The
# check evaluates one per observation, so it is built once per group and does no more
# than the arithmetic; :func:`allowance` adds the words, on a failure only.
CeilingBound = Callable[[int, int, int, int, int], tuple[int, int | None]]


def ceiling_bound(group: GroupInfo) -> CeilingBound | None:
    """``group``'s ceiling as a function of the step's counts (:data:`CeilingBound`); None
    for a type the model leaves out (``GroupType.no_ceiling`` says why)."""
    group_type = GROUP_TYPES[group.type]
    if group_type.no_ceiling or group_type.own_pool:
        return None
    family = group.floor_rule.family
    args = group.floor_args
    block_size = group.block_size
    speculative = int(args.get("num_speculative_blocks", 0))
    if family == "encoder":
        return lambda most, encoder_len, scheduled, lookahead, in_flight: (
            cdiv(encoder_len, block_size),
            None,
        )
    if family == "ring":
        return lambda most, encoder_len, scheduled, lookahead, in_flight: (1, None)
    if family == "mamba-align":
        checkpoint = int(args.get("num_prefill_checkpoint_blocks", 0))
        real = 2 + checkpoint + speculative
        return lambda most, encoder_len, scheduled, lookahead, in_flight: (
            cdiv(most, block_size) + speculative + checkpoint,
            real + align_states_in_flight(in_flight, block_size),
        )
    if family == "mamba-state":
        max_model_len = int(args.get("max_model_len", 0))
        if max_model_len > 0 and block_size >= max_model_len:
            return lambda most, encoder_len, scheduled, lookahead, in_flight: (
                1 + speculative,
                None,
            )
        return lambda most, encoder_len, scheduled, lookahead, in_flight: (
            cdiv(most, block_size) + speculative,
            None,
        )
    span = token_span(group)
    if group.read_span is None:
        return lambda most, encoder_len, scheduled, lookahead, in_flight: (cdiv(most, span), None)

    def windowed(
        most: int, encoder_len: int, scheduled: int, lookahead: int, in_flight: int
    ) -> tuple[int, int | None]:
        columns = cdiv(most, span)
        real = windowed_real_bound(group, scheduled, lookahead, in_flight)
        return columns, None if real is None or real >= columns else real

    return windowed


def allowance(
    group: GroupInfo,
    max_reach: int,
    encoder_len: int,
    scheduled: int = 0,
    lookahead: int = 0,
    in_flight: int = 0,
) -> Allowance | None:
    """What ``group`` may hold after a step whose request has reached ``max_reach``
    positions since it started (:func:`reach`), with its formula and reasons; None for a
    type the model leaves out (``GroupType.no_ceiling`` says why). The numbers are
    :func:`ceiling_bound`'s."""
    bound = ceiling_bound(group)
    if bound is None:
        return None
    columns, real = bound(max_reach, encoder_len, scheduled, lookahead, in_flight)
    family = group.floor_rule.family
    args = group.floor_args
    speculative = int(args.get("num_speculative_blocks", 0))
    if family == "encoder":
        formula = f"cdiv({encoder_len} encoder tokens, {group.block_size})"
        return Allowance(columns, True, real, formula, _ENCODER_REASON)
    if family == "ring":
        return Allowance(columns, True, real, "1", _RING_REASON)
    if family == "mamba-align":
        checkpoint = int(args.get("num_prefill_checkpoint_blocks", 0))
        pending = align_states_in_flight(in_flight, group.block_size)
        return Allowance(
            columns,
            False,
            real,
            f"2 states + {checkpoint} checkpoint + {speculative} speculative"
            + (f" + {pending} of the steps in flight" if pending else ""),
            "the columns follow the tokens; their real blocks are bounded",
            _ALIGN_REASON,
        )
    if family == "mamba-state":
        max_model_len = int(args.get("max_model_len", 0))
        whole = max_model_len > 0 and group.block_size >= max_model_len
        formula = (
            f"1 + {speculative} speculative"
            if whole
            else f"cdiv({max_reach}, {group.block_size}) + {speculative} speculative"
        )
        return Allowance(columns, whole, real, formula, _MAMBA_REASON)
    span = token_span(group)
    per_column = f"{group.block_size}" if span == group.block_size else f"{span}"
    return Allowance(
        columns,
        True,
        real,
        f"cdiv({max_reach} largest reach, {per_column})",
        _TOKEN_REASON,
        "" if group.read_span is None else _WINDOW_REASON,
    )


ZEROING_REASON = (
    "a Mamba state shares the pool with attention blocks: a block last written as a "
    "state (or in another precision) holds bytes an attention kernel reads as NaN or "
    "infinite in masked or padded positions, and 0 x NaN is NaN; so every new block of "
    "an attention group is zeroed before its first write (a Mamba kernel rewrites its "
    "state whole before reading it; a ring's kernel reads only the rows its request wrote)"
)


def zeroing_groups(groups: Sequence[GroupInfo]) -> tuple[int, ...]:
    """The groups whose new blocks the worker must zero before their first write.

    The cache needs zeroing where a group that is not attention (a Mamba state) shares
    the pool (:data:`ZEROING_REASON`); scenarios state no per-group precision, so caches
    of two precisions (the other case vLLM zeroes for) do not arise here. Then every
    attention group of the device pool but a ring zeroes.
    """
    types = [GROUP_TYPES[group.type] for group in groups]
    if all(group_type.attention for group_type in types):
        return ()
    return tuple(
        group.index
        for group, group_type in zip(groups, types, strict=True)
        if group_type.attention and not group_type.own_pool and group.floor_rule.family != "ring"
    )
