"""The forked pool the fuzz audit runs its children in (:mod:`kvconform.mutate.fuzzing`).

Each mutant's fuzz run is a child that swaps the mutant in; the parent must hand back
each child's payload in order, run ``jobs`` at once, and turn a child that runs past its
time into ``None`` (a verdict, not a hang) without losing the others.
"""

from __future__ import annotations

import os
import time

from kvconform.mutate.fuzzing import map_in_forks


def test_payloads_come_back_in_order_from_separate_children() -> None:
    parent = os.getpid()
    works = [lambda i=i: {"index": i, "pid": os.getpid()} for i in range(5)]
    results = map_in_forks(works, jobs=2, timeout=30)
    assert [r and r["index"] for r in results] == [0, 1, 2, 3, 4]
    pids = {r["pid"] for r in results if r}
    assert parent not in pids and len(pids) == 5, "each work must run in a child of its own"


def test_a_child_past_its_time_gives_none_and_the_rest_still_finish() -> None:
    def slow() -> dict:
        time.sleep(60)
        return {"late": True}

    started = time.monotonic()
    results = map_in_forks([lambda: {"a": 1}, slow, lambda: {"b": 2}], jobs=2, timeout=2)
    assert results == [{"a": 1}, None, {"b": 2}]
    assert time.monotonic() - started < 30, "the slow child was waited for, not killed"


def test_children_run_at_once_up_to_jobs() -> None:
    def nap() -> dict:
        time.sleep(1.0)
        return {}

    started = time.monotonic()
    map_in_forks([nap] * 4, jobs=4, timeout=30)
    assert time.monotonic() - started < 3.5, "four one-second children with jobs=4 ran one by one"


def test_a_failing_child_reports_its_traceback() -> None:
    def broken() -> dict:
        raise ValueError("the mutant raised")

    (result,) = map_in_forks([broken], jobs=1, timeout=30)
    assert result is not None and "the mutant raised" in result["error"]
