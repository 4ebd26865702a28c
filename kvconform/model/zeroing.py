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
    written_by_others: Collection[int] = (),
) -> tuple[list[int], list[int]]:
    """(new blocks left off the list, valid blocks on it) of one group's ``table``.

    ``before``: the table at the previous allocation: a block at the same column there is
    not new. One that moved columns is: vLLM freed it (a sliding window's block that left
    the window, ``remove_skipped_blocks``) and handed it out again in the same call, so its
    KV is another position's, and it is new at its new column;
    ``holds_valid_kv(index, block)``: whether the block at that column holds KV already;
    ``written_by_others``: blocks another request of the same step writes in it
    (:func:`new_unwritten_blocks` of that request), for a request that reads none of them
    in this step: none holds valid KV before the step, whichever column they stand at.
    """
    unzeroed: list[int] = []
    wiped: list[int] = []
    for index, block in enumerate(table):
        if block == null_block or (index < len(before) and before[index] == block):
            continue
        valid = block not in written_by_others and holds_valid_kv(index, block)
        if valid and block in listed:
            wiped.append(block)
        elif not valid and block not in listed:
            unzeroed.append(block)
    return unzeroed, wiped


def new_unwritten_blocks(
    table: Sequence[int],
    before: Sequence[int],
    null_block: int,
    holds_valid_kv: Callable[[int, int], bool],
) -> set[int]:
    """The blocks new in one group's ``table`` (as :func:`judge_zeroing` counts them) that
    hold no valid KV before the step: the request's own forward writes them in it, after
    the worker zeroes the step's list.

    Another request of the same step may hold such a block already as a prefix hit: the
    allocation that hands it out caches it at once (``KVCacheManager.allocate_slots`` ends
    in ``cache_blocks``, before the forward), so a later lookup in the same
    ``schedule()`` finds it. Its KV is written in this step, not before it: zeroing it
    first is what the writer needs, and wipes nothing a sharer beginning an asynchronous
    load reads: that request runs no forward before the load lands, in a later step, and
    its connector writes only the unhashed blocks (NIXL's ``update_state_after_alloc``:
    ``get_unhashed_block_ids_all_groups``). The zeroing family exempts only such sharers
    (``kvconform/harness/checks/zeroing.py``).
    """
    return {
        block
        for index, block in enumerate(table)
        if block != null_block
        and not (index < len(before) and before[index] == block)
        and not holds_valid_kv(index, block)
    }


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
