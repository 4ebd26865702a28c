"""The search loop shared by ``kvconform fuzz`` and ``kvconform explore``.

A round asks Hypothesis' :func:`~hypothesis.find` for the smallest scenario
document whose run fails with a signature (:mod:`.findings`) not reported yet.
The first failing example of a round fixes the round's *target* signature;
Hypothesis then shrinks while an example still shows the target, and returns
the smallest. The finding is written out as a reproducer, its signature becomes
known, and the next round goes on with what is left of the budget. A round
that spends the budget without a new failure ends the run.

What is searched is an :class:`ExampleSource`: the strategy that draws the
documents, its name (reproducer files and headers) and what it measures of each
example for its statistics. The fuzzer's source draws trajectories
(:mod:`kvconform.fuzz.runner`), the explorer's scheduler workloads
(:mod:`kvconform.explore.runner`); the loop, the rejections, the shrinking, the
reproducers and their headers are this module's, once.

The budget is a number of examples (fuzz), a deadline (explore), or both. A
deadline is checked before each example of the search; a round's shrinking may
run past it by at most ``shrink_seconds`` and then keeps the smallest failing
example seen so far (Hypothesis offers examples in shrinking order, so that is
the shrinking done up to then).

Examples whose pool runs dry (``PoolExhausted``, an input error) or that ask a
vLLM for something it cannot build are *rejected* (``hypothesis.reject``): they
are not findings, and the statistics say how many there were. A document the
loader refuses is a bug of the strategies and stops the run with a traceback.

Determinism: round ``r`` of seed ``S`` draws from ``Random(S * 7919 + r)``, so
the same seed, vLLM and example budget make the same run and the same
reproducers (a deadline ends a run where the machine's speed puts the end).
Hypothesis keeps no example database for a seeded run (``@seed``, which
``find`` applies for ``random=``, turns it off: a seeded run is a reproduction),
so nothing is written anywhere but ``out``; the reproducers are the record.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any, Protocol

from hypothesis import HealthCheck, Phase, Verbosity, find, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample, Unsatisfiable

from kvconform.errors import DeadlinePassed, GeneratorBug, KeptAsMet, ScenarioError
from kvconform.fuzz.baseline import Baseline, BaselineAnswer, BaselineFailure, BaselineStats
from kvconform.fuzz.document import render, with_header
from kvconform.fuzz.findings import Signature, first_message, signatures
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.results import ErrorKind, ScenarioResult
from kvconform.oracles.vllm import Vllm

# Examples a deadline-bound search may run: Hypothesis needs a number; the deadline ends it.
UNBOUNDED_EXAMPLES = 10**9


class ExampleSource(Protocol):
    """What a search draws from, and what it measures of each example."""

    @property
    def name(self) -> str:
        """The command's name: reproducers are ``NAME-sSEED-N-...yaml``."""
        ...

    def documents(self) -> st.SearchStrategy[dict[str, Any]]:
        """The strategy of scenario documents (plain dicts in the v1 format)."""
        ...

    def measure(self, result: ScenarioResult, doc: dict[str, Any]) -> None:
        """Count what the source reports of a searched (not rejected) example."""
        ...


