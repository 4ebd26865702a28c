"""``sanity``, the hits family: no lookup finds less than the blocks cached before it.

Each first admission's prefix-cache hit (:class:`~kvconform.model.facts.PrefixLookup`) is
held to the least hit that the earlier requests its prompt begins with guarantee
(:func:`kvconform.model.prefix_hits.least_hit`, derived from the rules of each group type,
never from what vLLM answered). The bound holds only while those requests' blocks are still
cached; vLLM's pool evicts a cached block only when it hands it out again, and its free queue
hands out every never-used block before any block a request has used. So a lookup is judged
only where the pool's census up to its step (:class:`~kvconform.model.facts.PoolCensus`,
after each ``schedule()``) shows fewer distinct blocks ever held than the pool has (no block
can have been handed out twice), no request was preempted (a preemption within one
``schedule()`` can hold blocks no census sees) and the prefix cache was never reset. A hit
below the bound is a hit lost: the request recomputes KV the cache holds (a hit rate of 0 %
where vLLM promises reuse).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import Fact, PoolCensus, PrefixLookup, SchedulerReset
from kvconform.model.observations import HIT_LOST, Trajectory
from kvconform.model.prefix_hits import ONE_TOKEN_WINDOW, LeastHit, least_hit, one_token_window
from kvconform.model.results import Failure


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the hits family, one per lookup below its bound."""
    for index, fact, best, used, pool in bounded_lookups(trajectory):
        what = fact.what
        assert isinstance(what, PrefixLookup)
        if what.hit >= best.tokens:
            continue
        failure = fact_failure(fact, _message(what, best, used, pool), HIT_LOST)
        if one_token_window(what.groups) and failure.detail is not None:
            # The signature's suffix (sanity's signature): a triaged lost hit of this
            # shape (scenarios/explore-known.yaml) must not excuse any other.
            failure.detail["cause"] = ONE_TOKEN_WINDOW
        yield index, failure


def bounded_lookups(trajectory: Trajectory) -> Iterator[tuple[int, Fact, LeastHit, int, int]]:
    """(fact index, fact, its least hit, blocks ever held, pool) of each lookup the bound
    applies to: a source shares its prompt, the groups have hit rules, and nothing can have
    been evicted, preempted or reset before it (the lookups :func:`judge` judges; a least
    hit of 0 tokens asks nothing of the lookup)."""
    lookups = list(facts_of(trajectory, PrefixLookup))
    if not lookups:
        return
    census = sorted(
        (
            (fact.step, fact.what)
            for _, fact in facts_of(trajectory, PoolCensus)
            if isinstance(fact.what, PoolCensus)
        ),
        key=lambda pair: pair[0],
    )
    resets = [fact.step for _, fact in facts_of(trajectory, SchedulerReset)]
    preempted = [event.step for event in trajectory.events if event.kind == "preempt"]
    for index, fact in lookups:
        what = fact.what
        assert isinstance(what, PrefixLookup)
        if what.no_bound or not what.sources:
            continue
        if any(step <= fact.step for step in resets + preempted):
            continue
        used, pool = _blocks_ever_held(census, fact.step, what.null_block)
        if pool is None or used >= pool - 1:
            continue
        best = max((least_hit(what, source) for source in what.sources), key=_tokens)
        yield index, fact, best, used, pool


def _tokens(bound: LeastHit) -> int:
    return bound.tokens


def _blocks_ever_held(
    census: list[tuple[int, PoolCensus]], step: int, null_block: int
) -> tuple[int, int | None]:
    """How many distinct blocks any table (or deferred free) held in the censuses up to
    ``step``, and the pool's size (None: no census)."""
    seen: set[int] = set()
    pool: int | None = None
    for at, what in census:
        if at > step:
            break
        pool = what.pool
        for table in what.tables.values():
            for ids in table:
                seen.update(ids)
        seen.update(what.deferred)
    seen.discard(null_block)
    return len(seen), pool


def _message(what: PrefixLookup, best: LeastHit, used: int, pool: int) -> str:
    source = next(s for s in what.sources if s.request == best.source)
    named = []
    for group, (lo, hi) in enumerate(best.columns):
        if hi <= lo:
            continue
        ids = source.columns[group][lo:hi] if group < len(source.columns) else ()
        named.append(f"group {group} columns {lo}-{hi - 1}: blocks {_short(ids)}")
    blocks = f", {'; '.join(named)}" if named else ""
    return (
        f"prefix-cache hit of {what.hit} tokens of a {what.prompt}-token prompt, below the "
        f"{best.tokens} the cache must serve: {best.reason}; those blocks are still cached "
        f"({used} of the pool's {pool - 1} blocks ever held: none handed out twice){blocks}"
    )


def _short(ids: tuple[int, ...]) -> str:
    shown = [str(i) for i in ids]
    if len(shown) > 8:
        shown = shown[:3] + ["..."] + shown[-3:]
    return "[" + ", ".join(shown) + "]"
