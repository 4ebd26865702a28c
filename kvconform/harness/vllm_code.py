"""Measure which of vLLM's reservation code a run executes (``kvconform coverage --vllm-code``).

coverage.py (branch mode) runs around the session: started before vLLM is
imported, so that module-level code counts, restricted to the targets
(:data:`kvconform.model.vllm_code.RESERVATION_CODE` unless configured), with one
dynamic context per scenario (:meth:`CodeTracer.switch`, called as each scenario
starts). Every mode that runs in the process is measured this way (trajectory,
warmup, scheduler, the slots check); a child process that runs vLLM (engine mode)
measures itself when :data:`kvconform.oracles.code_tracing.ENVIRONMENT` says so,
with the scenario as its context, and its data is combined here.

:meth:`CodeTracer.finish` turns coverage.py's data into a
:class:`~kvconform.model.vllm_code.VllmCodeCoverage`: per file and function the
executed lines and branches and the branches never taken with their source line,
per scenario the functions it executed (lines mapped to functions with ``ast``),
and coverage.py's own HTML of the sources with the unexecuted lines marked.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kvconform.model.vllm_code import (
    MODULE_LEVEL,
    RESERVATION_CODE,
    Counts,
    FileCoverage,
    FunctionCoverage,
    FunctionMap,
    MissedBranch,
    Target,
    VllmCodeCoverage,
    counted,
    whole_file,
)
from kvconform.oracles.code_tracing import ENVIRONMENT, child_settings

HTML_DIR = "vllm-coverage"  # coverage.py's HTML, inside the report directory
DATA_FILE = "vllm-coverage.data"  # coverage.py's data file (contexts included), beside it


def include_patterns(targets: tuple[Target, ...]) -> list[str]:
    """coverage.py ``include`` globs for the targets, wherever the vLLM tree lies."""
    return [f"*/{t.pattern}" for t in targets]


def relative_path(measured: str, vllm_location: str | None) -> str | None:
    """``vllm/...`` for a measured file, or None when it lies outside the vLLM in use."""
    path = Path(measured).resolve()
    if vllm_location:
        try:
            return (Path("vllm") / path.relative_to(Path(vllm_location).resolve())).as_posix()
        except ValueError:
            return None
    parts = path.as_posix().rsplit("/vllm/", 1)
    return f"vllm/{parts[1]}" if len(parts) == 2 else None


def target_files(targets: tuple[Target, ...], vllm_location: str | None) -> list[str]:
    """The target files of the vLLM tree at ``vllm_location`` (the ``vllm`` package folder)."""
    if not vllm_location:
        return []
    root = Path(vllm_location).parent
    found = {
        str(path)
        for target in targets
        for path in root.glob(target.pattern)
        if path.suffix == ".py" and path.is_file()
    }
    return sorted(found)


class CodeTracer:
    """coverage.py around one run: start, one context per scenario, stop, analyse."""

    def __init__(self, targets: tuple[Target, ...] = RESERVATION_CODE) -> None:
        import coverage

        self.targets = targets
        self._dir = Path(tempfile.mkdtemp(prefix="kvconform-vllm-code-"))
        self._data_file = str(self._dir / "coverage")
        self._include = include_patterns(targets)
        self._cov = coverage.Coverage(
            data_file=self._data_file,
            branch=True,
            include=self._include,
            config_file=False,
        )
        self._cov.set_option("html:show_contexts", False)
        self._started = 0.0
        self._previous_env = os.environ.get(ENVIRONMENT)

    def start(self) -> None:
        self._started = time.perf_counter()
        self._cov.start()
        self.switch("")

    def switch(self, scenario_id: str) -> None:
        """Lines executed from now on belong to ``scenario_id`` (its children's too)."""
        self._cov.switch_context(scenario_id)
        os.environ[ENVIRONMENT] = child_settings(self._data_file, self._include, scenario_id)

    def stop(self) -> None:
        self._cov.stop()
        if self._previous_env is None:
            os.environ.pop(ENVIRONMENT, None)
        else:
            os.environ[ENVIRONMENT] = self._previous_env

    def finish(
        self,
        vllm_version: str | None,
        vllm_location: str | None,
        report_dir: Path | None,
    ) -> VllmCodeCoverage:
        """Stop if running, combine the children's data, analyse, write the HTML."""
        lap = time.perf_counter()
        self._cov.save()
        processes = ["in-process"]
        children = sorted(self._dir.glob("coverage.child.*"))
        if children:
            self._cov.combine([str(p) for p in children], keep=False)
            self._cov.save()
            processes.append(f"engine child ({len(children)} runs)")
        result = analyse(self._cov, self.targets, vllm_version, vllm_location, self._dir)
        result.processes = processes
        if report_dir is not None:
            write_html(self._cov, result, Path(report_dir))
            # coverage.py's own data, for `coverage report --data-file=...` or a combine.
            shutil.copy(self._data_file, Path(report_dir) / DATA_FILE)
        result.seconds = time.perf_counter() - lap
        shutil.rmtree(self._dir, ignore_errors=True)
        return result


def analyse(
    cov: Any,
    targets: tuple[Target, ...],
    vllm_version: str | None,
    vllm_location: str | None,
    scratch: Path,
) -> VllmCodeCoverage:
    """Per file, function and scenario, from coverage.py's data (its JSON report)."""
    out = scratch / "coverage.json"
    # Every target file of the tree, so that a file no scenario imported counts as 0%.
    morfs = target_files(targets, vllm_location)
    try:
        cov.json_report(morfs=morfs or None, outfile=str(out), pretty_print=False)
    except Exception as exc:  # noqa: BLE001 - coverage.py's NoDataError: nothing was measured
        if type(exc).__name__ != "NoDataError":
            raise
        return VllmCodeCoverage(vllm_version, targets)
    report = json.loads(out.read_text())
    data = cov.get_data()
    result = VllmCodeCoverage(vllm_version, targets)
    by_scenario: dict[str, set[str]] = defaultdict(set)
    for measured, entry in sorted(report.get("files", {}).items()):
        absolute = str(Path(measured).resolve()) if Path(measured).exists() else measured
        relative = relative_path(absolute, vllm_location)
        if relative is None or not any(t.matches(relative) for t in targets):
            continue
        source = Path(absolute).read_text(encoding="utf-8")
        functions = FunctionMap(source)
        file_cov = _file_coverage(relative, entry, functions, targets)
        if file_cov is not None:
            result.files.append(file_cov)
        for line, contexts in _contexts_by_line(data, measured, absolute).items():
            name = functions.name_executing(line)
            if name == MODULE_LEVEL:
                continue
            for context in contexts:
                if context:
                    by_scenario[context].add(f"{relative}::{name}")
    result.scenario_functions = {k: sorted(v) for k, v in sorted(by_scenario.items())}
    return result


def _contexts_by_line(data: Any, measured: str, absolute: str) -> dict[int, list[str]]:
    for name in (measured, absolute):
        found = data.contexts_by_lineno(name)
        if found:
            return dict(found)
    return {}


def _file_coverage(
    relative: str, entry: dict[str, Any], functions: FunctionMap, targets: tuple[Target, ...]
) -> FileCoverage | None:
    units: dict[str, FunctionCoverage] = {}
    lines_of = {span.name: span.line for span in functions.spans}

    def unit(name: str) -> FunctionCoverage:
        if name not in units:
            units[name] = FunctionCoverage(name, lines_of.get(name, 0), Counts())
        return units[name]

    for line in entry.get("executed_lines", []):
        u = unit(functions.name_executing(line))
        u.counts.statements += 1
        u.counts.executed_lines += 1
    for line in entry.get("missing_lines", []):
        u = unit(functions.name_executing(line))
        u.counts.statements += 1
        u.missing_lines.append(int(line))
    for source, _target in entry.get("executed_branches", []):
        u = unit(functions.name_executing(source))
        u.counts.branches += 1
        u.counts.executed_branches += 1
    for source, target in entry.get("missing_branches", []):
        u = unit(functions.name_executing(source))
        u.counts.branches += 1
        u.missed_branches.append(MissedBranch(int(source), int(target), functions.text(source)))
    kept = [u for name, u in units.items() if counted(targets, relative, name)]
    if not kept:
        return None
    for u in kept:
        u.missing_lines.sort()
        u.missed_branches.sort(key=lambda m: (m.line, m.target))
    kept.sort(key=lambda u: (u.line, u.name))
    total = Counts()
    for u in kept:
        total.add(u.counts)
    return FileCoverage(relative, total, kept, whole=whole_file(targets, relative))


def write_html(cov: Any, result: VllmCodeCoverage, report_dir: Path) -> None:
    """coverage.py's HTML of the measured files: each source with its unexecuted lines and
    partial branches marked; each file's page recorded on its :class:`FileCoverage`."""
    folder = report_dir / HTML_DIR
    shutil.rmtree(folder, ignore_errors=True)
    title = f"vLLM {result.vllm_version or ''} reservation code, executed by the scenarios"
    cov.html_report(directory=str(folder), title=title, skip_empty=True)
    result.html_index = f"{HTML_DIR}/index.html"
    pages: dict[str, str] = {}
    for page in folder.glob("*.html"):
        if page.name == "index.html" or page.name.startswith(("function_", "class_")):
            continue
        head = page.read_text(encoding="utf-8", errors="replace")[:4000]
        for unit in result.files:
            if f"{unit.path}</" in head or f"/{unit.path}" in head:
                pages.setdefault(unit.path, page.name)
    for unit in result.files:
        if unit.path in pages:
            unit.html = f"{HTML_DIR}/{pages[unit.path]}"
