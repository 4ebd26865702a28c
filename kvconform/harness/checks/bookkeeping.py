"""``sanity``, the bookkeeping family: vLLM's per-request state holds live requests only.

vLLM's KV-cache managers keep state per request (``req_to_blocks``, ``num_cached_block``,
a partial hit's copy-on-write, Mamba "align"'s state indexes and checkpoints, ...), and
``pop_blocks_for_free`` drops all of it when a request's blocks go (its docstring: "Pop
the request's bookkeeping"). An entry of a finished or aborted request that stays is a
structure that only grows: memory that a long-running server never gets back, and state
a request id reused later would inherit. Judged on the census an oracle records after
each step (:class:`~kvconform.model.facts.PoolCensus`): every request id a per-request
structure holds is live (arrived, not finished nor aborted, by the oracle's account).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import PoolCensus
from kvconform.model.observations import Trajectory
from kvconform.model.results import Failure

STALE_ENTRY = "keeps per-request state of a request that has ended"


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the bookkeeping family: the first census at which each
    structure holds an ended request's id (once per structure and request)."""
    reported: set[tuple[str, str]] = set()
    for index, fact in facts_of(trajectory, PoolCensus):
        census = fact.what
        assert isinstance(census, PoolCensus)
        live = census.live
        if all(ids <= live for ids in census.bookkeeping.values()):
            continue
        for structure, ids in sorted(census.bookkeeping.items()):
            stale = sorted(
                rid for rid in ids - live if (structure, rid) not in reported
            )
            if not stale:
                continue
            reported.update((structure, rid) for rid in stale)
            yield index, fact_failure(
                fact,
                f"{structure} still holds ended request(s) {', '.join(stale)}: an entry "
                "that is never dropped grows with every request served",
                STALE_ENTRY,
            )
