"""``sanity``, the conservation family: every block of the pool is free or held, once.

Judged on the pool census an oracle records after each step
(:class:`~kvconform.model.facts.PoolCensus`):

* **free + held + null = the pool.** vLLM's free queue holds every block no request
  references (cached blocks of no request included: they are evictable), so the free
  count, the distinct blocks in the live requests' tables and the blocks still deferred
  after an in-flight finish, and the null block add up to the pool exactly. Fewer: a
  block left the free queue and no table holds it (a leak, which grows until the pool
  runs dry); more: a block is free and held at once (handed out twice).
* **reference count = live holders.** A block's ``ref_cnt`` is the number of live
  requests whose tables hold it (plus one per deferred pop of it): a count above lets
  the block never return; below, a request's free returns a block another still reads.
* **no block writable by two live requests.** Two requests may share only a block of
  cached KV (it has a block hash: full, and computed once), which neither writes again;
  any other block in two tables takes both requests' writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import chain

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import PoolCensus
from kvconform.model.observations import Trajectory
from kvconform.model.results import Failure

NOT_CONSERVED = "counts other blocks free and held than the pool has"
REFS_DIFFER = "keeps another reference count on a block than its live holders"
SHARED_WRITABLE = "hands a block of uncached KV to two live requests"


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the conservation family, in recording order."""
    null = trajectory.null_block
    for index, fact in facts_of(trajectory, PoolCensus):
        census = fact.what
        assert isinstance(census, PoolCensus)
        # Every table's blocks in one pass; nulls aside, as many as distinct blocks means
        # no block has two holders (the common case, judged without a count per block).
        flat = list(chain.from_iterable(chain.from_iterable(census.tables.values())))
        held = set(flat)
        held.discard(null)
        listed = len(flat) - flat.count(null)
        deferred = census.deferred
        taken = held.union(deferred)
        if census.free + len(taken) + 1 != census.pool:
            gap = census.pool - 1 - census.free - len(taken)
            how = (
                f"{gap} block(s) neither free nor held (leaked)"
                if gap > 0
                else f"{-gap} more than the pool has (a block both free and held, or in "
                "the free queue twice)"
            )
            yield (
                index,
                fact_failure(
                    fact,
                    f"the pool has {census.pool} blocks, but {census.free} are free and "
                    f"{len(taken)} held by live requests or deferred frees, with the null block: "
                    f"{how}",
                    NOT_CONSERVED,
                ),
            )
        refs = census.refs
        if (
            listed == len(held)
            and len(deferred) == len(set(deferred))
            and held.isdisjoint(deferred)
        ):
            # The common case: every block has one holder (and, most often, every count
            # read is 1: nothing to list, found without a look per block).
            wrong = (
                []
                if set(refs.values()) <= {1}
                else sorted((b, refs[b], 1) for b in taken if b in refs and refs[b] != 1)
            )
            shared: list[int] = []
        else:
            holders: Counter[int] = Counter(deferred)
            owners: dict[int, list[str]] = {}
            for name, table in census.tables.items():
                for block in {block for ids in table for block in ids} - {null}:
                    holders[block] += 1
                    owners.setdefault(block, []).append(name)
            wrong = sorted(
                (block, refs[block], count)
                for block, count in holders.items()
                if block in refs and refs[block] != count
            )
            shared = sorted(
                block
                for block, names in owners.items()
                if len(names) > 1 and block not in census.hashed
            )
        if wrong:
            shown = ", ".join(f"block {b}: ref_cnt {r}, {c} holder(s)" for b, r, c in wrong[:5])
            yield (
                index,
                fact_failure(
                    fact,
                    f"reference counts differ from the live holders ({shown}"
                    f"{', ...' if len(wrong) > 5 else ''})",
                    REFS_DIFFER,
                ),
            )
        if shared:
            pairs = "; ".join(f"block {b}: {', '.join(sorted(owners[b]))}" for b in shared[:5])
            yield (
                index,
                fact_failure(
                    fact,
                    f"blocks without cached KV are in two live requests' tables ({pairs}): "
                    "both write into them",
                    SHARED_WRITABLE,
                ),
            )
