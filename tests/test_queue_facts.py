"""The model's rule for why ``Scheduler.schedule`` may pass a request over
(``held_back`` in kvconform/model/queue_facts.py), over hand-made facts: no vLLM. Each reason
of docs/contract.md's table ("Liveness and fairness") from the facts that give it, the order
in which the reasons are weighed (the first that holds is recorded; the encoder's last), and
the prefill lookahead window's bounds."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import Any

import pytest

from kvconform.model.queue_facts import (
    ENCODER_HELD_BACK,
    WAITING_FOR_REASONS,
    HoldFacts,
    QueuedRequest,
    first_input_ahead,
    held_back,
)

# A running request at 18 of its 20 tokens, 10 of them its prompt: nothing holds it (its
# next token is known, no placeholders, far from its max_tokens and max_model_len).
COMPUTED, TOKENS, PROMPT = 18, 20, 10
FREE = HoldFacts(running=True, status="RUNNING", known=100, max_tokens=100, max_model_len=1000)

# What Mamba "align"'s split decides a running request's chunk by (blocks of 8, the split's
# limit 8): a whole-budget chunk of 2 to the prefill's end at 20.
SPLIT: dict[str, Any] = {
    "prefill_end": TOKENS,
    "split_chunk": 2,
    "mamba_block": 8,
    "split_limit": 8,
}

# Each reason, in the order the rule weighs it, and the facts (changes to FREE) that give
# it. The waiting-only reasons set ``running`` off, which turns every running-only reason
# after them off as well: a pair of reasons below always has the earlier one hold.
REASONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("its KV load is in flight", {"status": "WAITING_FOR_REMOTE_KVS"}),
    ("the LoRA limit", {"lora": True}),
    # A running prefill at 18 of 20 whose whole-budget chunk (2) finishes the prefill.
    ("a Mamba block-aligned chunk", {"mamba_split": True, **SPLIT}),
    ("its stale output is in flight", {"stale_output": 1, "running": False}),
    ("the KV connector's queue", {"kv_transfer": True, "running": False}),
    (
        "cache-aware admission reorders the waiting queue",
        {"cache_aware_window": 4, "running": False},
    ),
    ("its next token is not known before a step in flight is processed", {"known": 0}),
    # 18 + 2 - 1 placeholder >= 10 prompt + 9 max_tokens
    ("its last token is in flight", {"placeholders": 1, "max_tokens": 9}),
    ("the pipeline's decode cadence", {"decode_deferred": True}),
    ("the prefill cadence", {"prefill_chunk": True, "prefill_interval": 2}),
    # 2 tokens left within a lookahead of 2, a cap of 64 finishes the prompt
    ("the prefill lookahead window", {"prefill_chunk": True, "lookahead": 2, "chunk_cap": 64}),
    ("max_model_len", {"max_model_len": COMPUTED + 1}),  # one sampled token reaches it
    (ENCODER_HELD_BACK, {"encoder_ahead": True}),
)


def reason(changes: dict[str, Any], computed: int = COMPUTED, tokens: int = TOKENS) -> str:
    return held_back(replace(FREE, **changes), computed, tokens, PROMPT)


def test_nothing_holds_a_request_with_no_reason() -> None:
    assert reason({}) == ""
    assert reason({"running": False}) == ""
    assert (
        HoldFacts() == HoldFacts(running=False, status="WAITING")
        and held_back(HoldFacts(), 0, 32, 32) == ""
    )


@pytest.mark.parametrize(("expected", "changes"), REASONS, ids=[r for r, _ in REASONS])
def test_each_reason_holds_from_its_facts(expected: str, changes: dict[str, Any]) -> None:
    assert reason(changes) == expected


def test_every_reason_of_the_contract_is_tested_once() -> None:
    reasons = [r for r, _ in REASONS]
    assert len(set(reasons)) == len(reasons) == 13


@pytest.mark.parametrize(
    ("first", "second"),
    list(combinations(range(len(REASONS)), 2)),
    ids=[f"{i}-before-{j}" for i, j in combinations(range(len(REASONS)), 2)],
)
def test_the_earlier_reason_is_recorded_where_two_hold(first: int, second: int) -> None:
    """Every pair of reasons together: the one earlier in the rule's order is recorded, so
    the encoder's reason (which the liveness family judges at the input) comes last and hides
    no reason that always excuses."""
    (expected, early), (_, late) = REASONS[first], REASONS[second]
    assert reason({**late, **early}) == expected
    assert reason({**early, **late}) == expected


def test_the_reasons_of_a_running_request_do_not_hold_a_waiting_one() -> None:
    for expected, changes in REASONS[6:-1]:
        assert reason({**changes, "running": False}) == "", expected
    # ... and the waiting-only ones do not hold a running request.
    assert reason({"stale_output": 1, "kv_transfer": True, "cache_aware_window": 4}) == ""


def test_a_status_waiting_for_something_is_named_by_it() -> None:
    for status, expected in WAITING_FOR_REASONS.items():
        assert reason({"status": status}) == expected
        assert reason({"status": status, "running": False}) == expected
    assert reason({"status": "WAITING_FOR_SOMETHING_NEW"}) == "WAITING_FOR_SOMETHING_NEW"
    assert reason({"status": "PREEMPTED", "running": False}) == ""


def test_the_last_token_in_flight_needs_placeholders_and_a_max_tokens() -> None:
    last = "its last token is in flight"
    assert reason({"placeholders": 1, "max_tokens": 9}) == last
    assert reason({"placeholders": 1, "max_tokens": 10}) == ""  # 19 < 20: a step more fits
    assert reason({"placeholders": 0, "max_tokens": 0}) == ""
    assert reason({"placeholders": 1, "max_tokens": None}) == ""


def test_max_model_len_counts_the_tokens_sampled_per_step() -> None:
    assert reason({"max_model_len": COMPUTED + 2}) == ""
    assert reason({"max_model_len": COMPUTED + 2, "sampled": 2}) == "max_model_len"
    assert reason({"max_model_len": None}) == ""


WINDOW = "the prefill lookahead window"


def window(lookahead: int, left: int, cap: int = 64, **changes: Any) -> str:
    facts = {"prefill_chunk": True, "lookahead": lookahead, "chunk_cap": cap, **changes}
    return reason(facts, computed=TOKENS - left)


def test_the_prefill_lookahead_window_needs_a_lookahead_above_1() -> None:
    assert window(2, 1) == WINDOW
    # EAGLE's lookahead of 1 (_reserve_prefill_lookahead is a no-op) or none: no window.
    assert window(1, 1) == "" and window(0, 1) == ""


def test_the_prefill_lookahead_window_is_the_prompt_end_within_the_lookahead() -> None:
    assert [window(3, left) for left in (1, 2, 3)] == [WINDOW] * 3
    assert window(3, 4) == ""  # a cut leaves 1 token: progress
    # Nothing left: the next token is what is known next; no window.
    assert window(3, 0) == ""
    # A running prefill chunk only.
    assert window(3, 2, prefill_chunk=False) == ""
    assert window(3, 2, running=False) == ""


def test_the_prefill_lookahead_window_is_not_granted_where_the_cap_cuts_every_chunk() -> None:
    # docs/findings.md #26: 3 left within a lookahead of 3, chunks capped at 2 (or 1) leave
    # 0 < 1 < 3 and are cut to nothing at every call; no excuse, the progress rule judges.
    assert window(3, 3, cap=2) == "" and window(3, 3, cap=1) == ""
    # A cap that finishes the prompt is not cut.
    assert window(3, 3, cap=3) == WINDOW
    # An excused window is still behind the prefill cadence.
    assert window(3, 3, prefill_interval=2) == "the prefill cadence"


def test_a_queued_request_derives_held_back_from_its_recorded_facts() -> None:
    request = QueuedRequest("a", 0, 0, 0, COMPUTED, TOKENS, PROMPT, 100, 2)
    assert request.held_back == ""
    for expected, changes in REASONS:
        assert request._replace(hold=replace(FREE, **changes)).held_back == expected


def test_the_first_input_ahead_starts_at_the_computed_tokens_whatever_the_shift() -> None:
    # Scheduler._try_schedule_encoder_inputs weighs the inputs of the window from
    # num_computed_tokens (get_mm_features_in_window's lo: the first whose end passes it);
    # a drafter's prefill shift moves only the window's end. Two one-token inputs at 0 and
    # 1 (the explorer's stall of docs/explore.md, "Triaged in the seventh stop"): at 1 the
    # input at 0 is done, whatever the shift, and the one the request stops at is the next.
    adjacent = [(0, 1), (1, 1)]
    assert first_input_ahead(adjacent, 0) == 0
    assert first_input_ahead(adjacent, 1) == 1
    assert first_input_ahead(adjacent, 2) is None
    # Inside an input (a chunked one, or a prefix-cache hit that ends in it): that input.
    spread = [(8, 32), (48, 16)]
    assert first_input_ahead(spread, 7) == 0
    assert first_input_ahead(spread, 39) == 0
    assert first_input_ahead(spread, 40) == 1
    assert first_input_ahead(spread, 64) is None
    assert first_input_ahead([], 0) is None


MAMBA = "a Mamba block-aligned chunk"


def split(computed: int, chunk: int, end: int = 26, tokens: int = 0, **changes: Any) -> str:
    """The reason a running request at ``computed`` with a whole-budget chunk of ``chunk``
    tokens, its prefill ending at ``end`` (its tokens: ``end`` unless given), is recorded
    with under Mamba "align"'s split
    (blocks of 8, the split's limit 8: #28's scenario,
    scenarios/scheduler/sched-mamba-align-streaming-turn-off-grid.yaml)."""
    facts = {
        "mamba_split": True,
        "prefill_end": end,
        "split_chunk": chunk,
        "mamba_block": 8,
        "split_limit": 8,
        **changes,
    }
    return reason(facts, computed=computed, tokens=tokens or end)


def test_the_mamba_excuse_is_withheld_where_the_whole_budget_chunk_is_floored_to_nothing() -> None:
    # docs/findings.md #28's running form: on the block grid at 8, 18 prefill tokens left,
    # draft_model's draft slot leaves a chunk of 7 (8..15) that reaches no boundary, with the
    # block (8) within the split's limit (8): floored to nothing at every call.
    assert split(8, 7) == ""
    # Off the grid at 5 the same chunk reaches the boundary at 8 (the turn's first chunk).
    assert split(5, 7) == MAMBA
    # A chunk that reaches the next boundary (a budget of 9), one that finishes the
    # prefill, or a block wider than the split's limit (it advances sub-block): the split
    # only shortens the chunk, and a zero in a call is the budget other requests took.
    assert split(8, 8) == MAMBA
    assert split(8, 7, end=15) == MAMBA
    assert split(8, 7, split_limit=7) == MAMBA


def test_the_mamba_excuse_holds_a_running_request_only_while_it_prefills() -> None:
    # The split returns the chunk unchanged from the prefill's end on ("Split only during
    # prefill"): a decode is never cut by it.
    assert split(26, 1, tokens=27) == "" and split(30, 1, tokens=31) == ""
    assert split(25, 1, tokens=27) == MAMBA


def test_a_waiting_request_keeps_the_mamba_excuse_as_recorded() -> None:
    # Its split starts at its prefix-cache hit, which the waiting loop looks up; the waiting
    # form of #28 is check capacity's stall (mamba_split_cause).
    assert split(0, 7, running=False) == MAMBA
    assert split(0, 0, end=0, running=False, mamba_block=0, split_limit=0) == MAMBA


def test_a_mamba_prefill_floored_to_nothing_gets_no_lookahead_window_either() -> None:
    # Multi-module MTP's lookahead of 2, the prompt's last 2 tokens from the grid at 16, a
    # chunk of 1 the split floors to nothing: the lookahead never sees a chunk, and the cap
    # the oracle records is the split's 0, which the window's own rule does not read as a cut.
    window_facts = {"prefill_chunk": True, "lookahead": 2, "chunk_cap": 0}
    assert split(16, 1, end=18, **window_facts) == ""
    assert split(16, 2, end=18, **window_facts) == MAMBA
    # Without the split the same facts give the window: the split's floor withholds it.
    assert reason(window_facts, computed=16, tokens=18) == "the prefill lookahead window"


def test_the_mamba_excuse_is_withheld_where_the_lookahead_cuts_the_split_chunk_to_nothing() -> None:
    # docs/findings.md #26 through the split: multi-module MTP's lookahead of 2, a at 127 of
    # its 129-token prompt; the split stops the whole-budget chunk 127..129 at the block's end
    # (the oracle's chunk cap, read with the split: 1), and the reservation cuts 127..128,
    # which would leave 1 < 2, to nothing at every call: the split does not hold it there.
    facts = {"prefill_chunk": True, "lookahead": 2, "chunk_cap": 1, "known": 129}
    assert split(127, 2, end=129, **facts) == ""
    # A split chunk the reservation keeps (it finishes the prompt), or EAGLE's lookahead of 1
    # (no reservation): the split may still cut a chunk the budget left short.
    assert split(127, 2, end=129, **{**facts, "chunk_cap": 2}) == MAMBA
    assert split(127, 2, end=129, **{**facts, "lookahead": 1}) == MAMBA
    # More than the lookahead left: the cut leaves tokens, progress.
    assert split(125, 3, end=129, **facts) == MAMBA
