"""The zeroing rule (:mod:`kvconform.model.zeroing`), without vLLM."""

from __future__ import annotations

from kvconform.model.zeroing import judge_zeroing, load_keeps_valid_kv

NULL = 0


def test_new_blocks_must_be_listed_and_valid_ones_must_not() -> None:
    # Columns 0-1 were a prefix hit (valid), 3-4 are new; block 7 was held before.
    table = [5, 6, 7, 8, 9]
    unzeroed, wiped = judge_zeroing(
        table,
        before=[NULL, NULL, 7],
        listed={5, 9},
        null_block=NULL,
        holds_valid_kv=lambda i, b: i < 2,
    )
    assert unzeroed == [8], "a new block off the list is reported, one held before is not"
    assert wiped == [5], "a hit block on the list wipes valid KV"


def test_the_null_block_is_never_judged() -> None:
    unzeroed, wiped = judge_zeroing(
        [NULL, NULL, 3],
        before=(),
        listed={NULL},
        null_block=NULL,
        holds_valid_kv=lambda i, b: False,
    )
    assert (unzeroed, wiped) == ([3], [])


def test_a_list_that_holds_exactly_the_new_blocks_passes() -> None:
    assert judge_zeroing(
        [1, 2, 3], before=[1], listed={2, 3}, null_block=NULL, holds_valid_kv=lambda i, b: False
    ) == ([], [])


def test_a_block_that_moved_column_is_new() -> None:
    # A sliding window's block 1 left the window (its column 0 nulled, remove_skipped_blocks)
    # and came back from the pool at column 2 in the same call: it must be zeroed there, and
    # listing it wipes nothing of value.
    table = [NULL, 2, 1]
    assert judge_zeroing(
        table, before=[1, 2], listed={1}, null_block=NULL, holds_valid_kv=lambda i, b: False
    ) == ([], [])
    assert judge_zeroing(
        table, before=[1, 2], listed=set(), null_block=NULL, holds_valid_kv=lambda i, b: False
    ) == ([1], [])


def test_a_load_keeps_valid_only_what_the_model_reads() -> None:
    # Full attention: every column under the loaded tokens (17: columns 0-1) is the load's.
    assert [load_keeps_valid_kv(c, 16, 17, None) for c in range(3)] == [True, True, False]
    # A 1-token window: the next token (position 17) reads only itself, so nothing loaded is
    # read, and vLLM zeroes the block under the loaded tokens (allocate_new_blocks).
    assert [load_keeps_valid_kv(c, 16, 17, ("window", 1)) for c in range(3)] == [False] * 3
    # A 4-token window reads positions 14-16: columns 0 (14, 15) and 1 (16).
    assert [load_keeps_valid_kv(c, 16, 17, ("window", 4)) for c in range(3)] == [
        True,
        True,
        False,
    ]
    assert [load_keeps_valid_kv(c, 16, 16, ("window", 4)) for c in range(2)] == [True, False]
    # A local chunk of 16: position 17 reads from 16 on (column 1); at 16, nothing loaded.
    assert [load_keeps_valid_kv(c, 16, 17, ("chunk", 16)) for c in range(3)] == [
        False,
        True,
        False,
    ]
    assert [load_keeps_valid_kv(c, 16, 16, ("chunk", 16)) for c in range(2)] == [False, False]
