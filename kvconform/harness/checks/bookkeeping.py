"""``sanity``, the bookkeeping family: vLLM's per-request state holds live requests only.

In scheduler mode the census also carries the ``Scheduler``'s own per-request structures
(``requests``, ``finished_req_ids``, the encoder cache manager's maps, the connectors'
scheduler side, ...; ``Scheduling.scheduler_request_state``), judged the same way but for
the lists of finished ids vLLM hands on at the next step (``KEPT_ONE_STEP``).

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

# The scheduler's lists of the requests that ended since it last told the worker and the
# client: ``Scheduler._free_request`` adds a finished request's id, ``schedule()`` hands
# ``finished_req_ids`` to the worker and empties it (``_update_after_schedule``),
# ``update_from_output`` hands the per-client sets over and clears them. They may hold a
# request that ended since the previous census (one schedule() earlier), no older one.
KEPT_ONE_STEP = frozenset({"Scheduler.finished_req_ids", "Scheduler.finished_req_ids_dict"})


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the bookkeeping family: the first census at which each
    structure holds an ended request's id (once per structure and request)."""
    reported: set[tuple[str, str]] = set()
    before: frozenset[str] = frozenset()  # the live requests at the previous census
    for index, fact in facts_of(trajectory, PoolCensus):
        census = fact.what
        assert isinstance(census, PoolCensus)
        live, ended_now = census.live, before - census.live
        before = live
        if all(ids <= live for ids in census.bookkeeping.values()):
            continue
        for structure, ids in sorted(census.bookkeeping.items()):
            kept = ended_now if structure in KEPT_ONE_STEP else frozenset()
            stale = sorted(rid for rid in ids - live - kept if (structure, rid) not in reported)
            if not stale:
                continue
            reported.update((structure, rid) for rid in stale)
            yield (
                index,
                fact_failure(
                    fact,
                    f"{structure} still holds ended request(s) {', '.join(stale)}: an entry "
                    "that is never dropped grows with every request served",
                    STALE_ENTRY,
                ),
            )
