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
* ``sanity``: (sanity, spec class), or (sanity, "-") for a failure that concerns
  no group (a leak over the whole pool);
* ``lookahead``: (lookahead, method);
* a crash of vLLM on a legal scenario: (crash, exception type, vLLM frame).

The *floor family* of a group is the rule of kvconform's floor table it falls
under: "token-indexed" for every type whose floor counts token columns, else
the type itself (Mamba split by ``align`` mode). The price of coarseness: a
second, independent bug with the same signature as a reported one stays hidden
until the first is fixed; the summary says so.

While a finding is shrunk, an example counts as reproducing it when *any* of
its failures has the finding's signature; the others may come and go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvconform.harness.checks import PARTY_NAMES
from kvconform.model.floors import FLOORS, token_columns
from kvconform.model.observations import GroupInfo
from kvconform.model.results import ErrorKind, Failure, ScenarioResult, Verdict


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
    """Each failure of a result (a crash first) with its signature and message."""
    signed: list[tuple[Signature, str]] = []
    if result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH:
        error = result.error or "?"
        match = _CRASH.search(error)
        if match:
            where = f"{match['where']} {match['fn']}" if match["where"] else ""
            signed.append((Signature("crash", match["type"], where), error))
        else:
            signed.append((Signature("crash", error[:60]), error))
    groups = result.trajectory.groups if result.trajectory is not None else ()
    for failure in result.failures:
        group = groups[failure.group] if failure.group is not None else None
        if failure.check == "lookahead":
            signature = Signature("lookahead", _method_of(failure.message))
        elif failure.check == "floor":
            party = _party_of(failure.message)
            subject = floor_family(group) if party == "predicted" else failure.spec_type
            signature = Signature("floor", party, subject or "-")
        elif failure.check == "agree":
            signature = Signature("agree", floor_family(group), _side(result, failure))
        else:
            signature = Signature(failure.check, failure.spec_type or "-")
        signed.append((signature, failure.message))
    return signed


def _side(result: ScenarioResult, failure: Failure) -> str:
    """Whether the live allocator holds more or less than the predictor's running maximum."""
    reference = failure.predicted
    if result.trajectory is not None:
        for obs in result.trajectory.observations:
            if (obs.step, obs.request, obs.group) == (failure.step, failure.request, failure.group):
                reference = obs.predicted_max
                break
    return "live above" if (failure.live or 0) > (reference or 0) else "live below"


def floor_family(group: GroupInfo | None) -> str:
    """The floor-table rule a group falls under (see the module docstring)."""
    if group is None:
        return "-"
    if FLOORS[group.type].blocks is token_columns:
        return "token-indexed"
    if group.type == "mamba" and group.floor_args.get("mamba_cache_mode") == "align":
        return "mamba-align"
    return group.type


def _party_of(message: str) -> str:
    # The floor check names the party below the floor right after the group.
    for party, name in PARTY_NAMES.items():
        if f": {name} holds" in message:
            return party
    return "?"


def _method_of(message: str) -> str:
    match = re.search(r"method '([^']+)'", message)
    return match[1] if match else "?"
