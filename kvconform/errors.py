"""Every error kvconform raises on purpose, in one place.

kvconform separates three kinds of trouble, because each one means something
different to whoever reads a red run and each maps to its own exit status
(:class:`ExitStatus`, the command-line contract in ``docs/cli.md``):

* :class:`ScenarioError` -- the *input* is wrong: malformed YAML, an unknown
  group type or method, a step that no scheduler could produce, a pool too small
  for the trajectory. It always names the file, the line and the field, so the
  message alone is enough to fix the file. Exit status 2.
* :class:`VllmUnavailable` -- the installed (or selected) vLLM cannot be
  exercised: it does not import, or it lacks an API kvconform needs. The message
  names the vLLM version and the missing name. Exit status 3. Its subclass
  :class:`NotOffered` is narrower: the release does not offer what one scenario
  needs (a spec type, a method, a runner or scheduler option), so the scenario
  does not apply there; it is reported ``unsupported`` and leaves the status alone.
* :class:`UsageError` -- the command line itself is wrong. Exit status 2.

Anything else that escapes is a bug, in kvconform or in vLLM, and is reported
with its traceback.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class ExitStatus(enum.IntEnum):
    """Every exit status a kvconform command ends with; each exit goes through one."""

    CONFORM = 0  # every selected scenario conforms (or diverges as expected)
    NONCONFORMANCE = 1  # a check failed, or vLLM raised on a scenario it claims to support
    BAD_INPUT = 2  # a scenario or expectations file is malformed, or the command line is
    NOT_EXERCISED = 3  # vLLM could not be exercised: import failure, unsupported API
    NO_SELECTION = 5  # the selection matched no scenario (as pytest's exit 5)
    INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class KvconformError(Exception):
    """Base class: an error whose message is meant for the user as it is."""

    exit_status: ExitStatus = ExitStatus.BAD_INPUT


@dataclass(frozen=True)
class Location:
    """Where in a scenario file something was written."""

    file: str
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.field}" if self.field else where

    def at(self, field: str, line: int | None = None) -> Location:
        """The location of a sub-field, keeping the line when none is known."""
        return Location(self.file, line if line is not None else self.line, field)


class ScenarioError(KvconformError):
    """A scenario file is malformed or describes an impossible trajectory."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, where: Location, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


