"""Side-by-side timing: several passes, interleaved, in one process.

On a shared machine the absolute time of a pass swings with whatever else runs;
two passes timed minutes apart cannot be compared. :func:`interleave` runs every
pass once per round, rotating the order each round so that no pass always goes
first (warm caches) or last (a growing heap), and keeps wall and CPU time of
each. Ratios are then taken round by round (both sides of a ratio saw the same
load) and the median over rounds is reported.

:class:`CallCounter` wraps the vLLM entry points on a loaded
:class:`~kvconform.oracles.vllm.Vllm` object and counts how often each is
called, so a benchmark can show that two loops made the same vLLM calls. It is
used for a separate, untimed pass: the wrappers themselves cost time.
"""

from __future__ import annotations

import functools
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvconform.bench.figures import median
from kvconform.oracles.vllm import Vllm


@dataclass
class Timings:
    """Per pass, the wall and CPU seconds of every round."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def median_wall(self, name: str) -> float:
        return median(self.wall[name])

    def median_cpu(self, name: str) -> float:
        return median(self.cpu[name])

    def ratio(self, numerator: str, denominator: str, clock: str = "wall") -> float:
        """Median over rounds of the per-round ratio of two passes."""
        series = self.wall if clock == "wall" else self.cpu
        return median(
            [a / b for a, b in zip(series[numerator], series[denominator], strict=True) if b > 0]
        )


def interleave(passes: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1) -> Timings:
    """Run each pass ``rounds`` times, interleaved and rotated; ``warmup`` untimed rounds first."""
    names = list(passes)
    for _ in range(warmup):
        for name in names:
            passes[name]()
    timings = Timings({n: [] for n in names}, {n: [] for n in names})
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            # Start each pass from the same heap state: a collection owed by the
            # previous pass should not be charged to this one.
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            passes[name]()
            timings.cpu[name].append(time.process_time() - cpu)
            timings.wall[name].append(time.perf_counter() - wall)
    return timings


class CallCounter:
    """Counts ``allocate_slots``, ``get_block_ids`` and predictor calls made through ``vllm``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        counts = self.counts

        # wraps: the facade reads the callee's signature through the wrapper
        # (Vllm.block_counter binds the keywords the release's predictor takes).
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    @contextmanager
    def counting(self, vllm: Vllm) -> Iterator[Counter[str]]:
        """Within the block, calls through ``vllm`` (and managers it builds) are counted."""
        self.counts.clear()
        predictor = vllm.reserved_block_count  # the cached vLLM function, or None
        new_manager = vllm.new_manager

        def counted_manager(*args: Any, **kwargs: Any) -> Any:
            manager = new_manager(*args, **kwargs)
            manager.get_block_ids = self._wrap("get_block_ids", manager.get_block_ids)
            return manager

        attributes: dict[str, Any] = {
            "allocate_slots": self._wrap("allocate_slots", vllm.allocate_slots),
            "new_manager": counted_manager,
        }
        if predictor is not None:
            attributes["reserved_block_count"] = self._wrap("predictor", predictor)
        # Instance attributes shadow the class's methods (and the cached property).
        vars(vllm).update(attributes)
        try:
            yield self.counts
        finally:
            for name in attributes:
                del vars(vllm)[name]
            if predictor is not None:
                vars(vllm)["reserved_block_count"] = predictor
