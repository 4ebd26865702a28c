"""``sanity``, the allocator family: what the live ``KVCacheManager`` answers beside blocks.

Judged from the facts the live oracle records (:mod:`kvconform.model.facts`):

* a first chunk gets the prefix-cache hit the scenario states (``expect_hit``): the
  scenario derives it by hand (the full blocks a request shares with blocks another
  request computed and ``allocate_slots`` cached), so another hit is the allocator
  caching too little, or caching tokens nobody computed yet;
* a group that retains a longer prefix hit (HiSparse's host source) adopts exactly the
  hit blocks its computed tokens cover;
* ``reset_prefix_cache`` answers as the scenario states, and a reset leaves nothing
  cached; ``evict_blocks`` leaves none of the evicted blocks in the prefix cache;
* each step's ``make_prefix_cache_stats`` and ``usage`` count what its admissions
  adopted and its requests hold;
* a single-type manager declares the defaults its coordinator declares for the
  arguments it forwards;
* in scheduler mode, a request's first admission adopts the hit the scenario states
  (``expect_hit``), its first step after a KV load has the tokens it states computed
  (``expect_loaded``), and ``Scheduler.reset_prefix_cache`` answers as stated.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import fact_failure, facts_of
from kvconform.model.facts import (
    AdmissionHit,
    DefaultDisagreement,
    Eviction,
    PrefixStats,
    ResetAnswer,
    RetainedHit,
    SchedulerReset,
    StatedAdmission,
)
from kvconform.model.observations import (
    DEFAULTS_DISAGREE,
    EVICTED_STILL_CACHED,
    HIT_MISSED,
    RESET_ANSWER,
    RETAINED_HIT,
    STATS_DIVERGE,
    Trajectory,
)
from kvconform.model.results import Failure

# The invariant of a scheduler's reset answered otherwise than the scenario states.
RESET_DERIVED = "resets the prefix cache otherwise than derived"

_STATS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
          "preempted_hits")  # fmt: skip


def _retained_hit(fact: RetainedHit) -> str | None:
    hit = list(fact.hit)
    kept = hit[: -(-fact.tokens // fact.block_size)]
    table = list(fact.table)
    beyond = [
        block
        for column, block in enumerate(hit)
        if column >= len(kept) and column < len(table) and table[column] == block
    ]
    if table[: len(kept)] == kept and not beyond:
        return None
    return (
        f"group {fact.group} keeps a hit of {len(hit)} blocks {hit}; the request's "
        f"{fact.tokens} computed tokens (hit and connector) cover {len(kept)} of them, "
        f"{kept}, so its table should start with those and hold no more, but it "
        f"holds {table}"
    )


def _stats(fact: PrefixStats) -> str | None:
    expected: dict[str, object] = dict(zip(_STATS, fact.admitted, strict=True))
    expected["reset"] = fact.reset
    expected["usage"] = fact.held / (fact.num_blocks - 1)
    stats = fact.stats
    wrong = [
        f"{key} {stats[key]!r}, not {want!r}"
        for key, want in expected.items()
        if (
            abs(stats[key] - want) > 1e-9  # type: ignore[operator]
            if key == "usage"
            else stats[key] != want
        )
    ]
    if not wrong:
        return None
    return (
        "the step's prefix-cache stats and KV-cache usage differ from what its "
        f"admissions adopted and its requests hold: {'; '.join(wrong)}"
    )


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the allocator family, in recording order."""
    kinds = (AdmissionHit, RetainedHit, ResetAnswer, Eviction, PrefixStats, DefaultDisagreement,
             StatedAdmission, SchedulerReset)  # fmt: skip
    for index, fact in facts_of(trajectory, *kinds):
        what = fact.what
        if isinstance(what, StatedAdmission):
            if what.got == what.stated:
                continue
            message = (
                f"adopted a prefix-cache hit of {what.got} tokens at admission, but "
                f"the scenario states {what.stated} (expect_hit)"
                if what.what == "hit"
                else f"was first scheduled after its KV load with {what.got} tokens "
                f"computed, but the scenario states {what.stated} (expect_loaded)"
            )
            yield index, fact_failure(fact, message, HIT_MISSED)
        elif isinstance(what, SchedulerReset):
            if what.succeeded == what.succeeds:
                continue
            answer = "reset" if what.succeeded else "refused to reset"
            how = " (preempting the running requests)" if what.running else ""
            how += " (with the KV connector's cache)" if what.connector else ""
            message = (
                f"Scheduler.reset_prefix_cache{how} {answer} before step {what.before_step}, "
                f"but the scenario states it {'succeeds' if what.succeeds else 'is refused'}"
            )
            yield index, fact_failure(fact, message, RESET_DERIVED)
        elif isinstance(what, AdmissionHit):
            if what.hit != what.stated:
                message = (
                    f"gets a prefix-cache hit of {what.hit} tokens, but the scenario states "
                    f"{what.stated}" + (f"; {what.decided_by}" if what.decided_by else "")
                )
                yield index, fact_failure(fact, message, HIT_MISSED)
        elif isinstance(what, RetainedHit):
            retained = _retained_hit(what)
            if retained is not None:
                yield index, fact_failure(fact, retained, RETAINED_HIT)
        elif isinstance(what, ResetAnswer):
            if what.answer == what.stated and not what.still_cached:
                continue
            message = (
                f"reset_prefix_cache answers {what.answer}, but the scenario states "
                f"{what.stated} ({what.free} of {what.num_blocks} blocks free, the null block "
                "is never free)"
                if what.answer != what.stated
                else "reset_prefix_cache answers True, yet the pools still cache "
                f"{what.still_cached} blocks"
            )
            yield index, fact_failure(fact, message, RESET_ANSWER)
        elif isinstance(what, Eviction):
            if what.kept:
                message = (
                    f"evict_blocks({list(what.chosen)}) leaves block(s) {list(what.kept)} in "
                    "the prefix cache: a later request would hit KV the connector reported "
                    "invalid"
                )
                yield index, fact_failure(fact, message, EVICTED_STILL_CACHED)
        elif isinstance(what, PrefixStats):
            stats = _stats(what)
            if stats is not None:
                yield index, fact_failure(fact, stats, STATS_DIVERGE)
        elif isinstance(what, DefaultDisagreement):
            message = (
                f"{what.disagreement}: a caller that leaves the argument out (as "
                "HiSparseSourceManager calls its base class) gets another count than "
                "the coordinator's callers"
            )
            yield index, fact_failure(fact, message, DEFAULTS_DISAGREE)
