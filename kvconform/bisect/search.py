"""Bisection over an ordered list of candidates, with skips.

Candidates ``0 .. n-1`` are ordered (releases by version); ``0`` is known
*old* and ``n-1`` known *new* once the ends are verified. Each probe of a
candidate between the nearest old one below and the nearest new one above
halves that interval, so deciding takes at most ``ceil(log2(n - 1))`` probes
after the two end checks. A skipped candidate (its vLLM could not be
exercised) is stepped around like ``git bisect skip`` does: the next probe is
the untested candidate nearest the middle. When only skipped candidates are
left between the two, the first new one is any of them or the new end, and the
conclusion says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvconform.bisect.outcome import Outcome


@dataclass(frozen=True)
class Boundary:
    """Where old turns new: the nearest old candidate and the first new one.

    ``untestable`` lists the skipped candidates between them; when it is not
    empty the first new candidate is any of them or ``first_new``.
    """

    last_old: int
    first_new: int
    untestable: tuple[int, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.untestable


def probe_budget(n: int) -> int:
    """The most probes a bisection of ``n`` candidates needs without skips, ends included."""
    return math.ceil(math.log2(n)) + 2 if n > 1 else n


def bracket(n: int, outcomes: Mapping[int, Outcome]) -> tuple[int, int]:
    """(nearest old, nearest new above it) among the probed candidates."""
    news = [i for i, o in outcomes.items() if o is Outcome.NEW]
    hi = min(news) if news else n - 1
    olds = [i for i, o in outcomes.items() if o is Outcome.OLD and i < hi]
    lo = max(olds) if olds else 0
    return lo, hi


def next_probe(n: int, outcomes: Mapping[int, Outcome]) -> int | None:
    """The candidate to probe next, or None once the boundary is decided."""
    lo, hi = bracket(n, outcomes)
    untested = [i for i in range(lo + 1, hi) if i not in outcomes]
    if not untested:
        return None
    middle = (lo + hi) / 2
    return min(untested, key=lambda i: (abs(i - middle), i))


def conclude(n: int, outcomes: Mapping[int, Outcome]) -> Boundary:
    lo, hi = bracket(n, outcomes)
    skipped = tuple(i for i in range(lo + 1, hi) if outcomes.get(i) is Outcome.SKIP)
    return Boundary(lo, hi, skipped)
