"""A check, as a registry record: what it judges, whom it blames, how the fuzzer names it.

A check reads a recorded :class:`~kvconform.model.observations.Trajectory` and
yields :class:`~kvconform.model.results.Failure` records; it never calls vLLM,
so checks can be selected, re-run and tested on recorded trajectories alone.
Everything else kvconform knows about a check lives in its :class:`Check`
record, next to the judgement itself (one module per check under
:mod:`kvconform.harness.checks`):

* ``blame``: a :class:`~kvconform.model.root_causes.Blame`: the party a record is
  blamed on, the *miss* (the shape of what went wrong), and whether the record is a
  shortfall (the cause) or a consequence of one party's shortfall at the same step
  (a write outside the blocks, a disagreement); the root causes
  (:mod:`kvconform.harness.root_causes`) fold and gather records by these;
* ``signature``: what makes two of its failures the same finding for the
  fuzzer (:mod:`kvconform.fuzz.findings`);
* ``why``: the contract's reason, said once per root cause;
* ``default``: whether a plain run selects it, and ``record``: a party of its
  own that the runner runs before it, only when it is selected (``slots``:
  vLLM's slot-mapping kernel).

Adding a check is one module with its judgement and its record; nothing else
branches on a check's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvconform.model.observations import Trajectory
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame

if TYPE_CHECKING:
    from kvconform.model.root_causes import RootCause


@dataclass(frozen=True)
class Check:
    name: str
    # One line: what the check judges (the CLI's help, docs/cli.md, the reports).
    judges: str
    find: Callable[[Trajectory], Iterable[Failure]]
    # (result, failure) -> whom it is blamed on, the miss, cause or consequence.
    blame: Callable[[ScenarioResult, Failure], Blame]
    # (result, failure) -> (subject, detail) of the fuzzer's signature.
    signature: Callable[[ScenarioResult, Failure], tuple[str, str]]
    # The contract's reason behind a root cause of this check.
    why: Callable[[RootCause], str]
    default: bool = True
    # A party that records what this check judges, run after the driver only when the
    # check is selected: (trajectory, the loaded vLLM) -> anything.
    record: Callable[[Trajectory, Any], object] | None = None


def always(text: str) -> Callable[[RootCause], str]:
    """A ``why`` that says the same for every root cause of the check."""
    return lambda cause: text
