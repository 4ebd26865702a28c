"""The zeroing rule (:mod:`kvconform.model.zeroing`), without vLLM."""

from __future__ import annotations

from kvconform.model.zeroing import judge_zeroing, load_keeps_valid_kv, new_unwritten_blocks

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


def test_a_same_step_hit_on_a_block_another_request_writes_is_not_valid() -> None:
    # explore seed 0 on 0.34.0 (example 378): a (16 tokens) gets block 1 new and computes
    # it in the step; b, beginning an asynchronous load of 17 tokens, adopts block 1 as a
    # 16-token prefix hit in the same schedule() (a's allocation cached it) and gets block
    # 3 for the loaded token. The list holds block 1, for a.
    listed = {1}
    a_valid = lambda column, block: False  # noqa: E731 - a computes from 0
    b_valid = lambda column, block: load_keeps_valid_kv(column, 16, 17, None)  # noqa: E731
    written_by_a = new_unwritten_blocks([1], before=(), null_block=NULL, holds_valid_kv=a_valid)
    assert written_by_a == {1}
    assert judge_zeroing([1], (), listed, NULL, a_valid) == ([], [])
    # b: block 1's KV is a's, written after the step's zeroing; b's loaded block 3 stays off.
    assert judge_zeroing([1, 3], (), listed, NULL, b_valid, written_by_a) == ([], [])
    # The rule without what a writes held block 1 valid for b (the false alarm).
    assert judge_zeroing([1, 3], (), listed, NULL, b_valid) == ([], [1])
    # What b's load writes (block 3) listed is still a wipe, whatever a writes.
    assert judge_zeroing([1, 3], (), {1, 3}, NULL, b_valid, written_by_a) == ([], [3])


def test_new_unwritten_blocks_are_the_new_ones_without_valid_kv() -> None:
    # Column 0 held before (block 4), column 1 a hit (valid), columns 2-3 new and computed.
    table = [4, 5, 6, NULL]
    assert new_unwritten_blocks(
        table, before=[4], null_block=NULL, holds_valid_kv=lambda i, b: i < 2
    ) == {6}


def _one_step(loading: frozenset[str]) -> list[str]:
    """The zeroing family's messages for explore seed 0's step 0 (example 378), by hand: a
    computes block 1 new; b holds it at column 0 as a same-step prefix hit, and block 3 at
    column 1; ``loading``: whether b begins an asynchronous load (17 tokens valid once it
    lands) or computes in the step (16 valid)."""
    from kvconform.harness.checks.zeroing import judge
    from kvconform.model.facts import Fact, StepZeroingList
    from kvconform.model.observations import GroupInfo, Trajectory

    groups = (
        GroupInfo(0, "full_attention", 16, "full", False),
        GroupInfo(1, "mamba", 16, "mamba", False),
    )
    trajectory = Trajectory(groups, 0, "test")
    trajectory.null_block = NULL
    listed = StepZeroingList(
        groups=(0,),
        block_sizes=(16, 16),
        tables={"a": ((1,), (2,)), "b": ((1, 3), (NULL, 4))},
        judged=frozenset({"a", "b"}),
        loading=loading,
        valid_end={"a": 0, "b": 17 if loading else 16},
        listed=frozenset({1} if loading else {1, 3}),
    )
    trajectory.facts.append(Fact(0, 26, "-", "schedule", listed))
    return [failure.message for _, failure in judge(trajectory)]


def test_only_a_loading_request_reads_a_same_step_hit_after_its_writer() -> None:
    # b begins an asynchronous load: it reads block 1 a step later, after a wrote it.
    assert _one_step(frozenset({"b"})) == []
    # b computes in the step: block 1 stays judged valid for it (where vLLM zeroes, a Mamba
    # hybrid, such a hit is deferred: MambaManager's cached_blocks_this_step, #29387).
    (message,) = _one_step(frozenset())
    assert "request b: block(s) [1] hold KV that is valid before the step" in message