@dataclass
class Finding:
    number: int
    signature: Signature
    text: str  # the shrunk scenario, exactly as run (no header)
    result: ScenarioResult
    round: int
    examples_before: int  # examples of its round until it first showed
    shrink_runs: int
    steps: int  # lines of the reproducer's steps (trajectory) or requests (scheduler)
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
class SearchStats:
    """What a search did: counts, rates, findings (each source adds its own measures)."""

    seed: int
    budget: int  # examples (fuzz) or seconds (explore)
    vllm_version: str = ""
    examples: int = 0  # drawn examples run while searching (rejected ones included)
    rejected_pool: int = 0  # the pool ran dry (PoolExhausted)
    rejected_unsupported: int = 0  # this vLLM cannot build what was drawn
    # Drawn documents the loader took but the run refused as input (the scheduler's
    # max_steps passed): counted and shown, since liveness is not judged yet.
    rejected_input: int = 0
    shrink_runs: int = 0
    search_seconds: float = 0.0
    search_cpu_seconds: float = 0.0  # this process' CPU time while searching
    shrink_seconds: float = 0.0
    setup_seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    # Set when the search compares its failures with a baseline vLLM (kvconform.fuzz.baseline).
    baseline: BaselineStats | None = None

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.search_seconds if self.search_seconds else 0.0

    @property
    def examples_per_cpu_second(self) -> float:
        """Throughput independent of other load on the machine."""
        return self.examples / self.search_cpu_seconds if self.search_cpu_seconds else 0.0

    @property
    def rejected(self) -> int:
        return self.rejected_pool + self.rejected_unsupported + self.rejected_input

    def share(self, count: int) -> str:
        return f"{100 * count / self.examples:.1f}%" if self.examples else "-"

    def search_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "budget": self.budget,
            "vllm_version": self.vllm_version,
            "examples": self.examples,
            "examples_per_second": round(self.examples_per_second, 1),
            "examples_per_cpu_second": round(self.examples_per_cpu_second, 1),
            "rejected_pool": self.rejected_pool,
            "rejected_unsupported": self.rejected_unsupported,
            "rejected_input": self.rejected_input,
            "shrink_runs": self.shrink_runs,
            "search_seconds": round(self.search_seconds, 2),
            "shrink_seconds": round(self.shrink_seconds, 2),
            "setup_seconds": round(self.setup_seconds, 2),
            **({"baseline": self.baseline.to_json()} if self.baseline is not None else {}),
        }


@dataclass
class Budget:
    """When a search stops: after ``examples``, at ``deadline`` (``perf_counter``), or both."""

    examples: int = UNBOUNDED_EXAMPLES
    deadline: float | None = None
    shrink_seconds: float = 60.0  # how far past the deadline a round's shrinking may run

    def spent(self, examples: int) -> bool:
        if examples >= self.examples:
            return True
        return self.deadline is not None and time.perf_counter() >= self.deadline


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
    smallest: dict[str, Any] | None = None  # the smallest example that showed the target
    smallest_size: int = 0
    kind: str | None = None  # the kind of the example that first showed the target


