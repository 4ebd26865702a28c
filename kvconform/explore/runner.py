"""The explorer's search: scheduler workloads through the shared search loop.

:class:`Workloads` is the explorer's :class:`~kvconform.fuzz.search.ExampleSource`
(documents from :mod:`.strategies`; per searched example it counts the features
drawn, the scheduler steps run, preemptions and pool pressure). The loop itself,
the rejections, the shrinking and the reproducers are
:func:`kvconform.fuzz.search.search`'s, the fuzzer's own.

``jobs`` > 1 forks that many workers once vLLM is loaded (a fork shares the
imported vLLM instead of importing it again). The parent must not have initialized CUDA
by then: torch refuses CUDA in a fork of a process that did ("Cannot re-initialize CUDA
in forked subprocess"), and on a CUDA host a warmup document's
``torch.accelerator.synchronize()`` needs it. The set-up's warmup probe, the one that
runs vLLM's warmup, therefore runs in a forked child of its own (:func:`_probe_apart`),
and :func:`_refuse_forking_over_cuda` checks the parent before the workers fork
(docs/gpu.md). Worker ``i`` of ``N`` searches
with seed ``seed * N + i`` (worker 0 of 1 is the single-process run, as a shard
of ``kvconform fuzz`` does), for the same deadline, and writes its reproducers
to ``out``. The parent then reruns every reproducer written, exactly as
``kvconform run`` would load it, keeps one per signature (the shortest), and
gathers the results into root-cause groups as ``kvconform run`` gathers a run's
failures (:func:`kvconform.harness.root_causes.find_root_causes`).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvconform.errors import VllmUnavailable
from kvconform.explore import DEFAULT_MAX_FINDINGS
from kvconform.explore.known import KnownFinding, triaged
from kvconform.explore.requests import follow_ups
from kvconform.explore.space import ExploreSpace, build_explore_space, probe
from kvconform.explore.strategies import FEATURES, workloads
from kvconform.fuzz.baseline import BaselineProcess, BaselineStats
from kvconform.fuzz.findings import Signature, first_message
from kvconform.fuzz.runner import peak_blocks_held
from kvconform.fuzz.search import Budget, SearchStats, search, write_summary
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.kinds import Kind
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.oracles.vllm import Vllm

SUMMARY_FILE = "explore-summary.json"


@dataclass
class ExploreStats(SearchStats):
    """What an explorer run did: the search's counts and the workloads' shape."""

    jobs: int = 1
    scheduler_steps: int = 0  # schedule() calls of the searched examples
    preempting: int = 0  # examples in which vLLM preempted a request
    under_pressure: int = 0  # examples whose pool was left with at most one free block
    features: Counter[str] = field(default_factory=Counter)  # examples with the feature on
    modes: Counter[str] = field(default_factory=Counter)  # examples per scheduler.mode
    kinds: Counter[str] = field(default_factory=Counter)  # searched examples per kind
    startup_accepted: int = 0  # startup documents whose pool vLLM's planning accepted
    excluded: dict[str, str] = field(default_factory=dict)
    space: str = ""

    @property
    def steps_per_second(self) -> float:
        return self.scheduler_steps / self.search_seconds if self.search_seconds else 0.0

    def summary_lines(self) -> list[str]:
        per_core = self.examples_per_cpu_second
        searched = self.examples - self.rejected
        lines = [
            f"explore: {self.examples} workloads in {self.search_seconds:.1f} s on "
            f"{self.jobs} job{'s' if self.jobs != 1 else ''} ({per_core:.1f} per CPU second), "
            f"{self.scheduler_steps} scheduler steps ({self.steps_per_second:.0f}/s); "
            f"shrinking {self.shrink_runs} runs in {self.shrink_seconds:.1f} s, "
            f"set-up {self.setup_seconds:.1f} s",
            *([self.baseline.summary_line()] if self.baseline is not None else []),
            f"  rejected: {self.share(self.rejected_pool)} pool ran dry, "
            f"{self.share(self.rejected_unsupported)} not buildable, "
            f"{self.share(self.rejected_input)} refused as input (unfinished at max_steps, a "
            f"warmup pool below its first prefill); of {searched} run: "
            f"preempted: {self.share(self.preempting)}, pool left with <= 1 free block: "
            f"{self.share(self.under_pressure)}",
            "  kinds: "
            + ", ".join(f"{k} {self.share(n)}" for k, n in sorted(self.kinds.items()))
            + (
                f" (startup pools accepted: {self.startup_accepted} of {self.kinds[Kind.STARTUP]})"
                if self.kinds[Kind.STARTUP]
                else ""
            ),
            "  modes: " + ", ".join(f"{m} {self.share(n)}" for m, n in sorted(self.modes.items())),
            "  features on: "
            + ", ".join(f"{name} {self.share(self.features[name])}" for name in FEATURES),
        ]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            **self.search_json(),
            "jobs": self.jobs,
            "search_cpu_seconds": round(self.search_cpu_seconds, 2),
            "scheduler_steps": self.scheduler_steps,
            "scheduler_steps_per_second": round(self.steps_per_second, 1),
            "preempting": self.preempting,
            "under_pressure": self.under_pressure,
            "features": {name: self.features[name] for name in FEATURES},
            "modes": dict(sorted(self.modes.items())),
            "kinds": dict(sorted(self.kinds.items())),
            "startup_accepted": self.startup_accepted,
            "space": self.space,
            "excluded": self.excluded,
            "findings": [f.to_json() for f in self.findings],
        }

    def add(self, other: dict[str, Any]) -> None:
        """Fold a worker's ``to_json`` into this run's counts (findings apart)."""
        for name in (
            "examples",
            "rejected_pool",
            "rejected_unsupported",
            "rejected_input",
            "shrink_runs",
        ):
            setattr(self, name, getattr(self, name) + int(other[name]))
        for name in ("scheduler_steps", "preempting", "under_pressure", "startup_accepted"):
            setattr(self, name, getattr(self, name) + int(other.get(name, 0)))
        # The workers ran side by side: the run's seconds are the longest worker's.
        self.search_seconds = max(self.search_seconds, float(other["search_seconds"]))
        self.shrink_seconds = max(self.shrink_seconds, float(other["shrink_seconds"]))
        self.search_cpu_seconds += float(other["search_cpu_seconds"])
        self.features.update(other["features"])
        self.modes.update(other["modes"])
        self.kinds.update(other.get("kinds", {}))
        if "baseline" in other:
            if self.baseline is None:
                self.baseline = BaselineStats()
            self.baseline.add(other["baseline"])


@dataclass
class Workloads:
    """The explorer's example source: scheduler workloads of ``space``."""

    space: ExploreSpace
    stats: ExploreStats
    name: str = "explore"

    def documents(self) -> st.SearchStrategy[dict[str, Any]]:
        return workloads(self.space)

    def measure(self, result: ScenarioResult, doc: dict[str, Any]) -> None:
        stats = self.stats
        kind = doc.get("kind", Kind.TRAJECTORY)
        stats.kinds[kind] += 1
        if kind != Kind.SCHEDULER:
            # Startup and warmup documents have no scheduler, no features and no steps;
            # what they measure is what they decided (the kinds' own lines).
            self._measure_other_kind(result, kind)
            return
        stats.modes[doc["scheduler"]["mode"]] += 1
        for feature in _features_of(doc):
            stats.features[feature] += 1
        trajectory = result.trajectory
        if trajectory is None:
            return
        if trajectory.observations:
            stats.scheduler_steps += 1 + max(o.step for o in trajectory.observations)
        if any(event.kind == "preempt" for event in trajectory.events):
            stats.preempting += 1
        if trajectory.num_blocks and trajectory.num_blocks - 1 - peak_blocks_held(trajectory) <= 1:
            stats.under_pressure += 1

    def _measure_other_kind(self, result: ScenarioResult, kind: str) -> None:
        trajectory = result.trajectory
        record = trajectory.startup if trajectory is not None else None
        if kind == Kind.STARTUP and record is not None:
            self.stats.startup_accepted += int(record.accepted)


