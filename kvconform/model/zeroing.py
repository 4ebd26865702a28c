"""Which new blocks the worker must zero before a step, and which it must not.

Where vLLM zeroes new KV-cache blocks (``KVCacheConfig.needs_kv_cache_zeroing``: a model
with Mamba layers, whose state is read before it is fully written, or caches of two
precisions; #35219), each step hands the worker a list of block ids to zero. A block new
in a recording group's table belongs on it, unless it already holds valid KV: a prefix
hit's block, or one an asynchronous KV-connector load writes. Zeroing a valid block wipes
KV the model then reads as written; leaving a new block off lets the model read what the
block held for its previous owner. Both oracles (the live allocator and vLLM's scheduler)
judge their lists with :func:`judge_zeroing`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from kvconform.model.floors import first_position_read


def judge_zeroing(
    table: Sequence[int],
    before: Sequence[int],
    listed: Collection[int],
    null_block: int,
    holds_valid_kv: Callable[[int, int], bool],
) -> tuple[list[int], list[int]]:
    """(new blocks left off the list, valid blocks on it) of one group's ``table``.

    ``before``: the table at the previous allocation: a block at the same column there is
    not new. One that moved columns is: vLLM freed it (a sliding window's block that left
    the window, ``remove_skipped_blocks``) and handed it out again in the same call, so its
    KV is another position's, and it is new at its new column;
    ``holds_valid_kv(index, block)``: whether the block at that column holds KV already.
    """
    unzeroed: list[int] = []
    wiped: list[int] = []
    for index, block in enumerate(table):
        if block == null_block or (index < len(before) and before[index] == block):
            continue
        valid = holds_valid_kv(index, block)
        if valid and block in listed:
            wiped.append(block)
        elif not valid and block not in listed:
            unzeroed.append(block)
    return unzeroed, wiped


def load_keeps_valid_kv(
    column: int, block_size: int, loaded_end: int, read_span: tuple[str, int] | None
) -> bool:
    """Whether the block at ``column`` holds KV an asynchronous load writes that the model
    then reads, for a request whose tokens up to ``loaded_end`` are computed or loaded.

    A windowed group (``read_span``: a sliding window, a local chunk) reads from the first
    position the next token (``loaded_end``) attends to; KV before it is never read, and
    vLLM loads none of it: ``allocate_external_computed_blocks`` counts the skipped tokens
    out (``get_num_skipped_tokens``), and the block a column of only skipped or future
    positions gets comes from ``allocate_new_blocks``, which hands it to the worker to zero.
    """
    start = 0 if read_span is None else first_position_read(*read_span, loaded_end)
    return (
        start < loaded_end
        and column * block_size < loaded_end
        and ((column + 1) * block_size > start)
    )
