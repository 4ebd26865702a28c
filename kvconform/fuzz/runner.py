"""``kvconform fuzz``'s search: generated trajectories through the shared search loop.

The loop (rounds of Hypothesis ``find``, one shrunk finding per round,
rejections, reproducers) is :mod:`kvconform.fuzz.search`, shared with
``kvconform explore``; this module is the fuzzer's :class:`~.search.ExampleSource`
(trajectory documents from :mod:`.strategies`) and its statistics: how often an
example reached the ``max_model_len`` edge and left the pool under pressure.

Determinism: round ``r`` of seed ``S`` draws from ``Random(S * 7919 + r)``, so
the same seed, vLLM and budget make the same run and the same reproducers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvconform.errors import VllmUnavailable
from kvconform.fuzz import DEFAULT_EXAMPLES, DEFAULT_MAX_FINDINGS
from kvconform.fuzz.search import (
    Budget,
    Finding,
    GeneratorBug,
    SearchStats,
    search,
    write_summary,
)
from kvconform.fuzz.space import FuzzSpace, build_space
from kvconform.fuzz.strategies import scenario_documents
from kvconform.harness.expectations import Expectation
from kvconform.model.floors import cdiv
from kvconform.model.observations import Trajectory
from kvconform.model.results import ScenarioResult
from kvconform.oracles.vllm import Vllm

__all__ = ["Finding", "FuzzStats", "GeneratorBug", "peak_blocks_held", "run_fuzz"]


@dataclass
class FuzzStats(SearchStats):
    """What a fuzz run did: counts, rates, findings."""

    reached_edge: int = 0  # the lookahead crossed max_model_len at some step
    cap_decided: int = 0  # ... and the cap at max_model_len took a block off a token group
    under_pressure: int = 0  # the pool was left with at most one free block
    excluded: dict[str, str] = field(default_factory=dict)  # group types not drawn, and why
    diverged: dict[str, str] = field(default_factory=dict)  # drawn although their probe diverged
    space: str = ""

    def summary_lines(self) -> list[str]:
        return [
            f"fuzz: {self.examples} examples in {self.search_seconds:.1f} s "
            f"({self.examples_per_second:.0f}/s; {self.examples_per_cpu_second:.0f} per CPU "
            f"second), shrinking {self.shrink_runs} runs in "
            f"{self.shrink_seconds:.1f} s, set-up {self.setup_seconds:.1f} s",
            f"  rejected: {self.share(self.rejected_pool)} pool ran dry, "
            f"{self.share(self.rejected_unsupported)} not buildable; "
            f"reached the max_model_len edge: {self.share(self.reached_edge)} "
            f"(the cap decided a block count: {self.share(self.cap_decided)}); "
            f"pool left with <= 1 free block: {self.share(self.under_pressure)}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.search_json(),
            "reached_edge": self.reached_edge,
            "cap_decided": self.cap_decided,
            "under_pressure": self.under_pressure,
            "space": self.space,
            "excluded": self.excluded,
            "diverged": self.diverged,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class _Trajectories:
    """The fuzzer's example source: trajectory documents of ``space``."""

    space: FuzzSpace
    stats: FuzzStats
    name: str = "fuzz"

    def documents(self) -> st.SearchStrategy[dict[str, Any]]:
        return scenario_documents(self.space)

    def measure(self, result: ScenarioResult, doc: dict[str, Any]) -> None:
        _measure(result.trajectory, doc, self.stats)


def run_fuzz(
    vllm: Vllm,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
    on_example: Callable[[str], None] | None = None,
    space: FuzzSpace | None = None,
    max_findings: int = DEFAULT_MAX_FINDINGS,
    expectations: Sequence[Expectation] = (),
) -> FuzzStats:
    """Fuzz ``vllm`` for ``examples`` drawn scenarios; write reproducers to ``out``.

    Returns the run's :class:`FuzzStats`: its ``examples_per_second`` is the
    search throughput (vLLM's import, the probes and shrinking excluded) and
    ``examples_per_cpu_second`` the same per CPU second of this process. A
    benchmark calls ``run_fuzz(vllm, n, seed)``: no files, the same examples
    every time. ``out=None`` writes nothing;
    ``expectations`` decide which group types stay out of the search
    (:mod:`.space`); ``progress`` receives a line per finding (found, shrunk);
    ``on_example`` is called once per drawn example with its outcome ("passed",
    "rejected" or "failed"), to advance a progress display.
    """
    started = time.perf_counter()
    stats = FuzzStats(seed=seed, budget=examples, vllm_version=vllm.version)
    if space is None:
        space = build_space(vllm, expectations)
    stats.excluded = dict(space.excluded)
    stats.diverged = dict(space.diverged)
    stats.space = space.describe()
    stats.setup_seconds = time.perf_counter() - started
    if not space.group_types:
        raise VllmUnavailable(
            vllm.version,
            "a KV-cache group type kvconform can fuzz",
            "; ".join(f"{name}: {why}" for name, why in space.excluded.items()),
        )
    out_dir = Path(out) if out is not None else None
    search(
        _Trajectories(space, stats),
        vllm,
        stats,
        Budget(examples=examples),
        out_dir=out_dir,
        command=command,
        say=progress or (lambda line: None),
        tick=on_example or (lambda outcome: None),
        max_findings=max_findings,
    )
    write_summary(out_dir, "fuzz-summary.json", stats.to_json())
    return stats


def _measure(trajectory: Trajectory | None, doc: dict[str, Any], stats: FuzzStats) -> None:
    """Count whether an example reached the max_model_len edge and pool pressure."""
    if trajectory is None:
        return
    limit = trajectory.max_model_len
    past = [o for o in trajectory.observations if o.computed + o.scheduled + o.lookahead > limit]
    if past:
        stats.reached_edge += 1
        sizes = [g.block_size for g in trajectory.groups]
        if any(
            cdiv(o.computed + o.scheduled + o.lookahead, sizes[o.group])
            > cdiv(limit, sizes[o.group])
            for o in past
        ):
            stats.cap_decided += 1
    if trajectory.num_blocks and trajectory.num_blocks - 1 - peak_blocks_held(trajectory) <= 1:
        stats.under_pressure += 1


def peak_blocks_held(trajectory: Trajectory) -> int:
    """The most pool blocks the live allocator held at once (null placeholders excluded)."""
    held: dict[tuple[str, int], int] = {}
    total = peak = 0
    events = iter(trajectory.events)
    pending = next(events, None)
    for seq, obs in enumerate(trajectory.observations):
        while pending is not None and pending.seq <= seq:
            for key in [k for k in held if k[0] == pending.request]:
                total -= held.pop(key)
            pending = next(events, None)
        count = sum(1 for b in obs.block_ids or () if b != trajectory.null_block)
        key = (obs.request, obs.group)
        total += count - held.get(key, 0)
        held[key] = count
        peak = max(peak, total)
    return peak