def search(
    source: ExampleSource,
    vllm: Vllm,
    stats: SearchStats,
    budget: Budget,
    *,
    out_dir: Path | None = None,
    command: str | None = None,
    say: Callable[[str], None] = lambda line: None,
    tick: Callable[[str], None] = lambda outcome: None,
    max_findings: int = 10,
    known: Iterable[Signature] = (),
    baseline: Baseline | None = None,
    unshrunk: Callable[[Signature], bool] = lambda signature: False,
) -> None:
    """Search ``source`` on ``vllm`` until ``budget`` is spent; fill ``stats``, write reproducers.

    ``known``: signatures reported before (another run's), not searched for again.
    ``unshrunk``: signatures recorded as first met, without shrinking (triaged findings,
    whose small reproducer is already written up: shrinking them again spent most of a
    120 s budget); they do not count towards ``max_findings``.
    ``baseline``: the vLLM the one under test is compared with (:mod:`.baseline`): a new
    signature is run there first and, if the baseline shows it on the same document, recorded
    in ``stats.baseline`` instead of shrunk; a shrink candidate counts only where the baseline
    does not show the target.
    """
    known = set(known)
    if baseline is not None and stats.baseline is None:
        stats.baseline = BaselineStats(vllm=baseline.describe())
    round_no = 0
    name = source.name
    strategy = source.documents()
    def searched_for() -> int:
        # Triaged findings are kept as met, not shrunk, and do not end the search: with
        # twenty of them listed, counting them stopped seed 0's 120 s run after 54 s.
        return sum(not unshrunk(finding.signature) for finding in stats.findings)

    while not budget.spent(stats.examples) and searched_for() < max_findings:
        round_no += 1
        state = _Round(round_no, began=time.perf_counter(), began_cpu=time.process_time())

        def reproduces(doc: dict[str, Any], state: _Round = state) -> bool:
            searching = state.target is None
            if searching:
                if budget.spent(stats.examples):
                    raise DeadlinePassed
                state.generated += 1
                stats.examples += 1
            else:
                if (
                    budget.deadline is not None
                    and time.perf_counter() > budget.deadline + budget.shrink_seconds
                ):
                    raise DeadlinePassed
                if doc.get("kind") != state.kind:
                    # A source drawing several kinds: a failure shrinks within its kind
                    # (its reproducer is a document of the kind that failed), not run.
                    return False
                state.shrink_runs += 1
            result = run_document(doc, vllm, f"<{name}>")
            if result.pool_exhausted or result.error_kind is ErrorKind.UNSUPPORTED:
                if searching:
                    if result.pool_exhausted:
                        stats.rejected_pool += 1
                    else:
                        stats.rejected_unsupported += 1
                    tick("rejected")
                reject()
            if result.error_kind is ErrorKind.INPUT:
                # The loader took the document (a refusal of the loader is a GeneratorBug
                # in run_document); the run refused it (the scheduler's max_steps passed
                # with requests unfinished). Not a finding while liveness is not judged
                # (docs/contract.md), nor a reason to stop: counted, and while shrinking
                # such a candidate does not reproduce.
                if searching:
                    stats.rejected_input += 1
                    tick("rejected")
                reject()
            if result.error_kind is ErrorKind.INTERNAL:
                # kvconform's own code raising on a document: a kvconform bug to fix.
                raise GeneratorBug(f"{result.error}\n--- the drawn scenario:\n{render(doc)}")
            found = signatures(result)
            if searching:
                source.measure(result, doc)
                tick("failed" if found else "passed")
                new = [s for s in found if s not in known]
                if new and baseline is not None:
                    new = _not_the_baselines(baseline, doc, new, stats, known, name, say)
                if not new:
                    return False
                state.target = new[0]
                state.kind = doc.get("kind")
                state.found_at = time.perf_counter()
                state.found_at_cpu = time.process_time()
                if unshrunk(state.target):
                    say(
                        f"{name}: finding {len(stats.findings) + 1} after {stats.examples} "
                        f"examples: {state.target}; triaged, kept as met"
                    )
                    state.last, state.smallest = result, doc
                    raise KeptAsMet
                say(
                    f"{name}: finding {len(stats.findings) + 1} after {stats.examples} "
                    f"examples: {state.target}; shrinking"
                )
            if state.target in found:
                if not searching and baseline is not None:
                    answer = _ask(baseline, doc, stats, shrinking=True)
                    if answer.shows(state.target):
                        return False  # the baseline fails this candidate the same way
                state.last = result
                size = len(render(doc))
                if state.smallest is None or size <= state.smallest_size:
                    state.smallest, state.smallest_size = doc, size
                return True
            return False

        hypothesis_settings = settings(
            max_examples=max(1, budget.examples - stats.examples),
            deadline=None,
            database=None,  # what find(random=...) does anyway; said here to be plain
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            verbosity=Verbosity.quiet,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
        try:
            doc = find(
                strategy,
                reproduces,
                settings=hypothesis_settings,
                random=Random(stats.seed * 7919 + round_no),
            )
        except (NoSuchExample, Unsatisfiable, DeadlinePassed, KeptAsMet):
            if state.target is None:  # the budget is spent (or every example rejected)
                stats.search_seconds += time.perf_counter() - state.began
                stats.search_cpu_seconds += time.process_time() - state.began_cpu
                break
            assert state.smallest is not None  # shrinking ran out of time: keep its best
            doc = state.smallest
        finished = time.perf_counter()
        stats.search_seconds += state.found_at - state.began
        stats.search_cpu_seconds += state.found_at_cpu - state.began_cpu
        stats.shrink_seconds += finished - state.found_at
        stats.shrink_runs += state.shrink_runs
        assert state.target is not None
        finding = _record(name, doc, state, stats, vllm, out_dir, command)
        known.add(state.target)
        steps = f"{finding.steps} step{'s' if finding.steps != 1 else ''}"
        how = (
            f"kept as met, {steps}"
            if unshrunk(state.target)
            else f"shrunk to {steps} in {state.shrink_runs} runs"
        )
        say(
            f"{name}: finding {finding.number}: {finding.signature}, {how}"
            + (f": {finding.path}" if finding.path else "")
        )


def _ask(
    baseline: Baseline, doc: dict[str, Any], stats: SearchStats, *, shrinking: bool
) -> BaselineAnswer:
    """The baseline's run of ``doc`` (the text the search runs), counted in ``stats``."""
    assert stats.baseline is not None
    started = time.perf_counter()
    answer = baseline.judge(render(doc))
    stats.baseline.count(answer, time.perf_counter() - started, shrinking)
    return answer


def _not_the_baselines(
    baseline: Baseline,
    doc: dict[str, Any],
    new: list[Signature],
    stats: SearchStats,
    known: set[Signature],
    name: str,
    say: Callable[[str], None],
) -> list[Signature]:
    """The signatures of ``new`` the baseline does not show on ``doc``; those it shows are
    recorded as the baseline's and become known (not searched for again)."""
    answer = _ask(baseline, doc, stats, shrinking=False)
    assert stats.baseline is not None
    for signature in new:
        if answer.shows(signature):
            known.add(signature)
            stats.baseline.failures.append(
                BaselineFailure(signature, stats.examples, answer.message(signature))
            )
            say(
                f"{name}: after {stats.examples} examples: {signature}, which the baseline "
                "fails too on the same workload; searching on"
            )
    return [signature for signature in new if not answer.shows(signature)]


def run_document(doc: dict[str, Any], vllm: Vllm, file: str = "<fuzz>") -> ScenarioResult:
    """Render ``doc``, load it through the real loader and run it, as ``kvconform run`` would."""
    text = render(doc)
    try:
        (scenario,) = load_text(text, file)
    except ScenarioError as exc:
        raise GeneratorBug(f"{exc}\n--- the drawn scenario:\n{text}") from None
    return run_scenario(scenario, vllm)


def write_summary(out_dir: Path | None, file_name: str, summary: dict[str, Any]) -> None:
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / file_name).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _size_in_lines(text: str) -> int:
    """A reproducer's size: its steps (trajectory) or its requests (scheduler)."""
    for section in ("\nsteps:\n", "\nrequests:\n"):
        if section in text:
            body = text.split(section, 1)[1]
            return sum(1 for line in body.splitlines() if line.startswith("  "))
    return 0


