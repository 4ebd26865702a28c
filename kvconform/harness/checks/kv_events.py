"""``sanity``, the KV-events family: what a router that counts vLLM's KV-cache events knows.

With KV-cache events on, each step's events leave a router knowing exactly what the
prefix cache holds (:func:`kvconform.model.kv_events.replay_events` folds them into
the router's count, :func:`~kvconform.model.kv_events.judge_mirror` compares it with
what the pools cache at the step's end), and a prefix-cache lookup announces nothing,
unless the request asks for ``kv_cache_report_mode`` "full": then each group with a hit
announces once more, in one ``BlockStored``, exactly the hashes its hit's blocks are
cached under. A null column (a sliding window's blocks below the window) holds no
block, so it announces nothing: a hash announced for it names a block the group may
never have cached, or has evicted, and no ``BlockRemoved`` will ever retract it.

In scheduler mode the events are those ``update_from_output`` publishes with each
output (:class:`~kvconform.model.facts.PublishedEvents`), each output's judged on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import LookupEvents, PublishedEvents, StepEvents
from kvconform.model.kv_events import CachedKey, judge_mirror, replay_events
from kvconform.model.observations import EVENTS_DIVERGE, REANNOUNCED_HIT, Trajectory
from kvconform.model.results import Failure


def _lookup(what: LookupEvents) -> str | None:
    said: list[tuple[int, tuple[object, ...]]] = list(what.stored)
    if len(said) != what.queued:
        said.append((-1, ("an event other than BlockStored",)))
    expected: list[tuple[int, tuple[object, ...]]] = []
    if what.reused is not None:
        reused = {
            group: tuple(h for h in hashes if h is not None)
            for group, hashes in what.reused.items()
        }
        expected = [(group, hashes) for group, hashes in reused.items() if hashes]
    if said == expected:
        return None
    return (
        f"a prefix-cache hit of {what.hit} tokens announces {said} at its lookup, but the "
        f"request reuses {expected} (per group, the hashes its hit's blocks are "
        "cached under; nothing unless its kv_cache_report_mode is full)"
    )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the KV-events family, in recording order. Each step's
    events are judged on their own: after a step that diverges, the router's count
    starts again from what the pools cached."""
    announced: Counter[CachedKey] = Counter()
    published: Counter[CachedKey] = Counter()
    for index, fact in facts_of(trajectory, LookupEvents, StepEvents, PublishedEvents):
        what = fact.what
        if isinstance(what, PublishedEvents):
            problems = replay_events(published, what.events)
            wrong = judge_mirror(published, what.cached)
            if problems or wrong:
                shown = "; ".join(
                    [f"group {group}, hash {h!r}: announced {said}, cached {held}"
                     for (group, h), said, held in wrong[:3]] + problems[:3]
                )  # fmt: skip
                message = (
                    f"the KV-cache events published with step {fact.step}'s output "
                    f"({len(what.events)}) leave a router with another prefix cache than the "
                    f"pool's: {shown}"
                )
                yield index, fact_failure(fact, message, EVENTS_DIVERGE)
            # Judge each output's events on their own: start the next from the truth.
            published = Counter(what.cached)
            continue
        if isinstance(what, LookupEvents):
            lookup = _lookup(what)
            if lookup is not None:
                yield index, fact_failure(fact, lookup, REANNOUNCED_HIT)
            continue
        assert isinstance(what, StepEvents)
        problems = replay_events(announced, what.events)
        wrong = judge_mirror(announced, what.cached)
        if not problems and not wrong:
            continue
        shown = "; ".join(
            [f"group {group}, hash {h!r}: announced {said}, cached {held}"
             for (group, h), said, held in wrong[:3]] + problems[:3]
        )  # fmt: skip
        more = len(wrong) + len(problems) - min(len(wrong), 3) - min(len(problems), 3)
        message = (
            f"the KV-cache events ({len(what.events)} this step) leave a router with another "
            f"prefix cache than the pool's: {shown}" + (f" (+{more} more)" if more else "")
        )
        yield index, fact_failure(fact, message, EVENTS_DIVERGE)
        announced = Counter(what.cached)
