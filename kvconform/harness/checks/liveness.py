"""``sanity``, the liveness family: vLLM's scheduler keeps serving a workload it can serve.

Judged on each ``schedule()`` call's queues (:class:`~kvconform.model.queue_facts.StepQueues`),
with the floor's arithmetic for what a request needs (``GroupInfo.pool_blocks``, an upper
bound of what a table may rightly hold, so that "fits" is never claimed for a request
that may not fit); docs/contract.md ("Liveness and fairness") states the model:

* **progress.** A call with running requests one of which is not held back for a listed
  reason (one whose next token comes with a step still in flight is), and the running
  requests' blocks for one more token each within the pool (less the null block, the
  blocks waiting requests hold and those a deferred free holds back, which no preemption
  frees),
  schedules something: ``schedule()`` serves its
  running requests first and preempts the last of them until the first fits, so such a
  call cannot come back empty. (A call with only waiting requests that fit is check
  ``capacity``'s stall.) Except where the free blocks may not do for the running requests'
  whole speculative rows and a running request's blocks may not be freed in this call
  (``QueuedRequest.frees_deferred``: an asynchronous KV consumer with steps in flight): the
  preemption loop gives up the call at such a request. And except a call that preempted,
  where the running requests' whole next chunks or speculative rows (``next_tokens``: a
  resumed request's recomputation included; 1 + k tokens each, ``row_of``) do not fit that
  pool: vLLM never shortens them to fit, so it preempts the first running request too and
  schedules nothing in that call.
* **no preemption cycle.** A request preempted again with no progress in the run since
  its last preemption (no request's computed position past its high-water mark, none
  finished) is a fruitless preemption; more than
  ``max_model_len × max_num_seqs × (1 + steps in flight)`` of them in a row is a cycle.
  Why that many: in a window without progress every scheduled token is recomputation,
  the first running request of the policy's order is never the victim (vLLM preempts the
  last, or the lowest priority), so the window ends once it has recomputed, at most
  ``max_model_len`` tokens; each call of the window schedules a token (progress), for it
  or for one of at most ``max_num_seqs - 1`` others that may take the budget before it,
  and a request is preempted at most once a call. Without prefix caching (whose content is
  state the queues omit) a streak is a cycle sooner: at the third fruitless preemption of a
  request in one recorded state (the running queue in order, the waiting requests, each
  one's computed and known tokens and blocks, the free blocks, the steps in flight). The
  recording omits some of what ``schedule()`` decides by (the waiting queue's own order,
  its step counter), so a second visit could be a coincidence; a third is taken for a cycle.
* **a finite workload finishes in bounded time.** Each request is gone (finished or
  aborted) within ``(1 + steps in flight) × (W + R) + H`` calls of its arrival: W the
  tokens (prompt and ``max_tokens``, a streaming session's later turns included) of every
  request live in that time, R the tokens
  computed before each preemption in it (recomputed), H its calls in which nothing was
  scheduled while every live request was held back or the engine paused admissions
  with nothing running. Every other call schedules a token (progress; the waiting
  requests' stall is ``capacity``'s), each token is one of W or R, and a step in flight
  delays a request's next token by at most the steps in flight.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import at_request, fact_failure, facts_of
from kvconform.model.lookahead_stall import lookahead_stuck_cap
from kvconform.model.observations import (
    MAMBA_BLOCK_PAST_BUDGET,
    MM_INPUT_PAST_BUDGET,
    MM_INPUT_PAST_THRESHOLD,
    PREFILL_LOOKAHEAD_PAST_CAP,
    Trajectory,
    capped_at_input,
    held_at_input_in_empty_call,
    input_chunk,
    input_never_fits,
    request_token_budget,
)
from kvconform.model.queue_facts import (
    ENCODER_HELD_BACK,
    QueuedRequest,
    StepQueues,
    block_split_stuck,
)
from kvconform.model.results import Failure

NO_PROGRESS = "schedules nothing while the running requests fit the pool"
# The same, where a running request stops at a multimodal input it can never take: the
# invariant names the cause (as capacity's stalls do), so that the explorer's triage
# (scenarios/explore-known.yaml) tells #24's and #22's running forms from other stalls.
NO_PROGRESS_PAST_BUDGET = f"{NO_PROGRESS}: {MM_INPUT_PAST_BUDGET}"
NO_PROGRESS_PAST_THRESHOLD = f"{NO_PROGRESS}: {MM_INPUT_PAST_THRESHOLD}"
# The same, where a running prefill's prompt end lies within the drafter's prefill lookahead
# past its chunk cap, which _reserve_prefill_lookahead cuts to nothing at every call: #26's
# running form.
NO_PROGRESS_LOOKAHEAD = f"{NO_PROGRESS}: {PREFILL_LOOKAHEAD_PAST_CAP}"
# The same, where Mamba "align"'s split floors a running prefill's every chunk to nothing:
# #28's running form.
NO_PROGRESS_MAMBA = f"{NO_PROGRESS}: {MAMBA_BLOCK_PAST_BUDGET}"
PREEMPTION_CYCLE = "preempts a request again and again without progress"
UNBOUNDED = "leaves a request unfinished past the workload's bound"

# Fruitless preemptions of one request in one recorded state that make a cycle (see
# _cycles): the recording omits some of what schedule() decides by (the waiting queue's
# own order, its step counter), so a second visit could be a coincidence of the recorded
# part; a third is taken for the cycle it is.
_REPEATS = 3


def lookahead_of(trajectory: Trajectory) -> int:
    """The larger of the lookahead vLLM reserves with and the drafter's (the floor's):
    needs counted with it are upper bounds."""
    return max(trajectory.lookahead, trajectory.floor_lookahead or 0)


def row_of(trajectory: Trajectory) -> int:
    """The most tokens vLLM schedules a running request in one step: its speculative row,
    1 + its drafts (``num_speculative_tokens``; never shortened to fit the blocks), counted
    with at least 1 + the lookahead as before, an upper bound either way. Methods whose
    lookahead is below k (ngram, suffix, ``extract_hidden_states``: 0) still verify k
    drafts."""
    return 1 + max(trajectory.num_speculative_tokens, lookahead_of(trajectory))


def blocks_for(
    trajectory: Trajectory, request: QueuedRequest, scheduled: int, *, settled: bool = True
) -> int:
    """The most device blocks ``request``'s tables may rightly hold after a step of
    ``scheduled`` more tokens (every group's ``pool_blocks``), counted from its processed
    tokens: ``KVCacheManager.allocate_slots`` frees the blocks a window has passed only below
    ``num_computed_tokens - num_in_flight_tokens`` ("in-flight steps' attention windows still
    read blocks below the optimistic boundary", 0.28.0-0.34.0), so the tokens of a step in
    flight count as scheduled with the new ones, and the blocks they keep are the request's.
    ``settled=False``: from ``num_computed_tokens`` (the window's floor at the optimistic
    boundary), for a request another may preempt: its blocks go, whatever they are."""
    lookahead = lookahead_of(trajectory)
    encoder = trajectory.encoder_lens.get(request.request, 0)
    in_flight = min(request.in_flight, request.computed) if settled else 0
    processed = request.computed - in_flight
    return sum(
        group.pool_blocks(processed, in_flight + scheduled, lookahead, encoder)
        if group.read_span is not None  # only a window passes blocks it may give back
        else group.pool_blocks(request.computed, scheduled, lookahead, encoder)
        for group in trajectory.groups
    )


def running_need(
    trajectory: Trajectory, request: QueuedRequest, queues: StepQueues, tokens: int
) -> int:
    """The blocks a running request takes of the pool for ``tokens`` more in this call: a
    request the call may serve, from its processed tokens (:func:`blocks_for`); one held back
    that a served request may preempt, its floor (a preemption returns the rest); one held
    back that none may preempt, all it holds where that is more (:func:`kept_whole`)."""
    if not request.held_back:
        return blocks_for(trajectory, request, tokens)
    floor = blocks_for(trajectory, request, tokens, settled=False)
    return max(floor, kept_whole(request, queues))


def kept_whole(request: QueuedRequest, queues: StepQueues) -> int:
    """The blocks a running request keeps whole through the call (0: none it must): one held
    back, which the call serves no ``allocate_slots`` that would give back what a window has
    passed, and which no request the call serves may preempt. The victim is the last running
    request (FCFS: the running queue's order, which the recording keeps; priority: the
    largest (priority, arrival)), so a request ahead of every request not held back is
    nobody's to take: those preempt themselves first."""
    if not request.held_back:
        return 0
    order = list(queues.running)
    if queues.policy == "priority":
        order.sort(key=lambda r: (r.priority, r.stamp))
    place = order.index(request)
    servable = [i for i, r in enumerate(order) if not r.held_back]
    return request.held if servable and all(place < i for i in servable) else 0


def asked_blocks(trajectory: Trajectory, request: QueuedRequest, tokens: int) -> int:
    """At most the new blocks ``allocate_slots`` asks for ``tokens`` more of ``request``'s
    tokens: per group, the block-table columns the chunk and the lookahead reach past those
    its computed tokens fill, every one a real block while the chunk writes it (a sliding
    window's earlier columns are nulled, its new ones are not), or what the rightful
    holdings add, where that is more. An upper bound: a miss rather than a false alarm."""
    lookahead = lookahead_of(trajectory)
    end = request.computed + tokens + lookahead
    columns = sum(
        max(0, -(-end // group.block_size) - -(-request.computed // group.block_size))
        for group in trajectory.groups
    )
    return max(columns, blocks_for(trajectory, request, tokens) - request.held, 0)


def next_tokens(request: QueuedRequest, queues: StepQueues, row: int, budget: int) -> int:
    """The tokens ``Scheduler.schedule`` asks blocks for when it serves a running request in
    this call: the rest of its known tokens (``num_tokens_with_spec + num_output_placeholders
    - num_computed_tokens``), capped by the token ``budget`` left and the long-prefill
    threshold in force (``chunk_cap``, 0: none), while it prefills; else its speculative
    row. A request prefills while its prompt is not computed, or while more than its last
    token is not: a preempted request recomputes its prompt and its outputs as one prefill
    (its drafts dropped), so a resumed request past its prompt still asks for every output
    token it has not recomputed, not one. ``allocate_slots`` is asked for those and,
    refused, the loop preempts (or, where the victim's free is deferred, gives up the
    call): it never asks for fewer."""
    left = request.tokens - request.computed
    if left <= 0 or (left == 1 and request.computed >= request.prompt):
        return row
    caps = [budget] + ([queues.chunk_cap] if queues.chunk_cap else [])
    return max(1, min([left, *caps]))


def _progress(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    idle = False
    for index, fact in facts_of(trajectory, StepQueues):
        queues = fact.what
        assert isinstance(queues, StepQueues)
        empty = not any(tokens for tokens, _, _ in queues.scheduled.values())
        if not empty or not queues.running:
            idle = False
            continue
        if queues.input_budget <= queues.draft_slots or idle:
            continue
        if all(held_at_input_in_empty_call(r, queues) for r in queues.running):
            continue
        # A request held back in this call keeps every block it holds (vLLM frees a window's
        # passed blocks inside allocate_slots, which it calls only for a request it serves)
        # where no request it serves may preempt it: under the priority policy, one ahead
        # of every request not held back.
        need = sum(running_need(trajectory, r, queues, 1) for r in queues.running)
        # Blocks a waiting request holds (a KV load in flight, a finished one) are not the
        # running requests' to take: vLLM preempts only running requests. Nor are those a
        # deferred free holds back (a request that finished or was preempted with a step in
        # flight): they go back once that step is processed, and no preemption frees them.
        kept = sum(r.held for r in queues.waiting) + queues.deferred
        if need > queues.pool - 1 - kept:
            continue
        row = row_of(trajectory)
        if queues.preempted:
            # vLLM asks for a running request's whole next chunk (a prefill's, a preempted
            # request's recomputation included, up to the budget and the long-prefill cap)
            # or speculative row (1 + its drafts, at most 1 + the lookahead tokens) and never
            # shortens it to fit: where those do not fit the pool it preempts down to the
            # first running request and, that one's still not fitting, preempts it too ("No
            # more request to preempt"), and the call comes back empty with the blocks freed
            # for the next.
            budget = request_token_budget(queues)
            asks = sum(
                running_need(trajectory, r, queues, next_tokens(r, queues, row, budget))
                for r in queues.running
            )
            if asks > queues.pool - 1 - kept:
                continue
        if any(r.frees_deferred for r in queues.running):
            # vLLM schedules a running request's whole next chunk (a prefill's, up to the
            # token budget and the long-prefill cap in force) or speculative row (row_of),
            # never fewer tokens to fit: the extra blocks that may take, against the free ones.
            extra = sum(
                asked_blocks(trajectory, r, next_tokens(r, queues, row, queues.token_budget))
                for r in queues.running
            )
            if extra > queues.free_before:
                # The free blocks may not do and a preemption may come to a request whose
                # step is in flight: vLLM gives up the call rather than preempt it (its
                # blocks are freed once that step is processed); the next call goes on.
                continue
        idle = True
        names = ", ".join(r.request for r in queues.running)
        at_input = "".join(
            _at_input(r, queues) + lookahead_note(r, queues) + mamba_note(r) for r in queues.running
        )
        invariant = NO_PROGRESS
        if any(input_never_fits(r, queues) for r in queues.running):
            invariant = NO_PROGRESS_PAST_BUDGET
        elif any(capped_at_input(r, queues) for r in queues.running):
            invariant = NO_PROGRESS_PAST_THRESHOLD
        elif any(lookahead_stuck_cap(r, queues) for r in queues.running):
            invariant = NO_PROGRESS_LOOKAHEAD
        elif any(mamba_note(r) for r in queues.running):
            invariant = NO_PROGRESS_MAMBA
        yield (
            index,
            fact_failure(
                fact,
                f"schedule() scheduled nothing ({queues.in_flight} step(s) in flight) while "
                f"running requests {names}, not all held back, need at most {need} blocks "
                f"for one more token each and the pool has {queues.pool - 1} (less the null block; {queues.free_before} free): vLLM "
                f"serves its running requests first and preempts until one fits{at_input}",
                invariant,
            ),
        )


def lookahead_note(request: QueuedRequest, queues: StepQueues) -> str:
    """What the progress failure says of a running prefill that
    ``_reserve_prefill_lookahead`` cuts to nothing at every call (:func:`lookahead_stuck_cap`);
    "" for any other request."""
    cap = lookahead_stuck_cap(request, queues)
    if not cap:
        return ""
    return (
        f"; {request.request} has {request.tokens - request.computed} prompt tokens left "
        f"(computed {request.computed} of {request.tokens}), within the drafter's prefill "
        f"lookahead of {queues.prefill_shift}, and a chunk cap of {cap}: "
        "_reserve_prefill_lookahead cuts every chunk to nothing, "
        f"{PREFILL_LOOKAHEAD_PAST_CAP} (docs/findings.md #26)"
    )


def mamba_note(request: QueuedRequest) -> str:
    """What the progress failure says of a running prefill, held back for no reason, whose
    every chunk Mamba "align"'s split floors to nothing (:func:`block_split_stuck`, over the
    facts the oracle recorded); "" for any other request."""
    hold = request.hold
    if request.held_back or not block_split_stuck(hold, request.computed):
        return ""
    return (
        f"; {request.request} has {hold.prefill_end - request.computed} prefill tokens left "
        f"(computed {request.computed}) and a chunk of {hold.split_chunk} with the whole "
        f"budget free, which reaches no boundary of its {hold.mamba_block}-token Mamba blocks, "
        f"within the split's limit of {hold.split_limit}: _mamba_block_aligned_split floors "
        f"every chunk to nothing, {MAMBA_BLOCK_PAST_BUDGET} (docs/findings.md #28)"
    )


def _at_input(request: QueuedRequest, queues: StepQueues) -> str:
    """What the progress failure says of a running request held at a multimodal input
    that does not excuse the call (:func:`held_at_input_in_empty_call`), its cause named
    where the input can never be taken; "" for any other request."""
    pending = request.encoder_input
    if request.held_back != ENCODER_HELD_BACK or pending is None:
        return ""
    where = (
        f"; {request.request} stops at its {pending.length}-token input at {pending.offset} "
        f"(computed {request.computed})"
    )
    chunk = input_never_fits(request, queues)
    if chunk:
        return (
            f"{where}, which under disable_chunked_mm_input it must take in one chunk of "
            f"{chunk} tokens (the input and the drafter's prefill shift of "
            f"{queues.prefill_shift}) against its token budget of "
            f"{request_token_budget(queues)}: {MM_INPUT_PAST_BUDGET}, never scheduled "
            "(docs/findings.md #24)"
        )
    if capped_at_input(request, queues):
        return (
            f"{where}, which under disable_chunked_mm_input it must take in one chunk of "
            f"{input_chunk(request, queues)} tokens, past the long-prefill threshold of "
            f"{queues.chunk_cap} that the other requests keep in force, each stopped at an "
            f"input too: {MM_INPUT_PAST_THRESHOLD}, never scheduled (docs/findings.md #22)"
        )
    if pending.cached:
        return f"{where}, already in the encoder cache"
    if pending.embeds > queues.encoder_budget:
        return (
            f"{where}, whose {pending.embeds} embeddings pass the encoder budget "
            f"({queues.encoder_budget}): never scheduled"
        )
    return (
        f"{where}, whose {pending.embeds} embeddings the encoder budget ({queues.encoder_budget}) "
        f"and cache ({queues.encoder_room} free or reclaimable) can take, with nothing else "
        "scheduled"
    )


def _cycles(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    seats = 1
    for _, fact in facts_of(trajectory, StepQueues):
        assert isinstance(fact.what, StepQueues)
        seats = max(seats, fact.what.max_num_seqs)
    limit = max(trajectory.max_model_len, 1) * seats * (1 + trajectory.steps_in_flight)
    high: dict[str, int] = {}  # request -> the furthest position it computed
    progress = 0  # the sum of the high-water marks, plus the requests finished
    live: set[str] = set()
    last: dict[str, int] = {}  # request -> progress at its last preemption
    streak: dict[str, int] = {}
    # request -> the states the scheduler was in at its fruitless preemptions in a row
    # (without prefix caching: with it, the cache's content is state the queues omit)
    seen: dict[str, dict[tuple, int]] = {}
    reported: set[str] = set()
    for index, fact in facts_of(trajectory, StepQueues):
        queues = fact.what
        assert isinstance(queues, StepQueues)
        now = {r.request for r in queues.waiting} | {r.request for r in queues.running}
        progress += len(live - now)
        live = now
        state = (
            tuple((r.request, r.computed, r.tokens, r.held) for r in queues.running),
            tuple(sorted((r.request, r.computed, r.tokens, r.held) for r in queues.waiting)),
            queues.free_before,
            queues.in_flight,
        )
        for rid in queues.preempted:
            fruitless = last.get(rid) == progress
            streak[rid] = streak.get(rid, 0) + 1 if fruitless else 0
            last[rid] = progress
            states = seen.setdefault(rid, {})
            if not fruitless:
                states.clear()
            states[state] = states.get(state, 0) + 1
            repeated = trajectory.exclusive_blocks and states[state] >= _REPEATS
            if (repeated or streak[rid] > limit) and rid not in reported:
                reported.add(rid)
                why = (
                    f"{_REPEATS} of them in the same state of the queues, computed tokens and "
                    "free blocks: the scheduler goes round a cycle"
                    if repeated
                    else f"more than the {limit} a run without a cycle allows (max_model_len "
                    "× max_num_seqs × (1 + the steps in flight))"
                )
                yield (
                    index,
                    fact_failure(
                        at_request(trajectory, fact, rid),
                        f"preempted {streak[rid] + 1} times in a row with no request computing a "
                        f"new token or finishing in between, {why}",
                        PREEMPTION_CYCLE,
                    ),
                )
        for rid, (tokens, _, end) in queues.scheduled.items():
            if tokens and end > high.get(rid, 0):
                progress += end - high.get(rid, 0)
                high[rid] = end


def _bounded(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    factor = 1 + trajectory.steps_in_flight
    arrived: dict[str, int] = {}  # request -> the call it was first seen at
    work: dict[str, int] = {}  # request -> its W, R and H so far
    held: dict[str, int] = {}
    calls: dict[str, int] = {}  # schedule() calls recorded since it arrived
    sizes: dict[str, int] = {}  # request -> the most prompt + max_tokens it had
    reported: set[str] = set()
    for index, fact in facts_of(trajectory, StepQueues):
        queues = fact.what
        assert isinstance(queues, StepQueues)
        everyone = queues.waiting + queues.running
        # Every live request's bound grows with the work of those that join it, and with
        # a streaming session's next turn (its prompt grows); a new request's starts with
        # every live request's whole work (a bound, not a count).
        joined = 0
        for r in everyone:
            size = r.prompt + r.max_tokens
            joined += max(0, size - sizes.get(r.request, 0))
            sizes[r.request] = max(size, sizes.get(r.request, 0))
        start = sum(r.prompt + r.max_tokens for r in everyone)
        computed = {r.request: r.computed for r in queues.running}
        redo = sum(computed.get(rid, 0) for rid in queues.preempted)
        empty = not any(tokens for tokens, _, _ in queues.scheduled.values())
        waits = empty and all(
            r.held_back or (queues.paused and r in queues.waiting) for r in everyone
        )
        for r in everyone:
            rid = r.request
            if rid not in arrived:
                arrived[rid], work[rid], held[rid], calls[rid] = fact.step, start, 0, 0
            else:
                work[rid] += joined
                calls[rid] += 1
            work[rid] += redo
            held[rid] += int(waits)
            elapsed = calls[rid]
            bound = factor * work[rid] + held[rid]
            if elapsed > bound and rid not in reported:
                reported.add(rid)
                yield (
                    index,
                    fact_failure(
                        at_request(trajectory, fact, rid),
                        f"still unfinished {elapsed} schedule() calls after it arrived (at step "
                        f"{arrived[rid]}), past the "
                        f"workload's bound of {bound} ({factor} × {work[rid]} tokens of the "
                        f"requests live meanwhile, recomputation included, + {held[rid]} calls "
                        "with every request held back)",
                        UNBOUNDED,
                    ),
                )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the liveness family, in recording order."""
    found = [*_progress(trajectory), *_cycles(trajectory), *_bounded(trajectory)]
    found.sort(key=lambda pair: pair[0])
    yield from found
