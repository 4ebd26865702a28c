"""Which cached Mamba boundary states a step must hand a KV connector, block by block.

In Mamba "align" mode a block holds the recurrent state at one boundary of the
sequence, and the prefix cache keys it by the tokens up to that boundary. A KV
connector that offloads those states for later requests (a P/D producer) cannot find
them positionally in an append-only block table, so vLLM hands them over by block id:
each step, ``KVCacheManager.take_boundary_state_offloads`` lists (group, block,
tokens) for every boundary state cached since the last step. Two cases are not
handed over yet:

* a partial tail: the state at the end of a prompt that stops inside a block, cached
  on the block the request's next forward overwrites. It is handed over when vLLM
  copies it out of the way (the copy-on-write of the next step, which moves the cache
  entry to the copy) or when the request finishes with the tail intact;
* anything of a request freed in the step: its pending hand-offs are dropped with
  its blocks, which another request may take at once.

A state cached and not handed over is lost to the connector (a later request misses
a prefix the producer computed); a block handed over that no longer holds the entry
(the overwritten copy source) offloads the wrong state. :func:`judge_handoffs`
compares the cache entries a step created with what vLLM handed over.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

# (group, block id, tokens the state covers)
BoundaryState = tuple[int, int, int]


def judge_handoffs(
    cached_before: Collection[BoundaryState],
    cached_after: Collection[BoundaryState],
    offered: Collection[BoundaryState],
    is_pending_tail: Callable[[BoundaryState], bool],
    freed_blocks: Collection[int],
) -> tuple[list[BoundaryState], list[BoundaryState]]:
    """(states cached in the step and not handed over, states handed over that no
    block holds at the step's end), each sorted.

    ``is_pending_tail(state)``: the state is a partial tail still on the block its
    request's next forward writes; ``freed_blocks``: blocks of requests freed in the
    step, whose hand-offs vLLM drops.
    """
    before, after, handed = set(cached_before), set(cached_after), set(offered)
    lost = [
        state
        for state in after - before - handed
        if state[1] not in freed_blocks and not is_pending_tail(state)
    ]
    stale = [state for state in handed - after if state[1] not in freed_blocks]
    return sorted(lost), sorted(stale)
