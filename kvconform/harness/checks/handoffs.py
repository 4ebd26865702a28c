"""``sanity``, the hand-offs family: Mamba "align" boundary states handed to a KV connector.

Where a Mamba "align" group is prefix-cached, every boundary state a step caches is
handed to a KV connector by block id, and no block that no longer holds it is
(:func:`kvconform.model.handoffs.judge_handoffs`, over the facts
:class:`~kvconform.model.facts.StepHandoffs`); a finishing request hands over the
partial-tail states it cached at exactly its computed tokens that no offer carried yet,
and nothing else (:class:`~kvconform.model.facts.FinalizedTails`).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import FinalizedTails, State, StepHandoffs
from kvconform.model.handoffs import judge_handoffs
from kvconform.model.observations import HANDOFF_LOST, HANDOFF_STALE, Trajectory
from kvconform.model.results import Failure


def _step(trajectory: Trajectory, what: StepHandoffs) -> Iterator[tuple[str, str, str]]:
    """(request, message, invariant) of one step's hand-offs."""
    offered = {state for states in what.offers.values() for state in states}
    owner = {state[1]: name for name, states in what.offers.items() for state in states}
    tables = what.tables
    for name, table in tables.items():
        for group in what.groups:
            for block in table[group]:
                owner.setdefault(block, name)
    # A copy-on-write moves a state's entry off its request's table: name the request by
    # the block that held the same state when the step began.
    held_before = {(group, tokens): block for group, block, tokens in what.before}
    for group, block, tokens in what.after:
        source = held_before.get((group, tokens))
        if source in owner:
            owner.setdefault(block, owner[source])
    freed = what.freed

    def is_pending_tail(state: State) -> bool:
        group, block, tokens = state
        size = trajectory.groups[group].block_size
        if tokens % size == 0:
            return False
        # A request freed in the step drops its pending hand-offs, the copy's too.
        if freed:
            return True
        column = -(-tokens // size) - 1
        return any(
            column < len(table[group]) and table[group][column] == block
            for table in tables.values()
        )

    lost, stale = judge_handoffs(what.before, what.after, offered, is_pending_tail, freed)
    for group, block, tokens in lost:
        yield (
            owner.get(block, "?"),
            f"group {group}: block {block} holds the cached Mamba state of {tokens} "
            "tokens, cached in this step, yet take_boundary_state_offloads does not "
            f"hand it to the KV connector (it gave {sorted(offered)})",
            HANDOFF_LOST,
        )
    for group, block, tokens in stale:
        yield (
            owner.get(block, "?"),
            f"group {group}: take_boundary_state_offloads hands the KV connector "
            f"block {block} as the Mamba state of {tokens} tokens, which no longer "
            "holds it at the step's end: the connector would offload another state",
            HANDOFF_STALE,
        )


def _tails(
    trajectory: Trajectory, what: FinalizedTails, offered_keys: set[object]
) -> Iterator[tuple[str, str]]:
    """(message, invariant) of a finishing request's partial-tail hand-offs."""
    tails = {
        (group, block, tokens)
        for group, block, tokens in what.cached
        if tokens == what.computed and tokens % trajectory.groups[group].block_size
    }
    given = set(what.given)
    lost = {state for state in tails - given if what.keys.get(state[1]) not in offered_keys}
    for group, block, tokens in sorted(lost):
        yield (
            f"group {group}: block {block} holds the request's partial-tail Mamba "
            f"state of {tokens} tokens, never handed over, yet at its finish "
            f"finalize_partial_tail_offloads hands the connector {sorted(given)}",
            HANDOFF_LOST,
        )
    for group, block, tokens in sorted(given - tails):
        yield (
            f"group {group}: at its finish finalize_partial_tail_offloads hands the "
            f"connector block {block} as the state of {tokens} tokens, which is not "
            f"a partial tail the request holds at its {what.computed} computed tokens",
            HANDOFF_STALE,
        )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the hand-offs family, in recording order."""
    # The cache keys of every boundary state handed to the connector so far.
    offered_keys: set[object] = set()
    for index, fact in facts_of(trajectory, StepHandoffs, FinalizedTails):
        what = fact.what
        if isinstance(what, StepHandoffs):
            offered_keys.update(what.offered_keys)
            for request, message, invariant in _step(trajectory, what):
                yield index, fact_failure(fact._replace(request=request), message, invariant)
        else:
            assert isinstance(what, FinalizedTails)
            for message, invariant in _tails(trajectory, what, offered_keys):
                yield index, fact_failure(fact, message, invariant)
            offered_keys.update(what.given_keys)
