"""When a mutant counts as killed: its run's outcome differs from the clean run's.

A scenario's *outcome* is what a suite run shows for it: the verdict after the
expectations file is applied (passed, failed, error, xfailed, xpassed), the
kind of error, and the failed checks with the step, request and group each
failed at. A mutant is killed by a scenario whose outcome under the mutant
differs from its clean outcome -- a passing scenario that fails or crashes, a
known divergence that stops diverging (``xpassed``) or fails elsewhere. The
numbers inside a failure (how many blocks) are not compared: a report that
names the same failures at the same places reads the same to its user.

A mutant whose every reached scenario *crashes* (vLLM raises) is
``incompetent``, not killed: it breaks vLLM so thoroughly that it says nothing
about the suite's checks (a mutant that makes ``allocate_slots`` raise
``TypeError`` on every call). One that crashes some scenarios and runs others
is killed by the crashing ones, as a user's suite would show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario

FailureKey = tuple[str, "int | None", "str | None", "int | None"]


@dataclass(frozen=True)
class Outcome:
    verdict: str
    error_kind: str | None
    failures: frozenset[FailureKey]
    message: str = ""

    @property
    def crashed(self) -> bool:
        return self.verdict == Verdict.ERROR.value and self.error_kind == ErrorKind.CRASH.value

    def same_as(self, other: Outcome) -> bool:
        return (self.verdict, self.error_kind, self.failures) == (
            other.verdict,
            other.error_kind,
            other.failures,
        )


def outcome_of(result: ScenarioResult) -> Outcome:
    failures = frozenset((f.check, f.step, f.request, f.group) for f in result.failures)
    return Outcome(
        result.verdict.value,
        result.error_kind.value if result.error_kind else None,
        failures,
        result.headline()[:300],
    )


def difference(clean: Outcome, mutant: Outcome) -> dict[str, Any]:
    """What the mutant changed in one scenario's outcome, for the report."""
    new = sorted(mutant.failures - clean.failures, key=str)
    checks = sorted({key[0] for key in new})
    if mutant.crashed and not clean.crashed:
        checks = ["crash"]
    elif not checks and mutant.verdict != clean.verdict:
        checks = [f"verdict {clean.verdict} -> {mutant.verdict}"]
    elif not checks:
        checks = sorted({key[0] for key in clean.failures - mutant.failures}) or ["verdict"]
    return {
        "verdict": f"{clean.verdict} -> {mutant.verdict}",
        "checks": checks,
        "message": mutant.message,
    }


def judge_mutant(
    scenarios: Sequence[Scenario],
    run: Callable[[Scenario], Outcome],
    clean: dict[str, Outcome],
) -> dict[str, Any]:
    """Run ``scenarios`` in order until one's outcome differs (crashes do not stop it)."""
    crashes: list[dict[str, Any]] = []
    ran = 0
    for scenario in scenarios:
        ran += 1
        outcome = run(scenario)
        before = clean[scenario.id]
        if outcome.same_as(before):
            continue
        entry = {"scenario": scenario.id, **difference(before, outcome)}
        if outcome.crashed and not before.crashed:
            crashes.append(entry)
            continue
        return {"verdict": "killed", "killed_by": [entry, *crashes[:2]], "scenarios_run": ran}
    if crashes and len(crashes) == ran:
        return {
            "verdict": "incompetent",
            "note": f"crashes every scenario that reaches it: {crashes[0]['message']}",
            "scenarios_run": ran,
        }
    if crashes:
        return {"verdict": "killed", "killed_by": crashes[:3], "scenarios_run": ran}
    return {"verdict": "survived", "scenarios_run": ran}