def _record(
    name: str,
    doc: dict[str, Any],
    state: _Round,
    stats: SearchStats,
    vllm: Vllm,
    out_dir: Path | None,
    command: str | None,
) -> Finding:
    number = len(stats.findings) + 1
    seed = stats.seed
    assert state.target is not None
    named = {**doc, "name": f"{name}-s{seed}-{number}"}
    text = render(named)
    path = out_dir / f"{name}-s{seed}-{number}-{state.target.slug}.yaml" if out_dir else None
    # Run the very text that is written: the reproducer must reproduce.
    result = run_document(named, vllm, str(path) if path else f"<{name}>")
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
        _size_in_lines(text),
        path,
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(with_header(text, _header(name, finding, vllm, seed, command)), "utf-8")
    stats.findings.append(finding)
    return finding


def _header(name: str, finding: Finding, vllm: Vllm, seed: int, command: str | None) -> list[str]:
    source = vllm.source
    option: list[str] = []
    if source.kind == "src":
        option = ["--vllm-src", source.path]
    elif source.kind == "release":
        option = ["--vllm-release", str(source.release)]
    reproduce = shlex.join(["kvconform", "run", str(finding.path), *option])
    headline = " ".join(first_message(finding.result, finding.signature).split())
    return [
        f"kvconform {name} finding {finding.number}: {finding.signature}",
        f"found by: {command or f'kvconform {name} --seed {seed}'}",
        f"seed {seed}, round {finding.round}, after {finding.examples_before} examples; "
        f"shrunk in {finding.shrink_runs} runs",
        f"vLLM {vllm.version}: {source.describe()}",
        f"failure: {headline}",
        f"reproduce: {reproduce}",
        "",
    ]
