"""``sanity``, the zeroing family: the blocks vLLM hands the worker to zero.

Where vLLM zeroes new blocks (Mamba layers, mixed precision), every block new in a
recording group's table is on the worker's zeroing list, and no block of valid KV (a
prefix hit's, one an asynchronous load writes) is: the rule is
:func:`kvconform.model.zeroing.judge_zeroing`, applied to the lists the live oracle
records (:class:`~kvconform.model.facts.ZeroingList`), and in scheduler mode to each
``schedule()`` call's list (``SchedulerOutput.new_block_ids_to_zero``,
:class:`~kvconform.model.facts.StepZeroingList`): there a block a request held at the
last ``schedule()`` and holds still at the same column has its KV written (one that moved
column was freed and handed out again: new), and a new block is valid only
under the tokens computed before the step or, for an asynchronous load it begins, under the
loaded tokens the model reads again (:func:`kvconform.model.zeroing.load_keeps_valid_kv`: a
windowed group never reads what lies before the next token's window).

Which groups must zero is derived from the specs, not taken from vLLM's
``records_new_block_ids`` (:func:`kvconform.model.contract.zeroing_groups`): a group that
must and whose new blocks vLLM never records (:class:`~kvconform.model.facts.ZeroingGroups`)
fails once, whatever the lists say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvconform.harness.checks.records import at_request, fact_failure, facts_of
from kvconform.model.contract import ZEROING_REASON, zeroing_groups
from kvconform.model.facts import Fact, StepZeroingList, ZeroingGroups, ZeroingList
from kvconform.model.observations import NOT_ZEROED, ZEROES_VALID_KV, Trajectory
from kvconform.model.results import Failure
from kvconform.model.zeroing import judge_zeroing, load_keeps_valid_kv, new_unwritten_blocks


def replay_starts(trajectory: Trajectory) -> dict[tuple[int, str], dict[int, int]]:
    """(step, request) -> {group: the position its KV starts at} for the groups that
    replayed a prefix-cache hit (SWA bounded replay: ``Request.replay_start``, recorded
    as the lowest position the step reads, ``Trajectory.read_bounds``)."""
    starts: dict[tuple[int, str], dict[int, int]] = {}
    observations = trajectory.observations
    for index, start in trajectory.read_bounds.items():
        obs = observations[index]
        if trajectory.groups[obs.group].replay_tokens:
            starts.setdefault((obs.step, obs.request), {})[obs.group] = start
    return starts


def replayed_tokens(trajectory: Trajectory, starts: dict[int, int]) -> int:
    """The hit's tokens past the computed count, for a request whose groups ``starts``
    replayed it: the replay window (vLLM's scheduler asserts one for every group), all
    of it where the replay starts past 0 (a shorter hit is replayed whole from 0 or,
    at admission, dropped)."""
    return max((trajectory.groups[g].replay_tokens for g in starts), default=0)


def _valid_kv_rules(
    trajectory: Trajectory,
    fact: Fact,
    rid: str,
    previous: dict[str, tuple[tuple[int, ...], ...]],
    refilled: dict[str, tuple[tuple[int, ...], ...]],
    replays: dict[tuple[int, str], dict[int, int]],
) -> tuple[tuple[tuple[int, ...], ...], list[Callable[[int, int], bool]]]:
    """A judged request's tables at the last allocation, and per group of the list
    ``holds_valid_kv(column, block)``: whether its block there holds KV before the step."""
    what = fact.what
    assert isinstance(what, StepZeroingList)
    table = what.tables[rid]
    loading = rid in what.loading
    valid_end = what.valid_end.get(rid, 0)
    before = refilled.get(rid) or previous.get(rid, ((),) * len(table))
    starts = replays.get((fact.step, rid), {})
    predicates: list[Callable[[int, int], bool]] = [lambda column, block: False] * len(table)
    for group in what.groups:
        size = what.block_sizes[group]
        span = trajectory.groups[group].read_span
        # A replayed hit (SWA bounded replay): the group that replays holds KV only
        # from the replay's start, where its computed count stands before the step
        # (nothing valid yet: the replay writes it); the other groups adopted the
        # whole hit, the replayed tokens past the computed count included.
        valid = (
            (starts[group], valid_end)
            if group in starts
            else (0, valid_end + replayed_tokens(trajectory, starts))
        )

        def holds_valid_kv(
            column: int,
            block: int,
            size: int = size,
            span: tuple[str, int] | None = span,
            valid: tuple[int, int] = valid,
        ) -> bool:
            if loading:
                return load_keeps_valid_kv(column, size, valid_end, span)
            start, end = valid
            return start < end and column * size < end and (column + 1) * size > start

        predicates[group] = holds_valid_kv
    return before, predicates


def _step_list(
    trajectory: Trajectory,
    fact: Fact,
    previous: dict[str, tuple[tuple[int, ...], ...]],
    refilled: dict[str, tuple[tuple[int, ...], ...]],
    replays: dict[tuple[int, str], dict[int, int]],
) -> Iterator[Failure]:
    """A ``schedule()`` call's zeroing list against every request's tables then and at
    the last call (``previous``); ``replays``: :func:`replay_starts`."""
    what = fact.what
    assert isinstance(what, StepZeroingList)
    null = trajectory.null_block
    listed = set(what.listed)
    # A block a request held at the last step and holds still, at the same column, has KV
    # written by then: on the list, the worker wipes it (a load that completed, a computed
    # prefix). At another column it is new: vLLM freed it (a sliding window's block that
    # left the window, remove_skipped_blocks, nulls its column) and handed it out again.
    for rid, table in sorted(what.tables.items()):
        # A request freed since the last list (preempted, its load failed as a whole) may
        # get a block back at the column it had: its own KV adopted as a prefix hit (a
        # bounded replay's range included), or one handed out anew, which vLLM zeroes.
        # Which, the tables do not tell: such a block is not judged either way.
        if rid not in previous or rid in refilled:
            continue
        kept = sorted(
            block
            for group in what.groups
            for block, was in zip(table[group], previous[rid][group], strict=False)
            if block == was and block != null and block in listed
        )
        if kept:
            yield fact_failure(
                at_request(trajectory, fact, rid),
                f"block(s) {kept}, which the request held with their KV at the last "
                "step, are on this step's zeroing list",
                ZEROES_VALID_KV,
            )
    judged = sorted((rid, table) for rid, table in what.tables.items() if rid in what.judged)
    # Per request and group, what it holds valid before the step; then the blocks each
    # writes in the step (new, not valid for it), which hold nothing valid for a request
    # beginning an asynchronous load that adopted them as a same-step prefix hit
    # (new_unwritten_blocks): it reads them once its load lands, in a later step. A request
    # that computes in the step would read them in the same forward; where vLLM zeroes (a
    # Mamba hybrid) it defers such a hit (MambaManager's cached_blocks_this_step, #29387),
    # so for it they stay judged as valid.
    rules = {rid: _valid_kv_rules(trajectory, fact, rid, previous, refilled, replays)
             for rid, _ in judged}  # fmt: skip
    written = {
        rid: {
            block
            for group in what.groups
            for block in new_unwritten_blocks(
                table[group], rules[rid][0][group], null, rules[rid][1][group]
            )
        }
        for rid, table in judged
    }
    for rid, table in judged:
        unzeroed: list[int] = []
        wiped: list[int] = []
        loading = rid in what.loading
        befores, predicates = rules[rid]
        by_others = (
            {block for other, blocks in written.items() if other != rid for block in blocks}
            if loading
            else set()
        )
        for group in what.groups:
            missing, wrong = judge_zeroing(
                table[group], befores[group], listed, null, predicates[group], by_others
            )
            # A load's block outside what it keeps valid (a windowed group's skipped
            # positions, lookahead) may be zeroed; whether it must is not judged here.
            unzeroed += [] if loading else [b for b in missing if b not in what.copied]
            # A copy-on-write destination (a partial hit's private block) is zeroed, then
            # filled by the copy the worker runs after the list (model_runner, "after
            # zeroing new blocks and before the forward pass reads them").
            wiped += [b for b in wrong if b not in what.copied]
        if unzeroed:
            yield fact_failure(
                at_request(trajectory, fact, rid),
                f"new block(s) {unzeroed} are not on the step's zeroing list "
                f"(new_block_ids_to_zero: {sorted(listed)}); the model reads what a "
                "freed block held before",
                NOT_ZEROED,
            )
        if wiped:
            yield fact_failure(
                at_request(trajectory, fact, rid),
                f"block(s) {wiped} hold KV that is valid before the step (a prefix "
                "hit, or what an asynchronous load writes), yet are on the step's "
                "zeroing list",
                ZEROES_VALID_KV,
            )


def _groups_zeroed(trajectory: Trajectory, fact: Fact, what: ZeroingGroups) -> Iterator[Failure]:
    """Every group the specs say must zero its new blocks (:func:`zeroing_groups`) is one
    whose new blocks vLLM hands the worker to zero. Judged on releases that zero new
    blocks at all; earlier ones predate the mechanism (#35219)."""
    if not what.release_zeroes:
        return
    for group in sorted(set(zeroing_groups(trajectory.groups)) - set(what.zeroed)):
        label = trajectory.groups[group].label
        yield fact_failure(
            fact,
            f"group {group} ({label}): its new blocks are never handed to the worker to "
            f"zero (vLLM zeroes groups {list(what.zeroed) or 'none'}), but it must zero "
            f"them: {ZEROING_REASON}",
            NOT_ZEROED,
        )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the zeroing family, in recording order."""
    null = trajectory.null_block
    # Scheduler mode: each request's tables at the last schedule() call.
    previous: dict[str, tuple[tuple[int, ...], ...]] = {}
    # Requests freed since they last held blocks, with the tables they held then: their
    # next allocation's blocks at those columns are not judged (see _step_list).
    held: dict[str, tuple[tuple[int, ...], ...]] = {}
    refilled: dict[str, tuple[tuple[int, ...], ...]] = {}
    replays = replay_starts(trajectory) if trajectory.read_bounds else {}
    for index, fact in facts_of(trajectory, ZeroingList, StepZeroingList, ZeroingGroups):
        what = fact.what
        if isinstance(what, ZeroingGroups):
            for failure in _groups_zeroed(trajectory, fact, what):
                yield index, failure
            continue
        if isinstance(what, StepZeroingList):
            for rid in what.freed:
                if rid in held:
                    refilled[rid] = held.pop(rid)
            for failure in _step_list(trajectory, fact, previous, refilled, replays):
                yield index, failure
            previous = dict(what.tables)
            for rid, tables in what.tables.items():
                if any(tables):
                    held[rid] = tables
                    refilled.pop(rid, None)
            continue
        assert isinstance(what, ZeroingList)
        cached, listed = set(what.hit), set(what.listed)
        size, loaded, valid_tokens = what.block_size, what.loaded, what.valid_tokens

        def holds_valid_kv(column: int, block: int) -> bool:
            return block in cached or (loaded and column * size < valid_tokens)  # noqa: B023

        unzeroed, wiped = judge_zeroing(what.after, what.before, listed, null, holds_valid_kv)
        if unzeroed:
            message = (
                f"group {what.group}: new block(s) {unzeroed} are not handed to the worker "
                f"to zero (take_new_block_ids gave {sorted(listed)}); the model reads "
                "what a freed block held before"
            )
            yield index, fact_failure(fact, message, NOT_ZEROED)
        if wiped:
            message = (
                f"group {what.group}: block(s) {wiped} hold KV that is valid before the "
                "step (a prefix hit, or tokens the connector loads), yet are handed to "
                "the worker to zero"
            )
            yield index, fact_failure(fact, message, ZEROES_VALID_KV)
