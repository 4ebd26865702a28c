"""The zeroing rule (:mod:`kvconform.model.zeroing`), without vLLM."""

from __future__ import annotations

from kvconform.model.zeroing import judge_zeroing

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
