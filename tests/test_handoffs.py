"""The boundary-state hand-off rule (:mod:`kvconform.model.handoffs`), without vLLM."""

from __future__ import annotations

from kvconform.model.handoffs import judge_handoffs


def never_pending(state: tuple[int, int, int]) -> bool:
    return False


def test_a_state_cached_in_the_step_must_be_handed_over() -> None:
    # Block 4 held the state of 64 tokens before the step; block 9's state of 128 is new.
    lost, stale = judge_handoffs(
        cached_before={(1, 4, 64)},
        cached_after={(1, 4, 64), (1, 9, 128)},
        offered=set(),
        is_pending_tail=never_pending,
        freed_blocks=(),
    )
    assert lost == [(1, 9, 128)], "a new entry nobody was handed is lost to the connector"
    assert stale == []


def test_a_block_handed_over_must_still_hold_the_state() -> None:
    # A copy-on-write moved the entry of 96 tokens from block 5 to block 11; handing over
    # block 5 would offload what the next forward writes into it.
    lost, stale = judge_handoffs(
        cached_before={(1, 5, 96)},
        cached_after={(1, 11, 96)},
        offered={(1, 5, 96)},
        is_pending_tail=never_pending,
        freed_blocks=(),
    )
    assert stale == [(1, 5, 96)]
    assert lost == [(1, 11, 96)], "the copy that holds the state now was not handed over"


def test_pending_tails_and_freed_requests_are_not_judged() -> None:
    lost, stale = judge_handoffs(
        cached_before=(),
        cached_after={(1, 7, 112), (1, 8, 64)},
        offered={(1, 3, 32)},
        is_pending_tail=lambda state: state == (1, 7, 112),
        freed_blocks={3, 8},
    )
    assert (lost, stale) == ([], [])


def test_exactly_the_new_states_handed_over_passes() -> None:
    assert judge_handoffs(
        cached_before={(0, 1, 16)},
        cached_after={(0, 1, 16), (0, 2, 32)},
        offered={(0, 2, 32)},
        is_pending_tail=never_pending,
        freed_blocks=(),
    ) == ([], [])
