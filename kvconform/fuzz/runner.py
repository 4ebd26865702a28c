"""The search loop: rounds of Hypothesis ``find``, one shrunk finding per round.

A round asks Hypothesis' :func:`~hypothesis.find` for the smallest scenario
document whose run fails with a signature (:mod:`.findings`) not reported yet.
The first failing example of a round fixes the round's *target* signature;
Hypothesis then shrinks while an example still shows the target, and returns
the smallest. The finding is written out as a reproducer, its signature becomes
known, and the next round goes on with the examples left in the budget. A round
that spends the budget without a new failure ends the run.

Examples whose pool runs dry (``PoolExhausted``, an input error) or that ask a
vLLM for something it cannot build are *rejected* (``hypothesis.reject``): they
are not findings, and the statistics say how many there were. A document the
loader refuses is a bug of the strategies and stops the run with a traceback.

Determinism: round ``r`` of seed ``S`` draws from ``Random(S * 7919 + r)``, so
the same seed, vLLM and budget make the same run and the same reproducers.
Hypothesis keeps no example database for a seeded run (``@seed``, which ``find``
applies for ``random=``, turns it off: a seeded run is a reproduction), so
nothing is written anywhere but ``out``; the reproducers are the record.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, find, reject, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from kvconform.errors import GeneratorBug, ScenarioError, VllmUnavailable
from kvconform.fuzz import DEFAULT_EXAMPLES, DEFAULT_MAX_FINDINGS
from kvconform.fuzz.document import render, with_header
from kvconform.fuzz.findings import Signature, first_message, signatures
from kvconform.fuzz.space import FuzzSpace, build_space
from kvconform.fuzz.strategies import scenario_documents
from kvconform.harness.expectations import Expectation
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.floors import cdiv
from kvconform.model.observations import Trajectory
from kvconform.model.results import ErrorKind, ScenarioResult
from kvconform.oracles.vllm import Vllm


@dataclass
class Finding:
    number: int
    signature: Signature
    text: str  # the shrunk scenario, exactly as run (no header)
    result: ScenarioResult
    round: int
    examples_before: int  # examples of its round until it first showed
    shrink_runs: int
    steps: int
    path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "signature": str(self.signature),
            "file": str(self.path) if self.path else None,
            "steps": self.steps,
            "round": self.round,
            "examples_before": self.examples_before,
            "shrink_runs": self.shrink_runs,
            "message": first_message(self.result, self.signature),
        }


@dataclass
class FuzzStats:
    """What a fuzz run did: counts, rates, findings."""

    seed: int
    budget: int
    vllm_version: str = ""
    examples: int = 0  # drawn examples run while searching (rejected ones included)
    rejected_pool: int = 0  # the pool ran dry (PoolExhausted)
    rejected_unsupported: int = 0  # this vLLM cannot build what was drawn
    reached_edge: int = 0  # the lookahead crossed max_model_len at some step
    cap_decided: int = 0  # ... and the cap at max_model_len took a block off a token group
    under_pressure: int = 0  # the pool was left with at most one free block
    shrink_runs: int = 0
    search_seconds: float = 0.0
    search_cpu_seconds: float = 0.0  # this process' CPU time while searching
    shrink_seconds: float = 0.0
    setup_seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)  # group types not drawn, and why
    diverged: dict[str, str] = field(default_factory=dict)  # drawn although their probe diverged
    space: str = ""

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.search_seconds if self.search_seconds else 0.0

    @property
    def examples_per_cpu_second(self) -> float:
        """Throughput independent of other load on the machine."""
        return self.examples / self.search_cpu_seconds if self.search_cpu_seconds else 0.0

    @property
    def rejected(self) -> int:
        return self.rejected_pool + self.rejected_unsupported

    def share(self, count: int) -> str:
        return f"{100 * count / self.examples:.1f}%" if self.examples else "-"

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
            "seed": self.seed,
            "budget": self.budget,
            "vllm_version": self.vllm_version,
            "examples": self.examples,
            "examples_per_second": round(self.examples_per_second, 1),
            "examples_per_cpu_second": round(self.examples_per_cpu_second, 1),
            "rejected_pool": self.rejected_pool,
            "rejected_unsupported": self.rejected_unsupported,
            "reached_edge": self.reached_edge,
            "cap_decided": self.cap_decided,
            "under_pressure": self.under_pressure,
            "shrink_runs": self.shrink_runs,
            "search_seconds": round(self.search_seconds, 2),
            "shrink_seconds": round(self.shrink_seconds, 2),
            "setup_seconds": round(self.setup_seconds, 2),
            "space": self.space,
            "excluded": self.excluded,
            "diverged": self.diverged,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class _Round:
    number: int
    target: Signature | None = None
    generated: int = 0
    shrink_runs: int = 0
    began: float = 0.0
    began_cpu: float = 0.0
    found_at: float = 0.0
    found_at_cpu: float = 0.0
    last: ScenarioResult | None = None


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
    say = progress or (lambda line: None)
    tick = on_example or (lambda outcome: None)
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
    known: set[Signature] = set()
    round_no = 0
    while stats.examples < examples and len(stats.findings) < max_findings:
        round_no += 1
        state = _Round(round_no, began=time.perf_counter(), began_cpu=time.process_time())

        def reproduces(doc: dict[str, Any], state: _Round = state) -> bool:
            searching = state.target is None
            if searching:
                state.generated += 1
                stats.examples += 1
            else:
                state.shrink_runs += 1
            result = _run_document(doc, vllm)
            if result.pool_exhausted or result.error_kind is ErrorKind.UNSUPPORTED:
                if searching:
                    if result.pool_exhausted:
                        stats.rejected_pool += 1
                    else:
                        stats.rejected_unsupported += 1
                    tick("rejected")
                reject()
            if result.error_kind is ErrorKind.INPUT:
                raise GeneratorBug(f"{result.error}\n--- the drawn scenario:\n{render(doc)}")
            found = signatures(result)
            if searching:
                _measure(result.trajectory, doc, stats)
                tick("failed" if found else "passed")
                new = [s for s in found if s not in known]
                if not new:
                    return False
                state.target = new[0]
                state.found_at = time.perf_counter()
                state.found_at_cpu = time.process_time()
                say(
                    f"fuzz: finding {len(stats.findings) + 1} after {stats.examples} examples: "
                    f"{state.target}; shrinking"
                )
            if state.target in found:
                state.last = result
                return True
            return False

        hypothesis_settings = settings(
            max_examples=max(1, examples - stats.examples),
            deadline=None,
            database=None,  # what find(random=...) does anyway; said here to be plain
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            verbosity=Verbosity.quiet,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
        try:
            doc = find(
                scenario_documents(space),
                reproduces,
                settings=hypothesis_settings,
                random=Random(seed * 7919 + round_no),
            )
        except (NoSuchExample, Unsatisfiable):  # the budget is spent (or every example rejected)
            stats.search_seconds += time.perf_counter() - state.began
            stats.search_cpu_seconds += time.process_time() - state.began_cpu
            break
        finished = time.perf_counter()
        stats.search_seconds += state.found_at - state.began
        stats.search_cpu_seconds += state.found_at_cpu - state.began_cpu
        stats.shrink_seconds += finished - state.found_at
        stats.shrink_runs += state.shrink_runs
        assert state.target is not None
        finding = _record(doc, state, stats, vllm, seed, out_dir, command)
        known.add(state.target)
        say(
            f"fuzz: finding {finding.number}: {finding.signature}, shrunk to {finding.steps} "
            f"step{'s' if finding.steps != 1 else ''} in {state.shrink_runs} runs"
            + (f": {finding.path}" if finding.path else "")
        )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "fuzz-summary.json").write_text(
            json.dumps(stats.to_json(), indent=2) + "\n", encoding="utf-8"
        )
    return stats


def _run_document(doc: dict[str, Any], vllm: Vllm, file: str = "<fuzz>") -> ScenarioResult:
    text = render(doc)
    try:
        (scenario,) = load_text(text, file)
    except ScenarioError as exc:
        raise GeneratorBug(f"{exc}\n--- the drawn scenario:\n{text}") from None
    return run_scenario(scenario, vllm)


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


def _record(
    doc: dict[str, Any],
    state: _Round,
    stats: FuzzStats,
    vllm: Vllm,
    seed: int,
    out_dir: Path | None,
    command: str | None,
) -> Finding:
    number = len(stats.findings) + 1
    assert state.target is not None and state.last is not None
    named = {**doc, "name": f"fuzz-s{seed}-{number}"}
    text = render(named)
    path = out_dir / f"fuzz-s{seed}-{number}-{state.target.slug}.yaml" if out_dir else None
    # Run the very text that is written: the reproducer must reproduce.
    result = _run_document(named, vllm, str(path) if path else "<fuzz>")
    if state.target not in signatures(result):
        raise GeneratorBug(f"the shrunk example does not reproduce {state.target}:\n{text}")
    finding = Finding(
        number,
        state.target,
        text,
        result,
        state.number,
        state.generated,
        state.shrink_runs,
        len(text.split("\nsteps:\n", 1)[1].splitlines()),
        path,
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(with_header(text, _header(finding, vllm, seed, command)), "utf-8")
    stats.findings.append(finding)
    return finding


def _header(finding: Finding, vllm: Vllm, seed: int, command: str | None) -> list[str]:
    source = vllm.source
    option: list[str] = []
    if source.kind == "src":
        option = ["--vllm-src", source.path]
    elif source.kind == "release":
        option = ["--vllm-release", str(source.release)]
    reproduce = shlex.join(["kvconform", "run", str(finding.path), *option])
    headline = " ".join(first_message(finding.result, finding.signature).split())
    return [
        f"kvconform fuzz finding {finding.number}: {finding.signature}",
        f"found by: {command or f'kvconform fuzz --seed {seed}'}",
        f"seed {seed}, round {finding.round}, after {finding.examples_before} examples; "
        f"shrunk in {finding.shrink_runs} runs",
        f"vLLM {vllm.version}: {source.describe()}",
        f"failure: {headline}",
        f"reproduce: {reproduce}",
        "",
    ]
