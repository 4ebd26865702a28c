"""The runner: run scenarios, judge them, apply expectations, decide the exit status.

Both fronts -- the ``kvconform`` command line and the pytest plugin -- call
:func:`run_scenario`; neither re-implements any part of it. A scenario's
``kind`` picks its driver from :data:`DRIVERS`; the driver records a
:class:`Trajectory`, the checks judge it, and the result carries both. A check
that needs a party of its own beyond the driver's (``slots``: vLLM's
slot-mapping kernel) names it in its record (``Check.record``); the runner runs
it on the recorded trajectory only when that check is selected, so the checks
themselves never call vLLM.

Whatever goes wrong inside one scenario stays inside its result: a bad step is
an ``input`` error; a scenario needing what the release does not offer (a spec
type, a method, a runner or scheduler option: :class:`NotOffered`) is
``unsupported``, its own verdict, which leaves the exit status alone; a vLLM
lacking an API kvconform needs is an error of kind ``unsupported``; and an
exception raised by vLLM on a valid scenario is a ``crash``, reported with the
vLLM frame it came from and with what the driver recorded up to it (a partial
trajectory, shown by the reports and kept by ``--record-dir``, judged by no check). A
check whose party cannot set up is skipped with the reason while the other checks decide.
The run goes on with the next scenario.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from kvconform.errors import (
    ExitStatus,
    NotOffered,
    PoolExhausted,
    ScenarioError,
    ScenarioSkipped,
    VllmUnavailable,
)
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS, judge
from kvconform.harness.drivers import DRIVERS
from kvconform.harness.drivers.common import InProgress, recording_in_progress
from kvconform.harness.expectations import Expectation, apply_expectations
from kvconform.harness.hit_settings import name_deciding_settings
from kvconform.model.observations import Trajectory
from kvconform.model.recording import Recording
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.resolve import resolve_settings
from kvconform.oracles.vllm import Vllm


def run_scenario(
    scenario: Scenario,
    vllm: Vllm,
    checks: tuple[str, ...] = DEFAULT_CHECKS,
    expectations: Iterable[Expectation] = (),
    record: Callable[[Recording], None] | None = None,
) -> ScenarioResult:
    """One scenario's verdict: its driver, its checks' parties, the checks, the known
    divergences. ``record``: given the run's :class:`Recording` (what the driver and the
    parties recorded, before any check judged it), for ``run --record-dir``."""
    result = ScenarioResult(
        scenario.id,
        scenario.file,
        Verdict.PASSED,
        scenario.kind,
        scenario.tags,
        line=scenario.line,
        description=scenario.description,
    )
    started = time.perf_counter()
    progress = InProgress()
    try:
        vllm.require_release(scenario.vllm_releases, "the scenario")
        driver = DRIVERS.get(scenario.kind)
        if driver is None:
            raise ScenarioError(scenario.where.at("kind"), f"no driver for kind {scenario.kind!r}")
        # Every setting the file leaves out takes vLLM's default for this release.
        scenario, result.settings = resolve_settings(scenario, vllm)
        with recording_in_progress() as progress:
            trajectory = driver(scenario, vllm)
        # A stated hit vLLM did not give: which setting decided it, asked of vLLM.
        name_deciding_settings(scenario, trajectory, vllm, result.settings, driver)
    except ScenarioSkipped as exc:
        result.verdict, result.skip_reason = Verdict.SKIPPED, str(exc)
        result.duration = time.perf_counter() - started
        if record is not None:
            record(recording_of(scenario, replace(result), checks, vllm))
        return result
    except ScenarioError as exc:
        result.verdict, result.error_kind, result.error = Verdict.ERROR, ErrorKind.INPUT, str(exc)
        result.pool_exhausted = isinstance(exc, PoolExhausted)
    except NotOffered as exc:
        # The release lacks what the scenario needs: it does not apply here.
        result.verdict, result.error_kind, result.error = (
            Verdict.UNSUPPORTED,
            ErrorKind.UNSUPPORTED,
            str(exc),
        )
    except VllmUnavailable as exc:
        result.verdict, result.error_kind, result.error = (
            Verdict.ERROR,
            ErrorKind.UNSUPPORTED,
            str(exc),
        )
    except Exception as exc:  # noqa: BLE001 - vLLM raising on a valid scenario is a finding
        result.error = describe_crash(exc, vllm)
        result.verdict, result.error_kind = Verdict.ERROR, crash_kind(result.error)
        result.trajectory = keep_partial(progress.trajectory)
    else:
        cannot_run, crash = run_parties(trajectory, vllm, checks)
        if record is not None:
            outcome = replace(result, duration=time.perf_counter() - started)
            record(recording_of(scenario, outcome, checks, vllm, trajectory, cannot_run, crash))
        conclude(result, trajectory, checks, cannot_run, crash)
        result.duration = time.perf_counter() - started
        return apply_expectations(result, list(expectations), vllm.version)
    result.duration = time.perf_counter() - started
    if record is not None:
        # A crash's partial trajectory goes beside the outcome, as a whole run's does.
        outcome = replace(result, trajectory=None)
        record(recording_of(scenario, outcome, checks, vllm, result.trajectory))
    return apply_expectations(result, list(expectations), vllm.version)


def keep_partial(trajectory: Trajectory | None) -> Trajectory | None:
    """What the driver recorded before an exception stopped it, marked partial, for the
    reports: the steps that led to the crash. No check judges it (a run cut short breaks
    end-of-run invariants that a whole run keeps); the verdict is the crash."""
    if trajectory is None:
        return None
    trajectory.partial = True
    steps = {o.step for o in trajectory.observations}
    count = f"{len(steps)} step{'s' if len(steps) > 1 else ''}"
    upto = f"{count} recorded, the last step {max(steps)}" if steps else "no step recorded"
    trajectory.notes.append(
        f"partial: recorded until the exception stopped the run ({upto}); judged by no "
        "check, the verdict is the exception"
    )
    return trajectory


def recording_of(
    scenario: Scenario,
    outcome: ScenarioResult,
    checks: tuple[str, ...],
    vllm: Vllm,
    trajectory: Trajectory | None = None,
    cannot_run: dict[str, str] | None = None,
    crash: str | None = None,
) -> Recording:
    """The recording of one scenario's run against ``vllm``, before any judgement."""
    torch_version, device = vllm.runtime()
    return Recording(
        scenario.id,
        scenario.file,
        scenario.kind,
        trajectory,
        outcome=outcome,
        checks=checks,
        cannot_run=dict(cannot_run or {}),
        crash=crash,
        vllm={
            "version": vllm.version,
            "source": vllm.source.kind,
            "path": vllm.location,
            "release": vllm.source.release,
            "torch": torch_version,
            "device": device,
        },
    )


