"""The arithmetic behind a multimodal stall's named cause (``whole_input_chunk`` in
kvconform/model/observations.py), pure: no vLLM.

Under ``disable_chunked_mm_input`` vLLM's ``_try_schedule_encoder_inputs`` rolls a chunk
that ends inside an input back to ``max(0, start_pos - (num_computed_tokens +
shift_computed_tokens))``, or to nothing where the chunk starts on the input; the scheduler
oracle names a stall by the one chunk the request then needs, against the request's token
budget (docs/findings.md #24) and the long-prefill threshold (#22). The shapes below are the
explorer's reproducers (docs/explore.md) and the scenarios of both findings. A multi-module
MTP stall at a prompt's end is named by ``lookahead_cuts_to_nothing`` (#26); a Mamba "align"
stall whose every chunk the block-aligned split floors to nothing by
``block_split_cuts_to_nothing`` (#28); a head that does not fit before requests whose KV
loads arrived and which still hold blocks by ``arrived_loads_held_behind`` (#30).
"""

from __future__ import annotations

import pytest

from kvconform.model.observations import (
    STALL_CAUSES,
    whole_input_chunk,
)
from kvconform.model.queue_facts import (
    arrived_loads_held_behind,
    block_split_cuts_to_nothing,
    lookahead_cuts_to_nothing,
)


@pytest.mark.parametrize(
    ("inputs", "computed", "shift", "chunk"),
    [
        # #24 through DFlash's shift (seed 0's final-run stall): a prompt of 4, a 3-token
        # input at offset 1; from 0 the roll-back is 1 - (0 + 1) = 0, so the chunk is 0..4.
        ([(1, 3)], 0, 1, 4),
        # Without a drafter the roll-back leaves the token before the input: no stall there.
        ([(1, 3)], 0, 0, 0),
        # #24 through draft_model's draft slot (seed 0's second-run stall): a 2-token input
        # at offset 0, no shift; the chunk starts on the input.
        ([(0, 2)], 0, 0, 2),
        # sched-mm-input-past-request-budget-shift: a 32-token input after one token, EAGLE.
        ([(1, 32)], 0, 1, 33),
        # #22's shift form (sched-mm-input-past-long-prefill-threshold-shift): from 15, one
        # token before a 16-token input at 16, the chunk must reach 32.
        ([(16, 16)], 15, 1, 17),
        # Inside an input (a prefix hit ending in it): the rest of it.
        ([(4, 8)], 6, 0, 6),
        # Past the input, or further before it than the shift: nothing holds the request.
        ([(4, 8)], 12, 1, 0),
        ([(16, 16)], 14, 1, 0),
        # A multi-module MTP shift of 2: from 2 tokens before the input on.
        ([(5, 3)], 3, 2, 5),
        ([(5, 3)], 2, 2, 0),
        # Inputs back to back: the one the request is on, not the next within the shift.
        ([(0, 2), (2, 2)], 1, 1, 1),
        ([(0, 2), (2, 2)], 2, 1, 2),
    ],
)
def test_the_chunk_a_request_needs_to_get_past_the_input_it_is_held_at(
    inputs: list[tuple[int, int]], computed: int, shift: int, chunk: int
) -> None:
    assert whole_input_chunk(inputs, computed, shift) == chunk


def test_each_stall_cause_is_its_own_signature() -> None:
    """An entry of scenarios/explore-known.yaml for one cause excuses no other: the
    causes are distinct texts."""
    assert len(set(STALL_CAUSES)) == len(STALL_CAUSES) == 7


