"""The engine: run scenarios, judge them, apply expectations, decide the exit status.

Both fronts -- the ``kvconform`` command line and the pytest plugin -- call
:func:`run_scenario`; neither re-implements any part of it. A scenario's
``kind`` picks its driver from :data:`DRIVERS`; the driver records a
:class:`Trajectory`, the checks judge it, and the result carries both. A check
that needs a party of its own beyond the driver's (``slots``: vLLM's
slot-mapping kernel) names it in :data:`PARTIES_FOR_CHECKS`; the engine runs it
on the recorded trajectory only when that check is selected, so the checks
themselves never call vLLM.

Whatever goes wrong inside one scenario stays inside its result: a bad step is
an ``input`` error, a vLLM without a needed API is ``unsupported``, and an
exception raised by vLLM on a valid scenario is a ``crash``, reported with the
vLLM frame it came from. The run goes on with the next scenario.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kvconform.errors import (
    ExitStatus,
    PoolExhausted,
    ScenarioError,
    ScenarioSkipped,
    VllmUnavailable,
)
from kvconform.harness.checks import DEFAULT_CHECKS, judge
from kvconform.harness.drivers import DRIVERS
from kvconform.harness.expectations import Expectation, apply_expectations
from kvconform.model.observations import Trajectory
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.slots import record_slots
from kvconform.oracles.vllm import Vllm

# Parties that record, after the driver, what one check judges: run only when
# that check is selected. Any kind of scenario gets them (they read a Trajectory).
PARTIES_FOR_CHECKS: dict[str, Callable[[Trajectory, Vllm], object]] = {"slots": record_slots}


def run_scenario(
    scenario: Scenario,
    vllm: Vllm,
    checks: tuple[str, ...] = DEFAULT_CHECKS,
    expectations: Iterable[Expectation] = (),
) -> ScenarioResult:
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
    try:
        driver = DRIVERS.get(scenario.kind)
        if driver is None:
            raise ScenarioError(scenario.where.at("kind"), f"no driver for kind {scenario.kind!r}")
        trajectory = driver(scenario, vllm)
        for name in checks:
            party = PARTIES_FOR_CHECKS.get(name)
            if party is not None:
                party(trajectory, vllm)
    except ScenarioSkipped as exc:
        result.verdict, result.skip_reason = Verdict.SKIPPED, str(exc)
        result.duration = time.perf_counter() - started
        return result
    except ScenarioError as exc:
        result.verdict, result.error_kind, result.error = Verdict.ERROR, ErrorKind.INPUT, str(exc)
        result.pool_exhausted = isinstance(exc, PoolExhausted)
    except VllmUnavailable as exc:
        result.verdict, result.error_kind, result.error = (
            Verdict.ERROR,
            ErrorKind.UNSUPPORTED,
            str(exc),
        )
    except Exception as exc:  # noqa: BLE001 - vLLM raising on a valid scenario is a finding
        result.verdict, result.error_kind = Verdict.ERROR, ErrorKind.CRASH
        result.error = describe_crash(exc, vllm)
    else:
        result.trajectory = trajectory
        judgement = judge(trajectory, checks)
        result.failures, result.skipped_checks = judgement.failures, judgement.skipped
        if result.failures:
            result.verdict = Verdict.FAILED
        elif checks and len(judgement.skipped) == len(checks):
            # Nothing selected could run: that is not a pass.
            result.verdict, result.error_kind = Verdict.ERROR, ErrorKind.UNSUPPORTED
            result.error = "no selected check could run: " + "; ".join(
                f"{name}: {why}" for name, why in judgement.skipped.items()
            )
    result.duration = time.perf_counter() - started
    return apply_expectations(result, list(expectations), vllm.version)


def run_all(
    scenarios: Iterable[Scenario],
    vllm: Vllm,
    checks: tuple[str, ...] = DEFAULT_CHECKS,
    expectations: Iterable[Expectation] = (),
) -> Iterator[ScenarioResult]:
    expectations = list(expectations)
    for scenario in scenarios:
        yield run_scenario(scenario, vllm, checks, expectations)


def describe_crash(exc: BaseException, vllm: Vllm) -> str:
    """The exception and the innermost vLLM frame it passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    location = Path(vllm.location).parent
    inside = [f for f in frames if f.filename.startswith(str(Path(vllm.location)))]
    frame = inside[-1] if inside else (frames[-1] if frames else None)
    where = ""
    if frame is not None:
        try:
            shown = str(Path(frame.filename).relative_to(location))
        except ValueError:
            shown = frame.filename
        where = f" at {shown}:{frame.lineno} in {frame.name}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"vLLM {vllm.version} raised {type(exc).__name__}{': ' + text if text else ''}{where}"


def exit_status(results: Iterable[ScenarioResult], input_errors: int = 0) -> ExitStatus:
    """Bad input wins, then nonconformance (a crash of vLLM included), then "not exercised"."""
    results = list(results)
    if input_errors or any(r.error_kind is ErrorKind.INPUT for r in results):
        return ExitStatus.BAD_INPUT
    if any(r.verdict is Verdict.FAILED for r in results) or any(
        r.verdict is Verdict.ERROR and r.error_kind is ErrorKind.CRASH for r in results
    ):
        return ExitStatus.NONCONFORMANCE
    if any(r.verdict is Verdict.ERROR for r in results):
        return ExitStatus.NOT_EXERCISED
    return ExitStatus.CONFORM
