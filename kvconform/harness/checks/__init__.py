"""The checks: one module each, registered here in reporting order.

Each module (``lookahead``, ``floor``, ``ceiling``, ``capacity``, ``startup``, ``agree``,
``sanity``, ``slots``) holds a check's judgement and its
:class:`~kvconform.model.checks.Check` record; this package assembles the
registry :data:`CHECKS`, reads ``--checks`` values and judges a recorded
trajectory with the selected checks. The contract they
enforce is scenarios/README.md's; what each judges is its module's docstring.

A check that cannot run raises :class:`~kvconform.errors.CheckSkipped`;
:func:`judge` reports it as skipped with the reason, never as passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvconform.errors import CheckSkipped
from kvconform.harness.checks import (
    agree,
    capacity,
    ceiling,
    floor,
    lookahead,
    sanity,
    slots,
    startup,
)
from kvconform.harness.checks.records import PARTY_NAMES, indexed_facts
from kvconform.model.checks import Check
from kvconform.model.observations import Trajectory
from kvconform.model.results import Failure

__all__ = [
    "CHECKS",
    "DEFAULT_CHECKS",
    "PARTY_NAMES",
    "CheckSkipped",
    "Judgement",
    "judge",
    "parse_checks",
    "run_checks",
]

# In reporting order: a wrong lookahead is the cause of the floor failures it brings,
# so it is reported first.
CHECKS: Mapping[str, Check] = MappingProxyType(
    {
        module.CHECK.name: module.CHECK
        for module in (lookahead, floor, ceiling, capacity, startup, agree, sanity, slots)
    }
)
# What a plain run checks. `slots` runs vLLM's kernel (under Triton's interpreter
# on a machine without CUDA) and is chosen with --checks (all, or default,slots).
DEFAULT_CHECKS = tuple(name for name, check in CHECKS.items() if check.default)


def parse_checks(text: str | None) -> tuple[str, ...]:
    """A ``--checks`` value: names, ``default`` (the default checks) and ``all``.

    Raises ``ValueError`` naming the first unknown check.
    """
    if not text:
        return DEFAULT_CHECKS
    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        expanded = {"all": tuple(CHECKS), "default": DEFAULT_CHECKS}.get(item, (item,))
        for name in expanded:
            if name not in CHECKS:
                raise ValueError(
                    f"unknown check {name!r}; known: {', '.join(CHECKS)}, all, default"
                )
            if name not in names:
                names.append(name)
    return tuple(name for name in CHECKS if name in names)  # always in reporting order


@dataclass
class Judgement:
    failures: list[Failure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not run


def judge(trajectory: Trajectory, names: tuple[str, ...] = DEFAULT_CHECKS) -> Judgement:
    """Run the named checks; a check that raises ``CheckSkipped`` is skipped, not passed."""
    judgement = Judgement()
    with indexed_facts(trajectory):
        for name in names:
            try:
                found = list(CHECKS[name].find(trajectory))
            except CheckSkipped as exc:
                judgement.skipped[name] = str(exc)
                continue
            judgement.failures.extend(found)
    return judgement


def run_checks(trajectory: Trajectory, names: tuple[str, ...] = DEFAULT_CHECKS) -> list[Failure]:
    return judge(trajectory, names).failures
