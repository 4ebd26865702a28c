"""The session: one selection of scenarios, run against one vLLM, into one :class:`RunReport`.

Every front goes through here, so that ``kvconform run``, ``kvconform check``,
``kvconform coverage`` and ``pytest scenarios/`` agree on every policy:

* which vLLM: :func:`load_vllm` (the installed package, ``--vllm-src DIR`` or
  ``--vllm-release VER``), prepared for the slot-mapping kernel when the
  ``slots`` check is selected, and loaded once per process;
* which scenarios: the files and folders named (default ``scenarios/``), or one
  scenario as ``FILE::ID``, filtered by a ``-k`` expression and a shard
  (:mod:`kvconform.harness.select`); a file that does not load is an input
  error and the other files still run; a selection that matches nothing ends
  the run with exit 5 before vLLM is imported;
* which known divergences: an explicit expectations file, none, or for each
  scenario the nearest ``expectations.yaml`` above its file (the search stops at
  the repository's root), each file read once;
* which speculative methods kvconform knows: the built-in registry plus, for each
  scenario, the nearest ``methods.yaml`` above its file
  (:func:`kvconform.harness.methods_file.use_methods_for`, the one place the
  registry is extended);
* the verdict of each scenario (:func:`kvconform.harness.runner.run_scenario`,
  expectations applied), and of the run: its exit status, coverage and notes.

A front only parses its own arguments into a :class:`RunRequest`, shows what the
session tells it, and writes the reports.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvconform.errors import ExitStatus, ScenarioError, UsageError, VllmUnavailable
from kvconform.harness import runner
from kvconform.harness.checks import DEFAULT_CHECKS, parse_checks
from kvconform.harness.coverage import compute_coverage, offered_by, pair_results
from kvconform.harness.expectations import (
    DEFAULT_SCENARIOS,
    Expectation,
    find_expectations,
    load_expectations,
)
from kvconform.harness.methods_file import methods_in, use_methods_for
from kvconform.harness.root_causes import find_root_causes
from kvconform.harness.select import Selection, Shard, select_scenarios
from kvconform.model.coverage import Coverage
from kvconform.model.kinds import entry
from kvconform.model.recording import Recording, dumps
from kvconform.model.results import RunReport, ScenarioResult, rerun_command
from kvconform.model.scenario import Scenario
from kvconform.model.wording import count, shorten
from kvconform.oracles import vllm as vllm_loader
from kvconform.oracles.vllm import Vllm

__all__ = [
    "RunRequest",
    "Selection",
    "Session",
    "checks_from",
    "load_vllm",
    "skip_line",
    "skipped_notes",
    "vllm_to_load",
]

# One loaded vLLM per process and source: the CLI loads one; a pytest process
# (each xdist worker) loads it on its first item and keeps it.
_LOADED: dict[tuple[str | None, str | None], Vllm] = {}
# Seconds each load took in this process (the pytest items report them).
LOAD_SECONDS: list[float] = []


def load_vllm(src: str | None = None, release: str | None = None) -> Vllm:
    """The vLLM a run selects (the installed one, a tree, or a PyPI release's tree)."""
    key = (src, release)
    if key not in _LOADED:
        started = time.perf_counter()
        if release:
            from kvconform.harness.releases import release_tree

            loaded = vllm_loader.load(src=release_tree(release), release=release)
        else:
            loaded = vllm_loader.load(src=src)
        _LOADED[key] = loaded
        LOAD_SECONDS.append(time.perf_counter() - started)
    return _LOADED[key]


def vllm_to_load(src: str | None = None, release: str | None = None) -> str:
    """Which vLLM a run is about to load, said without importing it (the first line)."""
    if release:
        return f"vLLM {release} (PyPI release's Python tree)"
    if src:
        return f"vLLM {vllm_loader.tree_version(src) or '(version unknown)'} (Python tree at {src})"
    return f"vLLM {vllm_loader.installed_version() or '(not installed)'} (installed)"


def checks_from(text: str | None, option: str = "--checks") -> tuple[str, ...]:
    """The checks a ``--checks`` value names; a wrong name is a usage error."""
    try:
        return parse_checks(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


@dataclass(frozen=True)
class RunRequest:
    """What a front asks the session to run (its command line, parsed)."""

    paths: tuple[str, ...] = ()
    expression: str | None = None
    checks: tuple[str, ...] = DEFAULT_CHECKS
    vllm_src: str | None = None
    vllm_release: str | None = None
    expectations: str | None = None  # an explicit file; None: the nearest one
    no_expectations: bool = False
    command: str = ""
    shard: Shard | None = None
    # Stop after the first scenario that fails (pytest's -x): a probe that only needs
    # to know whether anything turns red (kvconform realbugs) stops there.
    exitfirst: bool = False
    # Write each scenario's recording here (kvconform.model.recording), for `judge`.
    record_dir: str | None = None

    @property
    def scenario_paths(self) -> tuple[str, ...]:
        return self.paths or (DEFAULT_SCENARIOS,)

    def rerun_options(self) -> tuple[str, ...]:
        """The options a rerun of one scenario must repeat to judge it the same way
        (the vLLM options come from the vLLM that actually ran)."""
        options: list[str] = []
        if self.checks and self.checks != DEFAULT_CHECKS:
            options += ["--checks", ",".join(self.checks)]
        if self.no_expectations:
            options.append("--no-expectations")
        elif self.expectations:
            options += ["--expectations", self.expectations]
        return tuple(options)


class Session:
    """One run: select, load vLLM, run each scenario, conclude."""

    def __init__(self, request: RunRequest) -> None:
        self.request = request
        self._expectation_files: dict[Path, list[Expectation]] = {}
        self.expectation_errors: list[ScenarioError] = []
        self.methods_errors: list[ScenarioError] = []
        self.methods_files: dict[Path, None] = {}
        self._vllm: Vllm | None = None
        self._recorded = 0

    # -- speculative methods --------------------------------------------------------------

    def use_methods(self, scenario_file: str | Path | None = None) -> Path | None:
        """Make the method registry the built-in one plus the methods file that applies
        to a scenario file (or to the run's paths); a file that does not load is an
        input error of the run (reported once) and adds nothing."""
        start = [str(scenario_file)] if scenario_file else list(self.request.scenario_paths)
        path, error = use_methods_for(start)
        if path is not None:
            self.methods_files.setdefault(path)
        if error is not None and str(error) not in map(str, self.methods_errors):
            self.methods_errors.append(error)
        return path

    # -- selection ------------------------------------------------------------------------

    def select(self) -> Selection:
        """The scenarios the request's paths, ``-k`` expression and shard select."""
        request = self.request
        self.use_methods()  # before loading: the loader reads the registry (draft shapes)
        return select_scenarios(request.scenario_paths, request.expression, request.shard)

    # -- known divergences ----------------------------------------------------------------

    def expectations_file(self, scenario_file: str | Path | None = None) -> Path | None:
        """The expectations file that applies to a scenario file (or to the run's paths)."""
        if self.request.no_expectations:
            return None
        if self.request.expectations:
            return Path(self.request.expectations)
        start = [str(scenario_file)] if scenario_file else list(self.request.scenario_paths)
        return find_expectations(start)

    def expectations_for(self, scenario_file: str | Path | None = None) -> list[Expectation]:
        """The known divergences for a scenario file; a file that does not load is an
        input error of the run (reported once) and excuses nothing."""
        path = self.expectations_file(scenario_file)
        if path is None:
            return []
        key = path.resolve()
        if key not in self._expectation_files:
            try:
                self._expectation_files[key] = load_expectations(path)
            except ScenarioError as err:
                self.expectation_errors.append(err)
                self._expectation_files[key] = []
        return self._expectation_files[key]

    # -- running --------------------------------------------------------------------------

    @property
    def vllm(self) -> Vllm:
        if self._vllm is None:
            request = self.request
            self._vllm = load_vllm(request.vllm_src, request.vllm_release)
        return self._vllm

    def run_scenario(self, scenario: Scenario) -> ScenarioResult:
        """One scenario's verdict, its known divergences applied."""
        self.use_methods(scenario.file)
        return runner.run_scenario(
            scenario,
            self.vllm,
            self.request.checks,
            self.expectations_for(scenario.file),
            record=self._write_recording if self.request.record_dir else None,
        )

    def _write_recording(self, recording: Recording) -> None:
        """One scenario's recording as ``NNNN-ID.json`` in the record folder, numbered in
        the order the scenarios ran (``kvconform judge`` reads them in that order)."""
        assert self.request.record_dir is not None
        folder = Path(self.request.record_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self._recorded += 1
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", recording.scenario_id)[:80]
        (folder / f"{self._recorded:04d}-{name}.json").write_text(
            dumps(recording), encoding="utf-8"
        )

    def new_report(self, selection: Selection) -> RunReport:
        request = self.request
        # Read the run's expectations file now, so that a broken one is an input error
        # reported before anything runs.
        self.expectations_for()
        exp_path = self.expectations_file()
        notes = [self.methods_note(path) for path in self.methods_files]
        return RunReport(
            results=[],
            input_errors=[*selection.input_errors, *self.methods_errors, *self.expectation_errors],
            notes=notes,
            vllm_version=None,
            vllm_source=None,
            vllm_path=None,
            started=time.time(),
            command=request.command or shlex.join(["kvconform", *sys.argv[1:]]),
            checks=request.checks,
            expectations_file=str(exp_path) if exp_path is not None else None,
            rerun_options=request.rerun_options(),
            shard=str(request.shard) if request.shard is not None else None,
        )

    def rerun_command(self, result: ScenarioResult) -> str:
        """The command that reruns one scenario as this session ran it (the pytest
        front's hint; a :class:`RunReport` has its own, from what it recorded)."""
        source = self.vllm.source
        return rerun_command(
            result,
            vllm_source=source.kind,
            vllm_path=self.vllm.location,
            vllm_release=source.release,
            options=self.request.rerun_options(),
        )

    def run(
        self,
        selection: Selection,
        report: RunReport,
        *,
        on_loaded: Callable[[Vllm], None] | None = None,
        on_start: Callable[[Scenario], None] | None = None,
        on_result: Callable[[ScenarioResult], None] | None = None,
    ) -> RunReport:
        """Run the selection into ``report``: vLLM first, then every scenario, then the
        conclusions. A vLLM that cannot be loaded ends the run with its error. An
        empty selection ends it before vLLM is imported: exit 2 if files failed to
        load, 5 if nothing matched, 0 for a shard that drew none of a selection."""
        if not selection.scenarios:
            if selection.why_empty:
                report.notes.append(f"nothing selected: {selection.why_empty}")
            if report.input_errors:
                report.exit_status = ExitStatus.BAD_INPUT
            elif selection.nothing_matched:
                report.exit_status = ExitStatus.NO_SELECTION
            else:
                report.exit_status = ExitStatus.CONFORM
            return report
        phases = report.phases
        lap = time.perf_counter()
        try:
            vllm = self.vllm
        except VllmUnavailable as exc:
            report.vllm_error = str(exc)
            report.vllm_version = exc.version
            report.exit_status = (
                ExitStatus.BAD_INPUT if report.input_errors else ExitStatus.NOT_EXERCISED
            )
            return report
        report.vllm_version = vllm.version
        report.vllm_source = vllm.source.kind
        report.vllm_path = vllm.location
        report.vllm_release = vllm.source.release
        report.torch_version, report.device = vllm.runtime()
        phases["load_vllm"], lap = time.perf_counter() - lap, time.perf_counter()
        if on_loaded is not None:
            on_loaded(vllm)
        for scenario in selection.scenarios:
            if on_start is not None:
                on_start(scenario)
            result = self.run_scenario(scenario)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
            if self.request.exitfirst and runner.exit_status([result]) == (
                ExitStatus.NONCONFORMANCE
            ):
                report.notes.append(
                    f"stopped after the first failure (-x): {result.id}; "
                    f"{count(len(selection.scenarios) - len(report.results), 'scenario')} not run"
                )
                break
        phases["scenarios"], lap = time.perf_counter() - lap, time.perf_counter()
        self._report_late_methods(report)
        report.coverage = self.coverage(selection.scenarios, report.results, report.notes)
        phases["coverage"] = time.perf_counter() - lap
        if report.device == "cpu" and any(entry(r.kind).drives_warmup for r in report.results):
            from kvconform.oracles.warmup import CPU_RUN_NOTE

            report.notes.append(CPU_RUN_NOTE)
        report.notes.extend(skipped_notes(report.results))
        report.root_causes = find_root_causes(report.results)
        report.exit_status = runner.exit_status(report.results, len(report.input_errors))
        return report

    def methods_note(self, path: Path) -> str:
        try:
            entries = methods_in(path)
        except ScenarioError as error:
            return f"methods file {path} does not load ({error.message}): it adds nothing"
        added = ", ".join(f"{m.name} ({m.rule.formula})" for m in entries)
        return f"methods file {path}: {added or 'no entries'}, beside the built-in registry"

    def _report_late_methods(self, report: RunReport) -> None:
        """Methods files met only under a scenario (another tree than the run's paths)."""
        for error in self.methods_errors:
            if str(error) not in map(str, report.input_errors):
                report.input_errors.append(error)
        for path in self.methods_files:
            note = self.methods_note(path)
            if note not in report.notes:
                report.notes.append(note)

    def coverage(
        self, scenarios: list[Scenario], results: list[ScenarioResult], notes: list[str]
    ) -> Coverage:
        """What the run exercised, against what the vLLM in use offers."""
        try:
            offered = offered_by(self.vllm)
        except VllmUnavailable as exc:
            offered = None
            notes.append(f"coverage of what vLLM offers is missing: {exc}")
        return compute_coverage(pair_results(scenarios, results), offered)


# A skip line's length: its prose is shortened to fit (kvconform.model.wording.shorten);
# every scenario's whole reason is in the reports (report.json's skipped_checks).
SKIP_LINE = 200


def skipped_notes(results: Sequence[ScenarioResult]) -> list[str]:
    """One line per check and reason it was skipped for: skipped, never passed."""
    counts: dict[tuple[str, str], int] = {}
    for result in results:
        for name, why in result.skipped_checks.items():
            counts[(name, why)] = counts.get((name, why), 0) + 1
    return [
        skip_line(f"check {name} SKIPPED in {count(n, 'scenario')}", why)
        for (name, why), n in counts.items()
    ]


def skip_line(head: str, why: str, limit: int = SKIP_LINE) -> str:
    """``HEAD: WHY`` within ``limit`` characters where the reason's prose allows; a reason
    shortened says where the whole one is."""
    whole = f"{head}: {why or 'no reason given'}"
    if len(whole) <= limit:
        return whole
    pointer = " (whole reason: report.json, skipped_checks)"
    return f"{head}: {shorten(why, limit - len(head) - 2 - len(pointer))}{pointer}"
