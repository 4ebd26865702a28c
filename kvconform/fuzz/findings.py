"""What makes two failing examples "the same finding".

The fuzzer reports one shrunk reproducer per *signature*, and goes on looking
for failures with a signature it has not reported yet. A signature is coarse on
purpose, so that one root cause seen in a thousand examples is one finding,
while a failure of another party or another code path is another:

* ``floor``, live allocator (or recorded warmup) below the floor: (floor, party,
  spec class) -- each spec class has its own allocator manager in vLLM;
* ``floor``, predictor below the floor: (floor, predicted, floor family) --
  the predictor is one function whose branches follow the floor table's rules,
  so a predictor bug shows once per rule, not once per spec class;
* ``agree``: (agree, floor family, which side holds more);
* ``sanity``: (sanity, spec class, invariant) where the failure names its invariant
  (``detail["invariant"]``), else (sanity, spec class); "-" for the spec class of a
  failure that concerns no group (a leak over the whole pool);
* ``lookahead``: (lookahead, method);
* ``capacity``: (capacity, the vLLM function that refused, the stall's cause where the
  scheduler oracle names one: ``STALL_CAUSES`` in :mod:`kvconform.model.observations`);
* a crash of vLLM on a legal scenario: (crash, exception type, vLLM frame), the frame
  as ``file:line function``, a comprehension's named for the function holding it on
  any Python (:func:`kvconform.harness.runner.describe_crash`).

The *floor family* of a group is the family of its floor rule
(``FloorRule.family``: "token-indexed" for every type whose floor counts token
columns, "mamba-state", "mamba-align", "encoder", "ring"). Each check's record
computes its part of the signature (``Check.signature``). The price of coarseness: a
second, independent bug with the same signature as a reported one stays hidden
until the first is fixed; the summary says so.

While a finding is shrunk, an example counts as reproducing it when *any* of
its failures has the finding's signature; the others may come and go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvconform.harness.checks import CHECKS
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict


@dataclass(frozen=True, order=True)
class Signature:
    check: str
    subject: str  # party, floor family, method, spec class or exception type
    detail: str = ""  # spec class, floor family, which side holds more, vLLM frame

    def __str__(self) -> str:
        return " / ".join(part for part in (self.check, self.subject, self.detail) if part)

    @property
    def slug(self) -> str:
        """A file-name-friendly form."""
        text = "-".join(part for part in (self.check, self.subject, self.detail) if part)
        return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60]


_CRASH = re.compile(r"raised (?P<type>[\w.]+)(?::.*?)?(?: at (?P<where>\S+:\d+) in (?P<fn>\S+))?$")


def signatures(result: ScenarioResult) -> list[Signature]:
    """The distinct signatures of a result's failures, in the order they occur."""
    return list(dict.fromkeys(signature for signature, _ in signed_failures(result)))


def first_message(result: ScenarioResult, signature: Signature) -> str:
    """The message of the first failure with ``signature`` (the crash, for a crash)."""
    for candidate, message in signed_failures(result):
        if candidate == signature:
            return message
    return result.headline()


def signed_failures(result: ScenarioResult) -> list[tuple[Signature, str]]:
    """Each failure of a result (a crash first) with its signature and message.

    A check's part of the signature is its record's (``Check.signature``).
    """
    signed: list[tuple[Signature, str]] = []
    if result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH:
        error = result.error or "?"
        match = _CRASH.search(error)
        if match:
            where = f"{match['where']} {match['fn']}" if match["where"] else ""
            signed.append((Signature("crash", match["type"], where), error))
        else:
            signed.append((Signature("crash", error[:60]), error))
    for failure in result.failures:
        subject, detail = CHECKS[failure.check].signature(result, failure)
        signed.append((Signature(failure.check, subject, detail), failure.message))
    return signed