def judge_scenario(
    result: ScenarioResult, trajectory: Trajectory, vllm: Vllm, checks: tuple[str, ...]
) -> None:
    """Run the selected checks' own parties, then judge; one party's trouble stays its check's.

    A party that cannot set up on this vLLM (it raises :class:`VllmUnavailable`) has its
    check skipped with the reason; one that raises anything else makes the scenario a
    crash. Either way the other checks still judge the trajectory, so their verdicts stay
    in the result.
    """
    cannot_run, crash = run_parties(trajectory, vllm, checks)
    conclude(result, trajectory, checks, cannot_run, crash)


def run_parties(
    trajectory: Trajectory, vllm: Vllm, checks: tuple[str, ...]
) -> tuple[dict[str, str], str | None]:
    """The selected checks' own parties (``slots``: vLLM's kernel): the checks whose
    party could not run here (why), and a party's crash inside vLLM."""
    cannot_run: dict[str, str] = {}
    crash = None
    for name in checks:
        party = CHECKS[name].record
        if party is None:
            continue
        try:
            party(trajectory, vllm)
        except VllmUnavailable as exc:
            cannot_run[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - vLLM raising on a valid scenario is a finding
            crash = describe_crash(exc, vllm)
            cannot_run[name] = f"its party raised ({crash})"
    return cannot_run, crash


def conclude(
    result: ScenarioResult,
    trajectory: Trajectory,
    checks: tuple[str, ...],
    cannot_run: dict[str, str],
    crash: str | None,
) -> None:
    """Judge a recorded trajectory with the checks that could run, and set the verdict;
    it never asks vLLM (``kvconform judge`` runs it on recordings)."""
    result.trajectory = trajectory
    judgement = judge(trajectory, tuple(c for c in checks if c not in cannot_run))
    skipped = {**judgement.skipped, **cannot_run}
    result.failures = judgement.failures
    result.skipped_checks = {name: skipped[name] for name in checks if name in skipped}
    if crash is not None:
        result.verdict, result.error_kind, result.error = Verdict.ERROR, crash_kind(crash), crash
    elif result.failures:
        result.verdict = Verdict.FAILED
    elif checks and len(result.skipped_checks) == len(checks):
        # Nothing selected could run here: the scenario does not apply, and did not pass.
        result.verdict, result.error_kind = Verdict.UNSUPPORTED, ErrorKind.UNSUPPORTED
        result.error = "no selected check could run: " + "; ".join(
            f"{name}: {why}" for name, why in result.skipped_checks.items()
        )


def run_all(
    scenarios: Iterable[Scenario],
    vllm: Vllm,
    checks: tuple[str, ...] = DEFAULT_CHECKS,
    expectations: Iterable[Expectation] = (),
) -> Iterator[ScenarioResult]:
    expectations = list(expectations)
    for scenario in scenarios:
        yield run_scenario(scenario, vllm, checks, expectations)


# kvconform's package, whose frames make an exception kvconform's own (describe_crash).
_KVCONFORM_PACKAGE = Path(__file__).resolve().parents[1]
# How describe_crash begins the description of an exception of kvconform's own code: a
# recording keeps only the text, and ``judge`` classifies it again from it (crash_kind).
INTERNAL_ERROR_PREFIX = "kvconform's "


def _kvconform_part(filename: str) -> str | None:
    """What part of kvconform a frame's file is (``scheduler oracle``, ``driver``, ...), or
    None for a file outside kvconform's package."""
    try:
        parts = Path(filename).resolve().relative_to(_KVCONFORM_PACKAGE).parts
    except ValueError:
        return None
    if parts[:2] == ("oracles", "vllm"):
        return "vLLM adapter"
    if parts[:1] == ("oracles",) and len(parts) > 2:
        return f"{parts[1]} oracle"
    if parts[:1] == ("oracles",):
        return "oracle"
    if parts[:2] == ("harness", "drivers"):
        return "driver"
    if parts[:2] == ("harness", "checks"):
        return "check"
    return "code"


def describe_crash(exc: BaseException, vllm: Vllm) -> str:
    """The exception and whose code raised it: the innermost frame that is vLLM's or
    kvconform's.

    Where that frame is vLLM's, vLLM raised on a valid scenario (a finding): "vLLM V raised
    E at vllm/...py:LINE in FN". Where it is kvconform's, the exception came from
    kvconform's own code with no vLLM call under it (an oracle indexing what it recorded,
    say), and vLLM is not to blame: "kvconform's scheduler oracle raised E at
    kvconform/...py:LINE in FN" (:func:`crash_kind` makes it ``internal``). Frames of
    neither (the standard library, torch) do not decide: a ``KeyError`` out of a ``dict``
    belongs to whoever indexed it. A vLLM frame called back through a stub of kvconform's
    is kvconform's when the stub raises. FN is the function's name on any interpreter: a
    comprehension's frame is named for the function that holds it (:func:`_function_of`).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    tree = str(Path(vllm.location))
    owned = [
        (i, None if f.filename.startswith(tree) else _kvconform_part(f.filename))
        for i, f in enumerate(frames)
        if f.filename.startswith(tree) or _kvconform_part(f.filename) is not None
    ]
    index, part = owned[-1] if owned else (len(frames) - 1, None)
    where = ""
    if index >= 0:
        frame = frames[index]
        base = _KVCONFORM_PACKAGE.parent if part is not None else Path(vllm.location).parent
        try:
            shown = str(Path(frame.filename).resolve().relative_to(base.resolve()))
        except ValueError:
            shown = frame.filename
        where = f" at {shown}:{frame.lineno} in {_function_of(frames, index)}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    raised = f"raised {type(exc).__name__}{': ' + text if text else ''}{where}"
    if part is not None:
        return (
            f"{INTERNAL_ERROR_PREFIX}{part} {raised} (an error of kvconform, not a finding on "
            f"vLLM {vllm.version})"
        )
    return f"vLLM {vllm.version} {raised}"


# The comprehensions Python 3.12 inlines into the function that holds them (PEP 709): there
# a traceback names that function, where 3.11 names a frame of the comprehension's own.
# A generator expression still runs in a frame of its own on 3.12 and keeps its name.
_INLINED_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


def _function_of(frames: traceback.StackSummary, index: int) -> str:
    """The name a crash is signed with for ``frames[index]``: its function's, as Python 3.12
    names it, whatever the interpreter that ran it.

    A frame of a list, dict or set comprehension is named for the function that holds the
    comprehension: the next frame out in the same file (through nested comprehensions),
    which called it. The line stays the comprehension frame's own, the line 3.12 reports
    too, so that a crash signs the same on either interpreter (the explorer's known
    findings, scenarios/explore-known.yaml, match signatures exactly).
    """
    frame = frames[index]
    outer = index
    while frames[outer].name in _INLINED_COMPREHENSIONS and outer > 0:
        if frames[outer - 1].filename != frame.filename:
            break
        outer -= 1
    return frames[outer].name


def crash_kind(description: str) -> ErrorKind:
    """``internal`` for an exception :func:`describe_crash` put on kvconform's own code (it
    is not a finding; the run exits 3, vLLM could not be exercised), else ``crash``."""
    if description.startswith(INTERNAL_ERROR_PREFIX):
        return ErrorKind.INTERNAL
    return ErrorKind.CRASH


def exit_status(results: Iterable[ScenarioResult], input_errors: int = 0) -> ExitStatus:
    """Nonconformance wins (a crash of vLLM included), then bad input, then "not exercised".

    A failure is a finding whatever else went wrong in the run: exit 1 even beside bad
    input, so that a bisection (``kvconform check``) marks a commit that fails the corpus
    bad instead of aborting on another file's mistake. ``unsupported`` scenarios (the
    release does not offer what they need) leave it alone, unless nothing else ran:
    then this vLLM was not exercised at all.
    """
    results = list(results)
    if any(r.verdict is Verdict.FAILED for r in results) or any(
        r.verdict is Verdict.ERROR and r.error_kind is ErrorKind.CRASH for r in results
    ):
        return ExitStatus.NONCONFORMANCE
    if input_errors or any(r.error_kind is ErrorKind.INPUT for r in results):
        return ExitStatus.BAD_INPUT
    if results and all(r.verdict is Verdict.UNSUPPORTED for r in results):
        return ExitStatus.NOT_EXERCISED
    if any(r.verdict is Verdict.ERROR for r in results):
        return ExitStatus.NOT_EXERCISED
    return ExitStatus.CONFORM
