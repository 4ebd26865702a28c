"""Verdicts and failures: what a scenario run concluded.

A :class:`Failure` is one violated check at one step, request and group, with
every number a reader needs (live, predicted, warmup, floor) and a message that
says who held how many blocks, how many the floor required, and why.
A :class:`ScenarioResult` is one scenario's verdict:

* ``passed`` -- every check held;
* ``failed`` -- a check failed (nonconformance);
* ``error`` -- the scenario or vLLM could not be run; ``error_kind`` says which:
  ``input`` (the scenario is wrong), ``unsupported`` (this vLLM lacks an API
  kvconform needs to drive it) or ``crash`` (vLLM raised on a valid scenario);
* ``unsupported`` -- the scenario does not apply to this release: it needs a
  spec type, method, runner or scheduler option the release does not offer, or
  none of the selected checks can run on it; ``error`` says why. Counted apart,
  and it does not change the exit status;
* ``xfailed`` / ``xpassed`` -- the scenario is listed in the expectations file
  as a known divergence, and it diverged / no longer diverges;
* ``skipped`` -- the scenario cannot run in this environment (an engine
  scenario without CUDA); ``skip_reason`` says why. It neither passes nor
  fails, and leaves the exit status alone.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvconform.errors import ScenarioError
from kvconform.model.kinds import Kind
from kvconform.model.observations import Trajectory
from kvconform.model.settings import SettingsRecord

if TYPE_CHECKING:
    from kvconform.model.coverage import Coverage
    from kvconform.model.root_causes import RootCause
    from kvconform.model.vllm_code import VllmCodeCoverage


class Verdict(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    XFAILED = "xfailed"
    XPASSED = "xpassed"
    SKIPPED = "skipped"
    UNSUPPORTED = "unsupported"


class ErrorKind(str, enum.Enum):
    INPUT = "input"
    UNSUPPORTED = "unsupported"
    CRASH = "crash"  # vLLM raised on a valid scenario: a finding
    # kvconform's own code (an oracle, a driver, a check's party) raised with no vLLM
    # frame inside it: an error of kvconform, not a finding; vLLM was not exercised.
    INTERNAL = "internal"


@dataclass(frozen=True)
class Failure:
    check: str
    message: str
    step: int | None = None
    line: int | None = None
    request: str | None = None
    group: int | None = None
    spec_type: str | None = None
    live: int | None = None
    predicted: int | None = None
    warmup: int | None = None
    floor: int | None = None
    action: str | None = None
    # The party whose holding this record is about (live, predicted, warmup), and
    # what the floor was made of: its lookahead, the floor the same step would have
    # without it, whether max_model_len capped it, the decode-context-parallel
    # factor of a column. The root-cause groups read the shape of a miss from these.
    party: str | None = None
    lookahead: int | None = None
    floor_without_lookahead: int | None = None
    capped: bool = False
    dcp: int = 1
    # The step's token counts, the position past the last one written
    # (min(computed + scheduled + lookahead, max_model_len)) and the tokens one block-table
    # column covers (block_size x dcp; None where the group's floor does not count token
    # columns): how many written positions a short party leaves without a block.
    computed: int | None = None
    scheduled: int | None = None
    written_end: int | None = None
    block_tokens: int | None = None
    # Check-specific facts in structured form (slots: positions, columns, blocks hit).
    detail: dict[str, Any] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "step": self.step,
            "line": self.line,
            "request": self.request,
            "group": self.group,
            "spec_type": self.spec_type,
            "action": self.action,
            "live": self.live,
            "predicted": self.predicted,
            "warmup": self.warmup,
            "floor": self.floor,
            "party": self.party,
            "lookahead": self.lookahead,
            "floor_without_lookahead": self.floor_without_lookahead,
            "capped": self.capped,
            "dcp": self.dcp,
            "computed": self.computed,
            "scheduled": self.scheduled,
            "written_end": self.written_end,
            "block_tokens": self.block_tokens,
            "message": self.message,
            "detail": self.detail,
        }


@dataclass
class ScenarioResult:
    id: str
    file: str
    verdict: Verdict
    kind: str = Kind.TRAJECTORY
    tags: tuple[str, ...] = ()
    failures: list[Failure] = field(default_factory=list)
    error: str | None = None
    error_kind: ErrorKind | None = None
    # The input error is the pool running dry (PoolExhausted): the fuzzer
    # discards such examples instead of reporting them.
    pool_exhausted: bool = False
    expectation: str | None = None
    duration: float = 0.0
    trajectory: Trajectory | None = None
    line: int | None = None
    description: str = ""
    # Where the expectations entry that made this xfailed/xpassed points to.
    expectation_evidence: str | None = None
    # Selected checks that could not run, with why: skipped, never passed.
    skipped_checks: dict[str, str] = field(default_factory=dict)
    skip_reason: str | None = None
    # The settings the scenario ran with, and which differ from vLLM's defaults.
    settings: SettingsRecord | None = None

    @property
    def ok(self) -> bool:
        return self.verdict in (Verdict.PASSED, Verdict.XFAILED, Verdict.XPASSED, Verdict.SKIPPED)

    def headline(self) -> str:
        if self.skip_reason:
            return f"skipped: {self.skip_reason}"
        if self.error:
            return self.error
        if self.failures:
            more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            return self.failures[0].message + more
        return ""


@dataclass
class RunReport:
    """One whole run: its results, the input errors, and where it ran."""

    results: list[ScenarioResult]
    input_errors: list[ScenarioError]
    vllm_version: str | None
    vllm_source: str | None
    vllm_path: str | None
    vllm_release: str | None = None
    vllm_error: str | None = None
    torch_version: str | None = None
    device: str | None = None
    started: float = 0.0
    duration: float = 0.0
    command: str = ""
    exit_status: int = 0
    checks: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    # What the run exercised and what the vLLM in use offers that it did not.
    coverage: Coverage | None = None
    expectations_file: str | None = None
    # Seconds per phase of the run (select, load_vllm, scenarios, coverage).
    phases: dict[str, float] = field(default_factory=dict)
    # The failure records gathered by root cause, upstream causes first (harness.root_causes).
    root_causes: list[RootCause] = field(default_factory=list)
    # What a rerun of one scenario repeats besides the vLLM: --checks, --expectations.
    rerun_options: tuple[str, ...] = ()
    # "I/N" when the run was one shard of a CI job's parallel steps.
    shard: str | None = None
    # Which of vLLM's reservation code the run executed (kvconform coverage --vllm-code).
    vllm_coverage: VllmCodeCoverage | None = None

    def counts(self) -> dict[str, int]:
        counts = {verdict.value: 0 for verdict in Verdict}
        for result in self.results:
            counts[result.verdict.value] += 1
        counts["input errors"] = len(self.input_errors)
        return counts

    def rerun_command(self, result: ScenarioResult) -> str:
        """The command that runs one of this run's scenarios alone, as this run did."""
        return rerun_command(
            result,
            vllm_source=self.vllm_source,
            vllm_path=self.vllm_path,
            vllm_release=self.vllm_release,
            options=self.rerun_options,
        )

    def explain_command(self, file: str, scenario_id: str) -> str:
        """The command that shows one scenario step by step, against the same vLLM:
        ``kvconform explain FILE::ID``, exact wherever the file is."""
        options = vllm_options(self.vllm_source, self.vllm_path, self.vllm_release)
        return shlex.join(["kvconform", "explain", f"{file}::{scenario_id}", *options])


def vllm_options(
    vllm_source: str | None, vllm_path: str | None, vllm_release: str | None
) -> list[str]:
    """``--vllm-release VER`` or ``--vllm-src DIR`` for the vLLM a run used; none if installed."""
    if vllm_release:
        return ["--vllm-release", vllm_release]
    if vllm_source == "src" and vllm_path:
        return ["--vllm-src", vllm_path.removesuffix("/vllm")]
    return []


def rerun_command(
    result: ScenarioResult,
    *,
    vllm_source: str | None,
    vllm_path: str | None,
    vllm_release: str | None,
    options: tuple[str, ...] = (),
) -> str:
    """``kvconform run FILE::ID`` against the same vLLM, with the run's ``options``.

    The scenario is named exactly (``FILE::ID``, not ``-k``, whose substring would
    also pick a matrix case's neighbours); ``vllm_path`` is the ``vllm`` package's
    folder, as :attr:`RunReport.vllm_path` records it.
    """
    parts = ["kvconform", "run", f"{result.file}::{result.id}"]
    parts += vllm_options(vllm_source, vllm_path, vllm_release)
    return shlex.join([*parts, *options])
