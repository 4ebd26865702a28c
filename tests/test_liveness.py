"""The liveness and fairness families of check ``sanity`` (kvconform/harness/checks/
liveness.py, fairness.py), on hand-built recordings of scheduler queues (no vLLM), and
going red on bugs injected into a copy of vLLM's scheduler (slow)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvconform.errors import ExitStatus
from kvconform.harness.checks import CHECKS
from kvconform.harness.checks.fairness import PASSED, SKIPPED, SKIPPED_MAMBA
from kvconform.harness.checks.liveness import (
    NO_PROGRESS,
    NO_PROGRESS_LOOKAHEAD,
    NO_PROGRESS_MAMBA,
    NO_PROGRESS_PAST_BUDGET,
    NO_PROGRESS_PAST_THRESHOLD,
    PREEMPTION_CYCLE,
    UNBOUNDED,
    next_tokens,
)
from kvconform.model.facts import Fact
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.lookahead_stall import lookahead_stuck_cap
from kvconform.model.observations import (
    MAMBA_BLOCK_PAST_BUDGET,
    MM_INPUT_PAST_BUDGET,
    MM_INPUT_PAST_THRESHOLD,
    PREFILL_LOOKAHEAD_PAST_CAP,
    GroupInfo,
    Trajectory,
)
from kvconform.model.queue_facts import (
    ENCODER_HELD_BACK,
    HoldFacts,
    PendingInput,
    QueuedRequest,
    StepQueues,
    held_back,
)

# One full-attention group of 16-token blocks; a pool of 10 blocks (9 and the null block).
GROUP = GroupInfo(
    0,
    "full_attention",
    16,
    "full_attention",
    GROUP_TYPES["full_attention"].holds_null,
    floor_args={"block_size": 16, "max_model_len": 64},
)


NOT_KNOWN = "its next token is not known before a step in flight is processed"

# Facts that give each reason these tests hold a request back by (the model's rule,
# kvconform/model/queue_facts.py ``held_back``; tests/test_queue_facts.py tests the rule).
HOLDS = {
    ENCODER_HELD_BACK: HoldFacts(encoder_ahead=True),
    NOT_KNOWN: HoldFacts(running=True),
    "the prefill cadence": HoldFacts(
        running=True, known=1 << 20, prefill_chunk=True, prefill_interval=2
    ),
    "its KV load is in flight": HoldFacts(status="WAITING_FOR_REMOTE_KVS"),
    "the LoRA limit": HoldFacts(lora=True),
}


def req(name, added=0, *, computed=0, tokens=32, held=0, priority=0, max_tokens=4):
    return QueuedRequest(
        name, added, priority, added, computed, tokens, min(tokens, 32), max_tokens, held
    )


def held_by(request: QueuedRequest, reason: str, **changes) -> QueuedRequest:
    """``request`` with the facts that hold it back for ``reason`` (and ``changes``)."""
    held = request._replace(hold=HOLDS[reason], **changes)
    assert held.held_back == reason
    return held


def step(
    running=(), waiting=(), scheduled=None, preempted=(), *, free=5, free_after=None,
    in_flight=0, policy="fcfs", budget=64, chunked=True, paused=False,
) -> StepQueues:  # fmt: skip
    return StepQueues(
        policy, tuple(waiting), tuple(running), dict(scheduled or {}), tuple(preempted),
        budget, budget, 0, 4, free, free if free_after is None else free_after, 0, 10,
        in_flight, paused, chunked, False,
    )  # fmt: skip


def judged(
    *steps: StepQueues,
    max_model_len: int = 64,
    in_flight: int = 0,
    exclusive: bool = True,
    lookahead: int = 0,
    num_speculative_tokens: int = 0,
    groups: tuple[GroupInfo, ...] = (GROUP,),
) -> list:
    trajectory = Trajectory(
        groups, lookahead=lookahead, lookahead_source="test", max_model_len=max_model_len
    )
    trajectory.num_speculative_tokens = num_speculative_tokens
    trajectory.exclusive_blocks = exclusive
    trajectory.steps_in_flight = in_flight
    trajectory.num_blocks = 10
    trajectory.request_lines = {"a": 11, "b": 12, "c": 13}
    trajectory.facts += [Fact(i, None, "-", "schedule", s) for i, s in enumerate(steps)]
    return list(CHECKS["sanity"].find(trajectory))


def invariants(failures: list) -> list[str]:
    return [f.detail["invariant"] for f in failures]


# -- liveness: progress -------------------------------------------------------------------


def test_an_empty_call_with_running_requests_that_fit_the_pool_is_no_progress():
    running = [
        req("a", 0, computed=20, tokens=21, held=2),
        req("b", 1, computed=40, tokens=41, held=3),
    ]
    # Both need 2 + 3 blocks for one more token; the pool has 9: two empty calls, one failure.
    failures = judged(step(running), step(running))
    assert invariants(failures) == [NO_PROGRESS]
    assert (
        failures[0].step == 0
        and "running requests a, b, not all held back, need at most 5 blocks" in failures[0].message
    )
    # Scheduling anything, or every running request held back (their next tokens come
    # with a step in flight): no failure.
    assert judged(step(running, scheduled={"a": (1, 2, 21), "b": (1, 3, 41)})) == []
    held = [held_by(r, NOT_KNOWN) for r in running]
    assert judged(step(held, in_flight=1)) == []


def _at_input(
    pending: PendingInput | None, *, computed=7, room=32, shift=1, whole=True, budget=32
) -> list:
    """An empty call with one running request, a (40 tokens), held at an input by the
    encoder reason; the encoder budget 32."""
    a = held_by(req("a", computed=computed, tokens=40, held=1), ENCODER_HELD_BACK)
    a = a._replace(encoder_input=pending)
    queues = step([a], budget=budget)._replace(
        encoder_budget=32, encoder_room=room, prefill_shift=shift, whole_inputs=whole
    )
    return judged(queues, max_model_len=128)


def test_a_running_request_at_an_input_the_encoder_could_take_is_no_progress():
    # docs/findings.md #24, the running form: EAGLE's shift of 1, a 32-token input at 8, a at
    # 7; under disable_chunked_mm_input the one chunk it needs is 33 tokens against 32.
    (stuck,) = _at_input(PendingInput(8, 32, 32, False))
    assert stuck.detail["invariant"] == NO_PROGRESS_PAST_BUDGET
    assert "one chunk of 33 tokens" in stuck.message and MM_INPUT_PAST_BUDGET in stuck.message
    # With the budget one token larger the cause is not #24 (nothing explains the stall):
    # still no progress, the encoder's budget and cache named as able to take it.
    (other,) = _at_input(PendingInput(8, 32, 32, False), budget=33)
    assert other.detail["invariant"] == NO_PROGRESS and MM_INPUT_PAST_BUDGET not in other.message
    assert "cache (32 free or reclaimable) can take" in other.message
    # Chunked inputs allowed: not #24 either, and not excused.
    (chunked,) = _at_input(PendingInput(8, 32, 32, False), whole=False)
    assert MM_INPUT_PAST_BUDGET not in chunked.message
    # Already in the encoder cache: no room needed, not excused.
    cached = _at_input(PendingInput(8, 32, 32, True), room=0, budget=33)
    assert invariants(cached) == [NO_PROGRESS]
    # Embeddings past the whole encoder budget (32): never taken, not excused.
    (past,) = _at_input(PendingInput(8, 40, 40, False), room=64, budget=64)
    assert past.detail["invariant"] == NO_PROGRESS and "pass the encoder budget" in past.message


def test_a_running_request_at_an_input_the_encoder_cache_cannot_hold_is_held_back():
    # The cache's free and reclaimable room below the input's embeddings: live requests'
    # items hold it, the contract's reason (can_allocate refuses); no failure. (With a
    # budget of 32 the one chunk of 33 could never be taken, room or not: #24.)
    assert _at_input(PendingInput(8, 32, 32, False), room=31, budget=33) == []
    assert invariants(_at_input(PendingInput(8, 32, 32, False), room=31)) == [
        NO_PROGRESS_PAST_BUDGET
    ]
    # No input recorded (an encoder-cache connector, an encoder-decoder model): the excuse
    # stands as recorded.
    assert _at_input(None) == []


def test_a_running_request_capped_at_an_input_is_held_back_while_another_may_go_on():
    # The long-prefill threshold (b eligible) caps the one chunk of 32 a's input needs
    # from 8 at 16. b's next token comes with a step in flight: a is held back, even with
    # its input cached; a cap of 32 holds nothing back.
    def capped(cap: int, cached: bool = False, b_at_input: bool = False) -> list:
        a = held_by(
            req("a", computed=8, tokens=40, held=1),
            ENCODER_HELD_BACK,
            encoder_input=PendingInput(8, 32, 32, cached),
        )
        b = held_by(req("b", 1, computed=20, tokens=21, held=2), NOT_KNOWN)
        if b_at_input:  # b too stops at its own 32-token input after 8 tokens of text
            b = a._replace(request="b", added=1)
        queues = step([a, b])._replace(
            encoder_budget=64, encoder_room=64, whole_inputs=True, chunk_cap=cap
        )
        return judged(queues, max_model_len=128)

    assert capped(16) == [] and capped(16, cached=True) == []
    assert invariants(capped(32)) == [NO_PROGRESS]
    # Both capped at their inputs (#22 after some text): neither can leave and lift the
    # cap, the call is no progress.
    (both,) = capped(16, b_at_input=True)
    assert both.detail["invariant"] == NO_PROGRESS_PAST_THRESHOLD
    assert "a stops at its 32-token input" in both.message
    assert MM_INPUT_PAST_THRESHOLD in both.message and MM_INPUT_PAST_BUDGET not in both.message


def test_running_prefills_cut_to_nothing_by_the_lookahead_are_no_progress_named_26():
    # docs/findings.md #26's running form: multi-module MTP's prefill lookahead of 2, a and b
    # at 18 of 20 with nothing held back (the oracle withholds the lookahead excuse where the
    # cap is below the 2 tokens left), the long-prefill threshold 1 in force.
    running = [
        req("a", 0, computed=18, tokens=20, held=2),
        req("b", 1, computed=18, tokens=20, held=2),
    ]

    def empty(cap: int, shift: int = 2, chunked: bool = True) -> list:
        queues = step(running, chunked=chunked)._replace(prefill_shift=shift, chunk_cap=cap)
        return judged(queues)

    (stuck,) = empty(1)
    assert stuck.detail["invariant"] == NO_PROGRESS_LOOKAHEAD
    assert PREFILL_LOOKAHEAD_PAST_CAP in stuck.message and "#26" in stuck.message
    assert "a has 2 prompt tokens left (computed 18 of 20)" in stuck.message
    assert "chunk cap of 1" in stuck.message
    # A cap that finishes the prompt, or EAGLE's lookahead of 1: not #26's cause; the call
    # is still no progress, unnamed.
    for failures in (empty(2), empty(0), empty(1, shift=1)):
        assert invariants(failures) == [NO_PROGRESS]
        assert PREFILL_LOOKAHEAD_PAST_CAP not in failures[0].message
    # Chunked prefill off is no exception where the call recorded the threshold as in force:
    # vLLM up to 0.33.0 caps chunks at it there too (the explorer's 0.33.0 stall, MTP k = 2,
    # threshold 1, a at 30 of 32); the oracle records no cap where the release gates it.
    (off,) = empty(1, chunked=False)
    assert off.detail["invariant"] == NO_PROGRESS_LOOKAHEAD
    # The lookahead_stuck_cap rule itself: 0 < cap < R <= lookahead, the cap the smaller of
    # the request's token budget and the threshold in force.
    queues = step(running, budget=64)._replace(prefill_shift=2, chunk_cap=1)
    assert lookahead_stuck_cap(running[0], queues) == 1
    assert lookahead_stuck_cap(running[0]._replace(computed=17), queues) == 0  # R = 3 > 2
    assert lookahead_stuck_cap(running[0]._replace(computed=19), queues) == 0  # cap = R = 1
    assert lookahead_stuck_cap(running[0], step(running, budget=1)._replace(prefill_shift=2)) == 1
    held = held_by(running[0], "the prefill cadence")
    assert lookahead_stuck_cap(held, queues) == 0
    # Under Mamba "align"'s split the cap is the split's chunk the oracle read (#26 through
    # the split: at 127 of 129 in blocks of 8 the chunk stops at 128), below the threshold.
    split = HoldFacts(
        running=True, known=129, prefill_chunk=True, mamba_split=True, prefill_end=129,
        split_chunk=2, mamba_block=8, split_limit=2, lookahead=2, chunk_cap=1,
    )  # fmt: skip
    mamba = req("a", 0, computed=127, tokens=129, held=17)._replace(hold=split)
    assert mamba.held_back == ""
    threshold = step([mamba], budget=32)._replace(prefill_shift=2, chunk_cap=2)
    assert lookahead_stuck_cap(mamba, threshold) == 1
    assert (
        lookahead_stuck_cap(mamba._replace(hold=replace(split, mamba_split=False)), threshold) == 0
    )


def test_running_requests_the_pool_cannot_hold_do_not_demand_progress():
    # 60 tokens each: 4 blocks each for one more token, 12 against a pool of 9.
    running = [req(n, i, computed=60, tokens=61, held=4) for i, n in enumerate("abc")]
    assert NO_PROGRESS not in invariants(judged(step(running)))


def test_an_empty_call_that_would_preempt_a_request_whose_frees_are_deferred_is_not_no_progress():
    # vLLM 0.34.0 with an asynchronous KV consumer and steps in flight (defer_block_free):
    # the preemption loop gives up the call at a request whose step is in flight rather than
    # preempt it (the explorer's seed-0 reproducer, sched-deferred-free-no-preemption.yaml).
    # a needs a third block for one more token, none is free, and b's blocks may not be
    # freed in this call.
    running = [
        req("a", 0, computed=32, tokens=33, held=2),
        req("b", 1, computed=20, tokens=21, held=2)._replace(frees_deferred=True),
    ]
    assert NO_PROGRESS not in invariants(judged(step(running, free=0, in_flight=1), in_flight=1))
    # With a free block for a (no preemption needed), or no deferred free, the call owes
    # progress.
    deferred = judged(step(running, free=1, in_flight=1), in_flight=1)
    assert invariants(deferred) == [NO_PROGRESS]
    plain = [r._replace(frees_deferred=False) for r in running]
    assert invariants(judged(step(plain, free=0, in_flight=1), in_flight=1)) == [NO_PROGRESS]
    # A method without lookahead (extract_hidden_states, ngram) still verifies k drafts:
    # with k = 3 a's row of 4 tokens from 30 crosses into a third block, one token does not
    # (the explorer's seed-0 reproducer of the fifth stop, k = 3, lookahead 0).
    # (a decodes: its prompt of 20 is computed.)
    a = req("a", 0, computed=30, tokens=31, held=2)._replace(frees_deferred=True, prompt=20)
    at_row = step([a], free=0, in_flight=1)
    assert NO_PROGRESS not in invariants(judged(at_row, in_flight=1, num_speculative_tokens=3))
    assert invariants(judged(at_row, in_flight=1)) == [NO_PROGRESS]


def test_a_window_keeps_the_blocks_of_steps_in_flight_and_of_requests_held_back():
    # The explorer's seed-0 reproducer on 0.33.0 (eighth stop; the same on 0.28.0-0.34.0):
    # a window of one token in 16-token blocks, DFlash (k 3, lookahead 4), overlapped, a pool
    # of 11. d (ahead) is held back (its last token in flight) with its 6 blocks; a's
    # 73-token prefill is in flight on 5, nothing is free, and a asks for a row: refused, it
    # preempts itself, the last in the policy's order. vLLM frees a window's passed blocks
    # inside allocate_slots, only for a request it serves and only below the processed
    # tokens (num_computed_tokens - num_in_flight_tokens): a keeps its 5 blocks, d its 6.
    window = GroupInfo(
        0, "sliding_window", 16, "sliding_window[sliding_window=1]", True,
        floor_args={"block_size": 16, "max_model_len": 96}, read_span=("window", 1),
    )  # fmt: skip
    d = held_by(req("d", 0, computed=77, tokens=74, held=6), NOT_KNOWN)
    a = req("a", 1, computed=73, tokens=73, held=5)._replace(
        hold=HoldFacts(running=True, known=76, placeholders=1), in_flight=73
    )
    assert not a.held_back

    def call(*running: QueuedRequest, policy: str = "priority") -> list:
        queues = step(list(running), preempted=("a",), free=0, in_flight=1, policy=policy)
        queues = queues._replace(pool=12)
        return judged(
            queues, max_model_len=96, in_flight=1, lookahead=4, num_speculative_tokens=3,
            groups=(window,),
        )  # fmt: skip

    assert call(d, a) == []
    # FCFS with d first in the running queue: a preempts itself there too.
    assert call(d, a, policy="fcfs") == []
    # d last in FCFS order is a's victim: preempting it returns its blocks (deferred or
    # not), so its window's floor is what it takes, and the call owed progress.
    assert invariants(call(a, d, policy="fcfs")) == [NO_PROGRESS]
    # Counted by the window's floor at the optimistic boundary (nothing in flight, nothing
    # held back) the same call owed progress: the failure the two facts now excuse.
    settled = call(d._replace(hold=HoldFacts(running=True, known=81)), a._replace(in_flight=0))
    assert invariants(settled) == [NO_PROGRESS]


def test_a_running_prefill_whose_next_chunk_needs_more_than_is_free_gives_up_the_call():
    # The explorer's seed 0 (sixth stop, sched-deferred-free-prefill-chunk-gives-up-the-call):
    # a running request in the middle of its prompt asks blocks for its whole next chunk
    # (the rest of the prompt, capped by the budget and the long-prefill cap), never one
    # token, and where that does not fit and its step is in flight vLLM gives up the call.
    # a: 16 of 40 prompt tokens computed, 1 block held; its next chunk of 24 needs 2 more, one
    # is free. One token would fit: that alone must not make the call owe progress.
    a = req("a", 0, computed=16, tokens=40, held=1)._replace(frees_deferred=True)
    a = a._replace(prompt=40)
    empty = step([a], free=1, in_flight=1)
    assert NO_PROGRESS not in invariants(judged(empty, in_flight=1))
    # With the chunk capped at 16 tokens (long_prefill_token_threshold in force) one block
    # does: the call owes progress.
    capped = empty._replace(chunk_cap=16)
    assert invariants(judged(capped, in_flight=1)) == [NO_PROGRESS]
    # The fairness family: b scheduled, a passed over with 1 free block after the call, its
    # chunk needing 2: a legitimate give-up, not a skip; with no deferred free it is one.
    b = req("b", 1, computed=8, tokens=9, held=1)
    served = step([a, b], scheduled={"b": (1, 1, 9)}, free=1, in_flight=1)
    assert SKIPPED not in invariants(judged(served, in_flight=1))
    plain = served._replace(running=(a._replace(frees_deferred=False), b))
    assert SKIPPED in invariants(judged(plain, in_flight=1))


def test_a_resumed_request_asks_for_every_token_it_recomputes_not_one():
    # A preempted request recomputes its prompt and its outputs as one prefill
    # (Scheduler.schedule: num_tokens_with_spec + num_output_placeholders -
    # num_computed_tokens, capped by the budget): past its prompt it still asks for the
    # outputs it has not recomputed. A decode asks for its row; a fresh prompt for the rest.
    queues = step()
    resumed = req("c", 0, computed=30, tokens=40)._replace(prompt=20)
    assert next_tokens(resumed, queues, 2, 64) == 10
    assert next_tokens(resumed, queues, 2, 6) == 6
    assert next_tokens(resumed, queues._replace(chunk_cap=4), 2, 64) == 4
    decoding = req("a", 0, computed=39, tokens=40)._replace(prompt=20)
    assert next_tokens(decoding, queues, 2, 64) == 2
    in_flight = req("a", 0, computed=41, tokens=40)._replace(prompt=20)
    assert next_tokens(in_flight, queues, 2, 64) == 2
    assert next_tokens(req("b", 0, computed=8, tokens=20), queues, 2, 64) == 12
    assert next_tokens(req("b", 0, computed=19, tokens=20), queues, 2, 64) == 1


def test_a_resumed_request_whose_recomputation_needs_a_block_more_than_is_free_gives_up():
    # The explorer's 0.33.0 seed-0 run (priority, EAGLE k = 1, decode_bench, a step in
    # flight; scenarios/scheduler/sched-deferred-free-resumed-recompute.yaml): c, preempted
    # and resumed, has recomputed 30 of its 40 tokens (prompt 20 and 20 outputs) in 2 blocks;
    # one more token fits them, its next chunk of 10 needs a third and none is free after
    # a's step. vLLM asks for the chunk, is refused, and gives up the call rather than
    # preempt a request whose step is in flight: not a skip.
    a = req("a", 0, computed=32, tokens=33, held=2)._replace(prompt=20, frees_deferred=True)
    c = req("c", 1, computed=30, tokens=40, held=2)._replace(prompt=20, frees_deferred=True)
    served = step([a, c], scheduled={"a": (1, 3, 33)}, free=1, free_after=0, in_flight=1)
    assert SKIPPED not in invariants(judged(served, in_flight=1))
    # Without the deferred free vLLM preempts instead; a call with none skipped c.
    plain = served._replace(running=tuple(r._replace(frees_deferred=False) for r in (a, c)))
    assert SKIPPED in invariants(judged(plain, in_flight=1))


def test_blocks_a_deferred_free_holds_back_are_not_the_running_requests_to_take():
    # The same run, a call later: a finished with a step in flight, so its 7 blocks wait for
    # that step's output (Scheduler.deferred_frees); the pool's 9 are c's 2 and those 7. c's
    # recomputation asks for 3 blocks; nothing vLLM can preempt frees another, so it preempts
    # c itself and schedules nothing, and a's blocks come back for the next call.
    c = req("c", 1, computed=30, tokens=40, held=2)._replace(prompt=20)
    preempting = step([c], preempted=["c"], free=0, in_flight=1)._replace(deferred=7)
    assert NO_PROGRESS not in invariants(judged(preempting, in_flight=1))
    # With the blocks free or held by no one, or no preemption (vLLM gave up otherwise),
    # the call owes progress.
    assert invariants(judged(preempting._replace(deferred=0), in_flight=1)) == [NO_PROGRESS]
    idle = preempting._replace(preempted=())
    assert invariants(judged(idle, in_flight=1)) == [NO_PROGRESS]
    # One more token for c taking a third block does not fit the 2 left either.
    grown = c._replace(computed=32, tokens=33, prompt=32)
    full = preempting._replace(running=(grown,))
    assert NO_PROGRESS not in invariants(judged(full, in_flight=1))


def test_blocks_a_waiting_request_holds_are_not_the_running_requests_to_take():
    # A KV load in flight holds its blocks while its request waits; vLLM preempts only running
    # requests, so a running request that fits the pool only with them may wait (the
    # explorer's seed-0 reproducer: three loads of 2 blocks each, a decode crossing a block).
    running = [req("a", 0, computed=32, tokens=33, held=2)]  # 3 blocks for one more token
    loading = held_by(req("b", 1, tokens=1, held=7), "its KV load is in flight")  # 2 + 7: pool full
    assert NO_PROGRESS not in invariants(judged(step(running, [loading], free=0)))
    assert invariants(judged(step(running, [loading._replace(held=0)], free=0))) == [NO_PROGRESS]


def test_an_empty_call_that_preempted_a_speculative_row_the_pool_cannot_hold_is_not_no_progress():
    # vLLM asks for a running request's whole speculative row and never shortens it: where
    # it does not fit, the preemption loop reaches the request itself and the call comes
    # back empty (the explorer's seed-0 reproducer, DFlash k = 4,
    # sched-spec-row-preempts-the-last-running-request.yaml). Lookahead 4: one more token
    # for a takes 26 + 1 + 4 -> 2 blocks, its row of 5 takes 26 + 5 + 4 -> 3; b's load holds
    # 7 of the 9, so 2 are a's to take. (a decodes: its prompt of 20 is computed; at a
    # prompt's last token vLLM asks for that one token, no row.)
    running = [req("a", 0, computed=26, tokens=27, held=2)._replace(prompt=20)]
    loading = held_by(req("b", 1, tokens=1, held=7), "its KV load is in flight")
    preempting = step(running, [loading], preempted=["a"], free=0)
    assert NO_PROGRESS not in invariants(judged(preempting, lookahead=4))
    # Without the preemption (vLLM gave up for another reason), or without speculative
    # decoding (a row of one token, which fits), the call owes progress.
    idle = step(running, [loading], free=0)
    assert invariants(judged(idle, lookahead=4)) == [NO_PROGRESS]
    assert invariants(judged(preempting)) == [NO_PROGRESS]


# -- liveness: preemption cycles ----------------------------------------------------------


def _thrash(progress: bool) -> list[StepQueues]:
    """a readmitted and preempted, call after call; with ``progress``, b decodes between."""
    steps = []
    for i in range(40):
        b = req("b", 0, computed=10 + i, tokens=11 + i, held=1)
        if i % 2:
            steps.append(step([b, req("a", 1, computed=16, tokens=17, held=2)], [],
                              {"b": (1, 1, 11 + i)} if progress else {}, ["a"]))  # fmt: skip
        else:
            steps.append(step([b], [req("a", 1, tokens=17)], {"a": (16, 1, 16)}))
    return steps


def test_a_request_preempted_again_and_again_without_progress_is_a_cycle():
    # max_model_len 4 and 4 seats: more than 16 fruitless preemptions in a row is a cycle.
    failures = [
        f
        for f in judged(*_thrash(False), max_model_len=4)
        if f.detail["invariant"] == PREEMPTION_CYCLE
    ]
    (cycle,) = failures
    assert (
        cycle.request == "a" and cycle.line == 11 and "preempted 18 times in a row" in cycle.message
    )
    assert PREEMPTION_CYCLE not in invariants(judged(*_thrash(True), max_model_len=4))
    # With the bound of a real model length, twenty fruitless preemptions in changing states
    # are not a cycle.
    assert PREEMPTION_CYCLE not in invariants(judged(*_thrash(False), max_model_len=64))


def test_a_request_preempted_three_times_in_one_state_is_a_cycle_without_prefix_caching():
    """a readmitted and preempted in the very same state of the queues, call after call."""
    b = req("b", 0, computed=10, tokens=11, held=1)
    preempts = step([b, req("a", 1, computed=16, tokens=17, held=2)], [], {}, ["a"])
    readmits = step([b], [req("a", 1, tokens=17)], {"a": (16, 1, 16)})
    steps = [readmits, preempts] * 3
    (cycle,) = [f for f in judged(*steps) if f.detail["invariant"] == PREEMPTION_CYCLE]
    assert cycle.step == 5 and "3 of them in the same state" in cycle.message
    # Twice is not enough; with prefix caching the cache's content is state the queues omit.
    assert PREEMPTION_CYCLE not in invariants(judged(*steps[:4]))
    assert PREEMPTION_CYCLE not in invariants(judged(*steps, exclusive=False))


# -- liveness: a finite workload finishes within its bound --------------------------------


def test_a_request_unfinished_past_the_workloads_bound_fails_once():
    # a: 2 prompt tokens and 1 output: bound 3 calls; it waits, unscheduled, for 6.
    a = req("a", 0, tokens=2, max_tokens=1)
    stuck = [step([], [a], free=0) for _ in range(6)]
    failures = [f for f in judged(*stuck) if f.detail["invariant"] == UNBOUNDED]
    (late,) = failures
    assert late.step == 4 and late.request == "a" and "bound of 3" in late.message
    # Calls in which every live request is held back for a listed reason add to the bound.
    waiting = held_by(a, "its KV load is in flight")
    assert UNBOUNDED not in invariants(judged(*[step([], [waiting], free=0) for _ in range(6)]))


# -- fairness -------------------------------------------------------------------------------


def test_fcfs_a_later_arrival_does_not_pass_a_request_that_fits_its_place():
    a, b = req("a", 0, tokens=32), req("b", 1, tokens=16)
    # b (handed to the scheduler after a) admitted, a left waiting: a's 32 tokens fit the
    # budget and its 2 blocks fit the 3 free after the call plus b's 1.
    (passed,) = judged(step([], [a, b], {"b": (16, 1, 16)}, free_after=3))
    assert passed.detail["invariant"] == PASSED and passed.request == "a" and passed.line == 11
    assert "later in the fcfs order" in passed.message
    # a does not fit the blocks: b may go.
    assert judged(step([], [a, b], {"b": (16, 1, 16)}, free=1, free_after=0)) == []
    # Without chunked prefill, a's whole prompt over the budget: b may go.
    assert (
        judged(step([], [a, b], {"b": (16, 1, 16)}, free_after=3, budget=20, chunked=False)) == []
    )
    # a held back (a listed reason), or b holding KV (drained first): b may go.
    held = held_by(a, "the LoRA limit")
    assert judged(step([], [held, b], {"b": (16, 1, 16)}, free_after=3)) == []
    assert judged(step([], [a, b._replace(held=1)], {"b": (16, 2, 16)}, free_after=3)) == []


def test_priority_orders_by_priority_then_arrival():
    a, b = req("a", 0, priority=1), req("b", 1, priority=0, tokens=16)
    admitted = {"b": (16, 1, 16)}
    assert judged(step([], [a, b], admitted, free_after=3, policy="priority")) == []
    (passed,) = judged(
        step([], [a._replace(priority=0), b], admitted, free_after=3, policy="priority")
    )
    assert passed.detail["invariant"] == PASSED and "later in the priority order" in passed.message


def test_a_running_request_is_not_skipped_when_budget_and_blocks_allow():
    a, b = req("a", 0, computed=20, tokens=21, held=2), req("b", 1, computed=16, tokens=17, held=1)
    (skipped,) = judged(step([a, b], [], {"a": (1, 2, 21)}, free=2))
    assert skipped.detail["invariant"] == SKIPPED and skipped.request == "b"
    assert "budget had 63 token(s) left" in skipped.message
    # The budget spent, a preemption in the call, no free block, or b held back: no failure.
    assert judged(step([a, b], [], {"a": (1, 2, 21)}, free=2, budget=1)) == []
    assert judged(step([a, b], [], {"a": (1, 2, 21)}, ["c"], free=2)) == []
    assert judged(step([a, b], [], {"a": (1, 2, 21)}, free=0)) == []
    held = held_by(b, ENCODER_HELD_BACK)
    assert judged(step([a, held], [], {"a": (1, 2, 21)}, free=2)) == []


def split_stuck(name: str, added: int, **split) -> QueuedRequest:
    """A running prefill on the block grid at 8 of its 25 prompt tokens under Mamba "align"'s
    split (blocks of 8, the split's limit 8) with a whole-budget chunk of 7, as the scheduler
    oracle records it (docs/findings.md #28's running form:
    scenarios/scheduler/sched-mamba-align-streaming-turn-off-grid.yaml); ``split`` changes
    the split's facts."""
    facts = {"prefill_end": 25, "split_chunk": 7, "mamba_block": 8, "split_limit": 8, **split}
    hold = HoldFacts(running=True, known=25, prefill_chunk=True, mamba_split=True, **facts)
    return req(name, added, computed=8, tokens=25, held=1)._replace(hold=hold)


def test_a_running_prefill_the_mamba_split_floors_to_nothing_is_no_progress_named_28():
    (stuck,) = judged(step([split_stuck("a", 0)]))
    assert stuck.detail["invariant"] == NO_PROGRESS_MAMBA
    assert MAMBA_BLOCK_PAST_BUDGET in stuck.message and "#28" in stuck.message
    assert "a has 17 prefill tokens left (computed 8) and a chunk of 7" in stuck.message
    # A chunk that reaches the next boundary, or a block wider than the split's limit: the
    # split only shortens the chunk, and the empty call is excused as before.
    assert judged(step([split_stuck("a", 0, split_chunk=8)])) == []
    assert judged(step([split_stuck("a", 0, split_limit=7)])) == []


def test_a_running_prefill_the_mamba_split_floors_to_nothing_is_skipped_named_28():
    b = req("b", 1, computed=16, tokens=17, held=1)
    (skipped,) = judged(step([split_stuck("a", 0), b], [], {"b": (1, 1, 17)}, free=2))
    assert skipped.detail["invariant"] == SKIPPED_MAMBA and skipped.request == "a"
    assert "#28" in skipped.message
    # Excused where the whole-budget chunk reaches a boundary: b took the budget it needed.
    excused = split_stuck("a", 0, split_chunk=8)
    assert judged(step([excused, b], [], {"b": (1, 1, 17)}, free=2)) == []


# -- injected into a copy of vLLM 0.34.0's scheduler (slow) ------------------------------

SCHEDULER = "v1/core/sched/scheduler.py"

# Every fourth schedule() serves no running request: the calls come back empty while the
# running requests fit the pool.
STARVES_RUNNING = (
    SCHEDULER,
    "        while req_index < len(self.running) and token_budget > 0:",
    "        while (\n"
    "            req_index < len(self.running) and token_budget > 0\n"
    "            and self.current_step % 4 != 0\n"
    "        ):",
)
# From the sixth call on, no running request is ever served again: the run stalls with only
# running requests, which fit the pool (before, the oracle blamed the scenario's pool).
STOPS_SERVING_RUNNING = (
    SCHEDULER,
    "        while req_index < len(self.running) and token_budget > 0:",
    "        while (\n"
    "            req_index < len(self.running) and token_budget > 0\n"
    "            and self.current_step < 6\n"
    "        ):",
)
# The running loop passes over every running request but the first on every third call.
SKIPS_RUNNING = (
    SCHEDULER,
    "            if self.current_step < request.next_decode_eligible_step:",
    "            if self.current_step < request.next_decode_eligible_step or (\n"
    "                req_index > 0 and self.current_step % 3 == 0\n"
    "            ):",
)
# The head of the waiting queue is deferred while another request waits behind it: LIFO.
PASSES_THE_HEAD = (
    SCHEDULER,
    "                ready_to_schedule = self._handle_blocked_waiting_request(request)",
    "                ready_to_schedule = self._handle_blocked_waiting_request(request) and (\n"
    "                    len(request_queue) < 2\n"
    "                )",
)
# Request.__lt__ orders the priority queue lowest priority first: the waiting request
# vLLM admits is the last of the (priority, arrival) order.
INVERTS_PRIORITY = (
    "v1/request.py",
    "            return self.priority < other.priority",
    "            return self.priority > other.priority",
)


def _injected(pristine_tree, tmp_path, bug, scenario: str, *extra: str):
    from vllm_copy import REPO, run_kvconform, tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *bug)
    out = tmp_path / "report"
    done = run_kvconform(
        "run", REPO / scenario, "--vllm-src", tree, "--report-dir", out, "--progress", "off",
        "--no-expectations", *extra, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = json.loads((out / "report.json").read_text())["scenarios"]
    return {f["detail"].get("invariant") for f in entry["failures"] if f.get("detail")}, entry


@pytest.mark.slow
def test_progress_catches_a_scheduler_that_serves_no_running_request(pristine_tree, tmp_path):
    found, entry = _injected(
        pristine_tree, tmp_path, STARVES_RUNNING,
        "scenarios/scheduler/sched-liveness-preemption-pressure.yaml", "-k", "sync and not async",
    )  # fmt: skip
    assert NO_PROGRESS in found, entry


@pytest.mark.slow
def test_fairness_catches_a_running_request_skipped(pristine_tree, tmp_path):
    found, entry = _injected(
        pristine_tree, tmp_path, SKIPS_RUNNING,
        "scenarios/scheduler/sched-fairness-fcfs-waiting-order.yaml", "-k", "sync and not async",
    )  # fmt: skip
    assert SKIPPED in found, entry


@pytest.mark.slow
def test_fairness_catches_a_later_arrival_admitted_first(pristine_tree, tmp_path):
    found, entry = _injected(
        pristine_tree, tmp_path, PASSES_THE_HEAD,
        "scenarios/scheduler/sched-fairness-fcfs-waiting-order.yaml", "-k", "sync and not async",
    )  # fmt: skip
    assert PASSED in found, entry


@pytest.mark.slow
def test_fairness_catches_a_priority_queue_served_backwards(pristine_tree, tmp_path):
    found, entry = _injected(
        pristine_tree, tmp_path, INVERTS_PRIORITY,
        "scenarios/scheduler/sched-fairness-priority-waiting-order.yaml", "-k", "sync and not async",
    )  # fmt: skip
    assert PASSED in found, entry


@pytest.mark.slow
def test_a_run_stuck_with_running_requests_is_vllms_not_the_scenarios(pristine_tree, tmp_path):
    found, entry = _injected(
        pristine_tree, tmp_path, STOPS_SERVING_RUNNING,
        "scenarios/scheduler/sched-no-speculation.yaml", "-k", "sync and not async",
    )  # fmt: skip
    assert NO_PROGRESS in found, entry
    assert entry["verdict"] == "failed", entry


# -- what the oracle records for held back (vLLM's own Scheduling part, stand-in state) --


def test_the_oracle_records_the_encoder_reason_last_and_the_prefill_lookahead_only_above_1(
    vllm,
) -> None:
    """``Scheduling.hold_facts`` reads plain attributes of vLLM's ``Scheduler`` and
    ``Request``: stand-ins with those attributes (not vLLM objects: a placeholder's
    ``offset``, ``length`` and ``get_num_embeds`` as ``PlaceholderRange`` has them, the
    encoder cache's ``cached`` and ``num_freeable_slots``, the ``VllmConfig`` parts the chunk
    cap reads) say, through the model's rule, which reason a running prefill chunk gets."""
    from types import SimpleNamespace

    from kvconform.oracles.vllm.scheduling import Scheduling

    api = vllm.part(Scheduling)
    position = SimpleNamespace(offset=8, length=32, get_num_embeds=lambda: 32)
    feature = SimpleNamespace(mm_position=position, identifier="a-0")

    def scheduler(
        lookahead: int, cached: tuple[str, ...] = (), *, threshold: int = 0, interval: int = 1
    ) -> SimpleNamespace:
        cache = SimpleNamespace(cached={h: set() for h in cached}, num_freeable_slots=20)
        sched_config = SimpleNamespace(
            max_num_batched_tokens=64, long_prefill_token_threshold=threshold
        )
        return SimpleNamespace(
            num_prefill_lookahead=lookahead,
            encoder_cache_manager=cache,
            max_num_encoder_input_tokens=64,
            max_num_running_reqs=2,
            local_prefill_interval=interval,
            vllm_config=SimpleNamespace(scheduler_config=sched_config, speculative_config=None),
        )

    def request(multimodal: bool, computed: int = 7) -> SimpleNamespace:
        return SimpleNamespace(
            status="RUNNING", num_computed_tokens=computed, num_tokens=40, num_prompt_tokens=40,
            num_tokens_with_spec=40, num_output_placeholders=0, max_tokens=2,
            is_prefill_chunk=True, has_encoder_inputs=multimodal,
            mm_features=[feature] if multimodal else None,
        )  # fmt: skip

    def reason(stand_in: SimpleNamespace, request: SimpleNamespace) -> str:
        facts = api.hold_facts(stand_in, request, True)
        return held_back(facts, request.num_computed_tokens, request.num_tokens, 40)

    # EAGLE's lookahead of 1: _reserve_prefill_lookahead is a no-op, no reason of its own;
    # with an input ahead the encoder's reason, with the input's facts.
    assert reason(scheduler(1), request(False)) == ""
    assert reason(scheduler(1), request(True)) == ENCODER_HELD_BACK
    assert api.pending_input(scheduler(1), request(True)) == (8, 32, 32, False)
    assert api.pending_input(scheduler(1, cached=("a-0",)), request(True)) == (8, 32, 32, True)
    assert api.encoder_room(scheduler(1)) == (64, 20)
    # At the input's end (40) it is done, though EAGLE's shift of 1 reaches one token past
    # it: _try_schedule_encoder_inputs' window starts at num_computed_tokens, so no input
    # is pending, none is ahead, and the encoder holds nothing back (the explorer's stall of
    # docs/explore.md, "Triaged in the seventh stop", had the input just computed taken
    # for the one the request stops at).
    done = request(True, computed=40)
    assert api.pending_input(scheduler(1, cached=("a-0",)), done) is None
    assert not api.hold_facts(scheduler(1), done, True).encoder_ahead
    assert api.pending_input(scheduler(1), request(True, computed=39)) == (8, 32, 32, False)
    # A lookahead of 2 (multi-module MTP) with 33 tokens left: a cut leaves 31, progress, so
    # no reason of its own (issue 35: it used to excuse any prefill chunk).
    assert reason(scheduler(2), request(False)) == ""
    assert reason(scheduler(2), request(True)) == ENCODER_HELD_BACK
    # The prefill cadence (pipeline parallelism's local_prefill_interval) excuses any chunk.
    assert reason(scheduler(2, interval=2), request(False)) == "the prefill cadence"
    assert reason(scheduler(1, interval=2), request(False)) == "the prefill cadence"
    # 2 tokens left within the lookahead of 2, and a chunk of 64 with the whole budget free
    # would finish the prompt: only the budget others take in a call can cut it; excused.
    window = "the prefill lookahead window"
    assert reason(scheduler(2), request(False, computed=38)) == window
    # ... with the cap below them (threshold 1, docs/findings.md #26): cut to nothing at
    # every call, never excused; the liveness family judges the call.
    assert reason(scheduler(2, threshold=1), request(False, computed=38)) == ""
    assert reason(scheduler(2, threshold=2), request(False, computed=38)) == window
    # The cap is the one the stall's cause reads (SchedulingQueues.prefill_chunk_cap).
    stand_in = scheduler(2, threshold=1)
    cap = api.prefill_chunk_cap(stand_in, stand_in.vllm_config, request(False, 38), 38)
    assert cap == 1 == api.hold_facts(stand_in, request(False, 38), True).chunk_cap
    # The facts the rule read, as the oracle records them.
    facts = api.hold_facts(scheduler(2, interval=2), request(True), True)
    assert (facts.lookahead, facts.prefill_interval, facts.known) == (2, 2, 40)
    assert facts.running and facts.prefill_chunk and facts.encoder_ahead
    assert not api.hold_facts(scheduler(2), request(False), True).encoder_ahead


@pytest.mark.slow
def test_the_oracle_records_the_blocks_a_deferred_free_holds_back(vllm) -> None:
    """The explorer's 0.33.0 finding, run on vLLM: at the call where c, resumed, preempts
    itself and nothing is scheduled, a's blocks wait in ``Scheduler.deferred_frees``; the
    count recorded is what the pool holds that is neither free nor any live request's (its
    usable blocks less the free and the held ones: no block of a's is shared here), and the
    scenario conforms."""
    from kvconform.harness.loader import load_file
    from kvconform.harness.runner import run_scenario
    from kvconform.model.results import Verdict

    (scenario,) = load_file("scenarios/scheduler/sched-deferred-free-resumed-recompute.yaml")
    recordings: list = []
    result = run_scenario(scenario, vllm, record=recordings.append)
    assert result.verdict is Verdict.PASSED, result.failures or result.error
    (recording,) = recordings
    calls = [f.what for f in recording.trajectory.facts if isinstance(f.what, StepQueues)]
    (empty,) = [
        q
        for q in calls
        if q.running and q.preempted and not any(t for t, _, _ in q.scheduled.values())
    ]
    live = empty.running + empty.waiting
    assert empty.deferred == empty.pool - 1 - empty.free_before - sum(r.held for r in live) > 0
    assert sum(q.deferred for q in calls) == empty.deferred  # held back at that call only