class FileErrors(ScenarioError):
    """Every problem found in one scenario file, in the order of their lines.

    Its own location and message are the first problem's; ``errors`` has them all,
    and callers that collect input errors (:func:`kvconform.harness.loader.load_paths`)
    take the list.
    """

    def __init__(self, errors: Sequence[ScenarioError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.where, first.message)
        self.args = ("\n".join(str(e) for e in self.errors),)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was most probably meant as (a typo's fix), or None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


class PoolExhausted(ScenarioError):
    """The scenario's block pool cannot serve a step (the scenario is too big)."""


class VllmUnavailable(KvconformError):
    """The selected vLLM cannot be exercised (import failure, missing API)."""

    exit_status = ExitStatus.NOT_EXERCISED

    def __init__(self, version: str, missing: str, detail: str = "") -> None:
        self.version = version
        self.missing = missing
        self.detail = detail
        text = f"vLLM {version} lacks {missing}"
        super().__init__(f"{text}: {detail}" if detail else text)


class ScenarioSkipped(KvconformError):
    """The scenario cannot run in this environment (engine mode without CUDA): skipped, with why."""


class NotOffered(VllmUnavailable):
    """The selected vLLM does not offer what a scenario needs: a KV spec type or one of
    its fields, a speculative method, a model runner or a scheduler option.

    Only the compatibility layer raises it, where it knows the difference is the
    release's (a name it lacks, a setting it refuses), not kvconform failing to drive
    it. The scenario's verdict is ``unsupported``; an API kvconform itself needs stays
    a plain :class:`VllmUnavailable`.
    """


class EngineRanOtherwise(VllmUnavailable):
    """vLLM's engine ran with something other than what the scenario states.

    Raised by the engine driver (``kvconform.harness.drivers.engine``). An error
    (``unsupported``: this release, on this platform, does not run the
    scenario as written), never a verdict on a configuration the scenario does not
    describe.
    """

    def __init__(self, version: str, differences: Sequence[str]) -> None:
        self.differences = tuple(differences)
        super().__init__(version, "an engine running what the scenario states",
                         "; ".join(self.differences))  # fmt: skip

    def __str__(self) -> str:
        return (
            f"vLLM {self.version}'s engine did not run what the scenario states: "
            + "; ".join(self.differences)
        )


class UsageError(KvconformError):
    """The command line is wrong."""

    exit_status = ExitStatus.BAD_INPUT


class RecordingFormatError(KvconformError):
    """A recording this kvconform cannot read (kvconform.model.recording): another
    version of the format, or not a recording at all."""


# -- raised and caught inside kvconform --------------------------------------------------
# Each is raised by one part and caught by the part that called it (the docstring says
# which); the user sees what the catcher makes of it, never the class itself. They live
# here, at the bottom of the layers, so that every layer can raise or catch them.


class Abandoned(Exception):
    """A part of a scenario document not read further because a part it needs has a
    recorded problem (the loader, ``kvconform.harness.loader.fields``)."""


class OverBudget(ScenarioError):
    """A document asks for more than a limit of the loader's budget allows
    (``kvconform.harness.loader.budget.Limits``)."""


class CheckSkipped(Exception):
    """Raised by a check that could not run; the reason is reported, never a pass
    (``kvconform.harness.checks``)."""


class ExpectationsUpdateError(KvconformError):
    """The expectations file cannot be rewritten as asked (``--update-expectations``)."""


class GeneratorBug(Exception):
    """The fuzzer's strategies drew a document the loader or driver refuses: a kvconform
    bug (``kvconform.fuzz.runner``)."""


class BisectAborted(KvconformError):
    """A probe of a release bisection aborted (bad input, kvconform failing): every probe
    would (``kvconform.bisect.releases_mode``)."""

    exit_status = ExitStatus.BAD_INPUT


class DeadlinePassed(BaseException):
    """A search round's time budget is spent (``kvconform.fuzz.search``): raised through
    Hypothesis, which lets a ``BaseException`` through as it lets an interrupt, to end
    the round."""


class KeptAsMet(BaseException):  # noqa: N818 - a signal to the round, as DeadlinePassed
    """A search round met a signature it records as first met, without shrinking (a
    triaged finding): raised through Hypothesis, as :class:`DeadlinePassed`, to end the
    round at that example."""


class PatchFailed(Exception):
    """A real bug's patch does not apply to its release's tree: the catalogue is wrong
    (``kvconform.realbugs.trees``)."""


class ScenarioFailed(Exception):
    """A scenario collected as a pytest item did not conform (``kvconform.fronts.pytest_plugin``
    raises it in ``runtest`` and reads ``result`` back in ``repr_failure``).

    ``result`` is the scenario's ``ScenarioResult``, typed ``Any`` because this module
    imports nothing of kvconform's (it is below every layer).
    """

    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__(result.headline())


# -- the oracles' own signals (kvconform.oracles) -------------------------------------------
# Not the user's errors: each is caught by the code that drives the oracle (a refusal becomes a
# capacity record, an engine failure a crash finding, a mutant that cannot be swapped or found
# a campaign's note), so none has an exit status of its own.


class RefusedCall(Protocol):
    """What a refusal names of the call vLLM refused (a ``kvconform.model.scenario.Call``)."""

    @property
    def request(self) -> str: ...

    @property
    def label(self) -> str: ...


class StepDenied(Exception):
    """vLLM refused a call whose blocks the floor's arithmetic fits in the pool."""

    def __init__(
        self, call: RefusedCall, who: str, need: int, available: int, free: int, detail: str
    ) -> None:
        super().__init__(f"{who} refused {call.label} of {call.request!r}")
        self.call, self.who, self.need = call, who, need
        self.available, self.free, self.detail = available, free, detail


class EngineFailed(RuntimeError):
    """vLLM's engine raised or died on a valid scenario: a finding, reported as a crash."""


class SwapImpossible(Exception):
    """The mutated code cannot replace the function's code in place."""


class TargetMissing(Exception):
    """The vLLM in use has no such module or function (reported, not fatal)."""