@pytest.mark.parametrize(
    ("left", "cap", "lookahead", "stalls"),
    [
        # #26's scenario and seed 0's stall: MTP k = 2, threshold 1, 2 prompt tokens left.
        # The chunk of 1 would leave 1 < 2 and is cut by 2 - 1 = 1, to nothing.
        (2, 1, 2, True),
        # 3 left: the chunk of 1 leaves 2, the lookahead: not cut; progress.
        (3, 1, 2, False),
        # A chunk that finishes the prompt is never cut.
        (2, 2, 2, False),
        (1, 1, 2, False),
        # k = 4, threshold 2: 3 or 4 left stall (cut to 3 - 4 or 4 - 4); 5 left is cut to
        # 5 - 4 = 1 token, progress.
        (3, 2, 4, True),
        (4, 2, 4, True),
        (5, 2, 4, False),
        # EAGLE's lookahead of 1 never stalls: a cap below the tokens left leaves 1 or more.
        (2, 1, 1, False),
        # No drafter, nothing left: nothing to cut.
        (2, 1, 0, False),
        (0, 1, 2, False),
    ],
)
def test_the_prefill_lookahead_cuts_a_capped_chunk_to_nothing_only_within_it(
    left: int, cap: int, lookahead: int, stalls: bool
) -> None:
    """Scheduler._reserve_prefill_lookahead, by hand: a chunk of min(cap, left) tokens that
    leaves 0 < r < lookahead is cut by lookahead - r (docs/findings.md #26)."""
    assert lookahead_cuts_to_nothing(left, cap, lookahead) is stalls
    chunk = min(cap, left)
    remaining = left - chunk
    if 0 < remaining < lookahead:
        chunk -= lookahead - remaining
    assert (left > 0 and max(chunk, 0) == 0) is stalls


@pytest.mark.parametrize(
    ("start", "chunk", "prefill_left", "block", "split_limit", "stalls"),
    [
        # #28's scenario and seed 0's stall: blocks of 8, max_num_batched_tokens 8 less
        # draft_model's slot: chunks of 7 from 0 reach no boundary; the limit is 8.
        (0, 7, 20, 8, 8, True),
        (0, 7, 8, 8, 8, True),
        # A chunk that finishes the prefill is kept (the prompt's last chunk is exempt).
        (0, 7, 7, 8, 8, False),
        # A budget of 9: chunks of 8 reach the boundary at 8.
        (0, 8, 20, 8, 9, False),
        # Blocks of 16, the limit 8: "A block too wide for one chunk advances sub-block".
        (0, 7, 20, 16, 8, False),
        # Blocks of 16 with a budget of 16 less one slot: the same stall one size up.
        (0, 15, 40, 16, 16, True),
        # A chunk that starts mid-block and ends before the next boundary floors below its
        # start: nothing, where the block is within the limit (a hit at a finer hash grid).
        (4, 3, 20, 8, 8, True),
        # From mid-block to past the boundary: the boundary's part is kept.
        (4, 7, 20, 8, 8, False),
        # A production-sized block (hundreds of tokens) and a budget just below it.
        (0, 527, 4000, 528, 528, True),
        (0, 528, 4000, 528, 529, False),
        # No chunk, nothing left: nothing to cut.
        (0, 0, 20, 8, 8, False),
        (8, 7, 0, 8, 8, False),
    ],
)
def test_the_block_aligned_split_floors_a_chunk_to_nothing_only_below_a_block_within_its_limit(
    start: int, chunk: int, prefill_left: int, block: int, split_limit: int, stalls: bool
) -> None:
    """Scheduler._mamba_block_aligned_split's floor, by hand: a chunk ending short of the
    prefill's end ends at the block boundary at or before its end, unless that boundary does
    not pass its start and the block is wider than the limit (docs/findings.md #28)."""
    assert block_split_cuts_to_nothing(start, chunk, prefill_left, block, split_limit) is stalls
    end = start + chunk
    if end < start + prefill_left:
        aligned = end // block * block
        if aligned > start or block <= split_limit:
            end = aligned
    assert (chunk > 0 and max(end - start, 0) == 0) is stalls


@pytest.mark.parametrize(
    ("need", "available", "arrived_held", "stalls"),
    [
        # #30's scenario and seed 0's stall on 0.33.0: a's recompute needs 10 blocks, 9 are
        # free, b (its load arrived) holds the last chunk's 3 blocks behind it.
        (10, 9, [3], True),
        # The head fits: the loop goes on past it and promotes b.
        (9, 9, [3], False),
        # Nothing arrived behind the head (or what arrived holds nothing): another stall.
        (10, 9, [], False),
        (10, 9, [0], False),
        # Blocks held behind the head help even where they alone would not make it fit:
        # the loaded request can never run, whatever the head needs.
        (12, 2, [3, 1], True),
    ],
)
def test_a_head_that_does_not_fit_holds_back_the_arrived_loads_behind_it(
    need: int, available: int, arrived_held: list[int], stalls: bool
) -> None:
    """Scheduler.schedule promotes a request out of WAITING_FOR_REMOTE_KVS only when its
    waiting loop reaches it, and breaks at a head whose allocate_slots returns None
    (docs/findings.md #30)."""
    assert arrived_loads_held_behind(need, available, arrived_held) is stalls