def _features_of(doc: dict[str, Any]) -> list[str]:
    """The features a drawn document shows (what the statistics count)."""
    model, scheduler, requests = doc["model"], doc["scheduler"], doc["requests"].values()
    turns = follow_ups(doc)  # their arrivals are the feature's, not `arrivals`'
    shows = {
        "hybrid": len(model["groups"]) > 1,
        "speculative": "speculative" in doc,
        "acceptance": any("accept" in r for r in requests),
        "prefix_caching": model.get("enable_caching") is True,
        "no_caching": model.get("enable_caching") is False,
        "no_chunked_prefill": scheduler.get("enable_chunked_prefill") is False,
        "async_scheduling": scheduler["mode"] != "sync",
        "priority": scheduler.get("policy") == "priority",
        "few_seqs": scheduler["max_num_seqs"] <= 2,
        "small_budget": scheduler["max_num_batched_tokens"] < 64,
        "long_prefill": "long_prefill_token_threshold" in scheduler,
        "remote_kv": any("remote_prefill" in r for r in requests),
        "sync_connector": "kv_connector" in scheduler,
        "multimodal": any("mm_inputs" in r for r in requests),
        "stops": any("stop_at" in r for r in requests),
        "aborts": any("abort_at" in r for r in requests),
        "pauses": "pause" in scheduler,
        "arrivals": any("arrival" in r for n, r in doc["requests"].items() if n not in turns),
        "stats": model.get("kv_cache_events") is True,
        "follow_ups": bool(turns),
        "group_block_sizes": any(
            isinstance(g, dict) and "block_size" in g for g in model["groups"]
        ),
        "retention": "prefix_cache_retention_interval" in model,
        "no_lookahead_hashes": bool(
            doc.get("speculative", {}).get("disable_lookahead_block_hashes")
        ),
    }
    tight = model["num_blocks"]
    shows["tight_pool"] = tight <= 2 + len(model["groups"]) * (
        -(-model["max_model_len"] // model["block_size"])
        + (doc["speculative"]["num_speculative_tokens"] if "speculative" in doc else 0)
        + 1
    )
    return [name for name in FEATURES if shows.get(name)]


@dataclass
class ExploreRun:
    """An explorer run: its statistics and, per finding kept, the rerun reproducer's result."""

    stats: ExploreStats
    reproduced: list[tuple[Path | None, Signature, ScenarioResult]] = field(default_factory=list)


# The loaded vLLM a forked worker inherits (set by the parent before it forks).
_WORKER_VLLM: Vllm | None = None


def run_explore(
    vllm: Vllm,
    budget_seconds: float,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    jobs: int = 1,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
    on_example: Callable[[str], None] | None = None,
    space: ExploreSpace | None = None,
    max_findings: int = DEFAULT_MAX_FINDINGS,
    examples: int | None = None,
    known: tuple[Signature, ...] = (),
    known_findings: Sequence[KnownFinding] = (),
    baseline_src: str | Path | None = None,
    baseline: BaselineProcess | None = None,
) -> ExploreRun:
    """Explore ``vllm`` for ``budget_seconds`` of search (or ``examples`` workloads).

    ``out=None`` writes nothing; ``known``: signatures another run reported, not searched for
    again (``kvconform explore --known``); ``known_findings``: triaged findings
    (:mod:`.known`), still searched for and reported, each marked in the summary with
    its findings.md number (``"known"``, null for a new finding), and kept as first met,
    not shrunk; ``baseline_src``: a vLLM
    tree each new failure is run on first (:mod:`kvconform.fuzz.baseline`, one process per
    job): a signature it shows there too is the baseline's, listed in the summary's
    ``baseline`` and not searched for again; ``baseline``: that process, started by the
    caller before it loaded ``vllm`` so that the two imports overlap (one job only).
    ``progress`` gets a line
    per finding, ``on_example`` each searched example's outcome ("passed", "rejected",
    "failed"; single-process runs only).
    """
    started = time.perf_counter()
    if space is None:
        space = build_explore_space(vllm, None if jobs == 1 else _probe_apart)
    if not space.group_types:
        raise VllmUnavailable(
            vllm.version,
            "a KV-cache group type vLLM's scheduler can build",
            "; ".join(f"{name}: {why}" for name, why in space.excluded.items()),
        )
    setup = time.perf_counter() - started
    out_dir = Path(out) if out is not None else None
    stats = ExploreStats(seed=seed, budget=int(budget_seconds), vllm_version=vllm.version)
    stats.jobs, stats.setup_seconds = jobs, setup
    stats.excluded, stats.space = dict(space.excluded), space.describe()
    say = progress or (lambda line: None)
    if jobs == 1:
        worker = _search_one(vllm, space, budget_seconds, seed, out_dir, command, say,
                             on_example, max_findings, examples, known,
                             baseline_src, baseline, known_findings)  # fmt: skip
        stats.add(worker.to_json())
        files = [(f.path, f.signature, f.text) for f in worker.findings]
    else:
        global _WORKER_VLLM
        _WORKER_VLLM = vllm
        _refuse_forking_over_cuda(vllm)
        context = multiprocessing.get_context("fork")
        calls = [
            (
                space,
                budget_seconds,
                seed * jobs + index,
                out_dir,
                command,
                max_findings,
                examples,
                known,
                baseline_src,
                tuple(known_findings),
            )  # fmt: skip
            for index in range(jobs)
        ]
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            answers = list(pool.map(_worker, calls))
        files = []
        for summary, found in answers:
            stats.add(summary)
            files += [(Path(p) if p else None, Signature(*s), t) for p, s, t in found]
            for line in summary.get("lines", []):
                say(line)
    run = ExploreRun(stats)
    _keep_one_per_signature(run, vllm, files)
    summary = stats.to_json()
    summary["findings"] = [
        {"signature": str(signature), "file": str(path) if path else None,
         "parts": [signature.check, signature.subject, signature.detail],
         "message": first_message(result, signature),
         "known": entry.finding if (entry := triaged(signature, vllm.version, known_findings))
         else None}
        for path, signature, result in run.reproduced
    ]  # fmt: skip
    write_summary(out_dir, SUMMARY_FILE, summary)
    return run


def _probe_apart(vllm: Vllm, doc: dict[str, Any]) -> ScenarioResult:
    """The set-up's warmup probe, run in a forked child: it runs vLLM's ``warmup_kernels``,
    whose ``torch.accelerator.synchronize()`` initializes CUDA on a CUDA host. Run in the
    parent, that made every warmup document of the workers forked after it crash in that
    call (the nightly, 0.33.0 and 0.34.0 on Python 3.12, ``--jobs 7``); the child's CUDA
    goes with it. The other probes stay here: what they import and remember is the workers'
    inheritance (the whole set-up in a child halved a 10 s search's workloads)."""
    global _WORKER_VLLM
    _WORKER_VLLM = vllm
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as pool:
        verdict, error = pool.submit(_probe_verdict, doc).result()
    return ScenarioResult(doc["name"], f"<probe {doc['name']}>", verdict, error=error)


def _probe_verdict(doc: dict[str, Any]) -> tuple[Verdict, str | None]:
    assert _WORKER_VLLM is not None
    result = probe(_WORKER_VLLM, doc)
    return result.verdict, result.error


def _refuse_forking_over_cuda(vllm: Vllm) -> None:
    """Raise :class:`VllmUnavailable` where this process has initialized CUDA: its forked
    workers could not run a warmup document on the GPU, each would report torch's refusal
    as a crash of vLLM (the facade reads torch's flag: ``Vllm.cuda_initialized``)."""
    if vllm.cuda_initialized():
        raise VllmUnavailable(
            vllm.version,
            "forked explorer workers",
            "this process initialized CUDA before forking its --jobs workers, which torch "
            "refuses CUDA to (vLLM's warmup needs it); explore with --jobs 1, or from a "
            "process that has not used the GPU",
        )


def _search_one(
    vllm: Vllm,
    space: ExploreSpace,
    budget_seconds: float,
    seed: int,
    out_dir: Path | None,
    command: str | None,
    say: Callable[[str], None],
    on_example: Callable[[str], None] | None,
    max_findings: int,
    examples: int | None,
    known: tuple[Signature, ...] = (),
    baseline_src: str | Path | None = None,
    baseline: BaselineProcess | None = None,
    known_findings: Sequence[KnownFinding] = (),
) -> ExploreStats:
    stats = ExploreStats(seed=seed, budget=int(budget_seconds), vllm_version=vllm.version)
    if baseline is None and baseline_src is not None:
        baseline = BaselineProcess(baseline_src, baseline_log(out_dir, seed))
    if baseline is not None:
        # Ready before the deadline is set: its vLLM import is set-up, not search.
        baseline.wait_ready()
        stats.baseline = BaselineStats(baseline.describe(), baseline.setup_seconds)
    budget = Budget(
        deadline=time.perf_counter() + budget_seconds,
        shrink_seconds=max(30.0, budget_seconds / 2),
    )
    if examples is not None:
        budget.examples = examples
    try:
        search(
            Workloads(space, stats),
            vllm,
            stats,
            budget,
            out_dir=out_dir,
            command=command,
            say=say,
            tick=on_example or (lambda outcome: None),
            max_findings=max_findings,
            known=known,
            baseline=baseline,
            # A triaged finding is reported as met: its reproducer is written up already.
            unshrunk=lambda signature: triaged(signature, vllm.version, known_findings) is not None,
        )
    finally:
        if baseline is not None:
            baseline.close()
    return stats


def baseline_log(out_dir: Path | None, seed: int) -> Path | None:
    """Where a baseline process' output goes (what its vLLM printed): beside the reproducers."""
    return out_dir / f"baseline-s{seed}.log" if out_dir is not None else None


def known_signatures(summary_file: Path) -> tuple[Signature, ...]:
    """The signatures of the findings an ``explore-summary.json`` lists, and of the failures
    it found its baseline to show (``baseline``, a run with ``--baseline-src``)."""
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    shown = summary.get("baseline", {}).get("failures", [])
    return tuple(
        dict.fromkeys(
            Signature(*entry["parts"]) for entry in [*summary.get("findings", []), *shown]
        )
    )


def _worker(call: tuple[Any, ...]) -> tuple[dict[str, Any], list[tuple[str | None, Any, str]]]:
    (space, budget_seconds, seed, out_dir, command, max_findings, examples, known, base,
     triaged_findings) = call  # fmt: skip
    assert _WORKER_VLLM is not None
    lines: list[str] = []
    stats = _search_one(_WORKER_VLLM, space, budget_seconds, seed, out_dir, command,
                        lines.append, None, max_findings, examples, known, base,
                        None, triaged_findings)  # fmt: skip
    summary = stats.to_json()
    summary["lines"] = [f"[seed {seed}] {line}" for line in lines]
    found = [
        (str(f.path) if f.path else None, (f.signature.check, f.signature.subject,
         f.signature.detail), f.text)
        for f in stats.findings
    ]  # fmt: skip
    return summary, found


def _keep_one_per_signature(
    run: ExploreRun, vllm: Vllm, files: list[tuple[Path | None, Signature, str]]
) -> None:
    """Rerun each reproducer as ``kvconform run`` loads it; keep the shortest per signature."""
    best: dict[Signature, tuple[Path | None, str]] = {}
    for path, signature, text in files:
        if signature not in best or len(text) < len(best[signature][1]):
            best[signature] = (path, text)
    for signature, (path, text) in sorted(best.items()):
        source = path.read_text(encoding="utf-8") if path is not None else text
        (scenario,) = load_text(source, str(path) if path else "<explore>")
        result = run_scenario(scenario, vllm)
        run.reproduced.append((path, signature, result))
    kept = {path for path, _ in best.values()}
    for path, _, _ in files:
        if path is not None and path not in kept and path.exists():
            path.unlink()  # another worker's reproducer of a signature kept elsewhere
