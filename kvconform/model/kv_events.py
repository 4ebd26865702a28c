"""What a KV-event consumer knows of the prefix cache, and whether it is the truth.

With KV-cache events on (``enable_kv_cache_events``), vLLM tells external routers which
blocks it caches: a ``BlockStored`` event for every block that enters the prefix cache, a
``BlockRemoved`` for every one that leaves it (evicted, re-keyed), ``AllBlocksCleared``
when the cache is reset. A router that counts them knows, per KV-cache group and block
hash, how many cached blocks the engine holds, and routes a request to the engine that
can hit its prefix. vLLM keeps two blocks under one hash where two requests computed the
same prefix (it does not deduplicate), and stores and removes each, so the count is a
multiset. :func:`replay_events` folds a step's events into the count;
:func:`judge_mirror` compares it with what the pool caches at the end of the step: an
announced block the pool does not hold sends a request to a cache miss, a cached block
never announced is a hit no router can find.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

# (group, block hash as the events carry it)
CachedKey = tuple[int, object]
# (kind: "stored" | "removed" | "cleared", group, hashes)
Event = tuple[str, int, tuple[object, ...]]


def replay_events(announced: Counter[CachedKey], events: Iterable[Event]) -> list[str]:
    """Fold ``events`` into ``announced``; what could not be folded (a removal of a block
    never stored), one line each."""
    problems = []
    for kind, group, hashes in events:
        if kind == "cleared":
            announced.clear()
            continue
        for block_hash in hashes:
            key = (group, block_hash)
            if kind == "stored":
                announced[key] += 1
            elif announced[key] > 0:
                announced[key] -= 1
                if not announced[key]:
                    del announced[key]
            else:
                announced.pop(key, None)
                problems.append(f"removes {block_hash!r} of group {group}, never stored")
    return problems


def judge_mirror(
    announced: Mapping[CachedKey, int], cached: Mapping[CachedKey, int]
) -> list[tuple[CachedKey, int, int]]:
    """(key, blocks the events announce, blocks the pool caches) where the two differ."""
    keys = set(announced) | set(cached)
    return sorted(
        ((key, announced.get(key, 0), cached.get(key, 0)) for key in keys
         if announced.get(key, 0) != cached.get(key, 0)),
        key=repr,
    )  # fmt: skip
