"""pytest front: ``pytest scenarios/`` collects every YAML scenario as a test item.

The repository's ``conftest.py`` loads this plugin. Each scenario file becomes
a collector and each scenario (each ``matrix`` combination) an item named by
its id, so ``-k`` selects as usual and tags become markers (``-m eagle``).
An item runs :func:`kvconform.harness.engine.run_scenario`, the same engine the
command line uses, and fails with the checks' messages, not a traceback.

vLLM is imported once per process, on the first item that needs it, so
``pytest -n 2 scenarios/`` (pytest-xdist) imports it once per worker.
``--kvconform-slots`` (or ``slots`` in ``--kvconform-checks``) adds the slots
check; the process is then prepared for vLLM's slot-mapping kernel at
configure time, before anything imports vLLM. A check that could not run is
listed in the terminal summary as skipped, with its reason.
Known divergences from the expectations file become ``xfail`` markers at
collection, so pytest reports them as XFAIL, or XPASS once they conform.
A file that does not load becomes an item that errors in setup with the
loader's message; the other files still run.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.errors import KvconformError, ScenarioError
from kvconform.harness.checks import parse_checks
from kvconform.harness.expectations import DEFAULT_FILE, Expectation, load_expectations
from kvconform.harness.loader import SCENARIO_SUFFIXES, is_scenario_file, load_file
from kvconform.harness.results import ScenarioResult, Verdict
from kvconform.harness.scenario import Scenario
from kvconform.oracles import vllm_compat

_VLLM: dict[str | None, vllm_compat.Vllm] = {}
# Seconds each load took in this process; every item reports them (junit
# properties), which shows import cost per xdist worker and that it is paid once.
_LOAD_SECONDS: list[float] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvconform")
    group.addoption(
        "--vllm-src", metavar="DIR", help="run scenarios against the vLLM Python tree in DIR"
    )
    group.addoption(
        "--vllm-release", metavar="VER", help="run scenarios against PyPI release VER's Python tree"
    )
    group.addoption(
        "--kvconform-checks",
        metavar="LIST",
        help="comma-separated checks to run ('default', 'all' or names; default: default)",
    )
    group.addoption(
        "--kvconform-slots",
        action="store_true",
        help="add the slots check: vLLM's slot-mapping kernel on every step "
        "(Triton's interpreter on a machine without CUDA; slower)",
    )
    group.addoption("--kvconform-expectations", metavar="FILE", help="known divergences file")


def selected_checks(config: pytest.Config) -> tuple[str, ...]:
    try:
        checks = parse_checks(config.getoption("kvconform_checks"))
    except ValueError as exc:
        raise pytest.UsageError(f"--kvconform-checks: {exc}") from None
    if config.getoption("kvconform_slots") and "slots" not in checks:
        checks += ("slots",)
    return checks


def pytest_configure(config: pytest.Config) -> None:
    # Triton's interpreter must be chosen before vLLM is imported (on any worker).
    if "slots" in selected_checks(config):
        vllm_compat.prepare_slot_kernel()


def _vllm(config: pytest.Config) -> vllm_compat.Vllm:
    release = config.getoption("vllm_release")
    src = config.getoption("vllm_src")
    slot_kernel = "slots" in selected_checks(config)
    key = release or src
    if key not in _VLLM:
        started = time.perf_counter()
        if release:
            from kvconform.harness.releases import release_tree

            _VLLM[key] = vllm_compat.load(
                src=release_tree(release), release=release, slot_kernel=slot_kernel
            )
        else:
            _VLLM[key] = vllm_compat.load(src=src, slot_kernel=slot_kernel)
        _LOAD_SECONDS.append(time.perf_counter() - started)
    return _VLLM[key]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # From the items' reports (user properties travel with them under xdist).
    skipped: Counter[tuple[str, str]] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name.startswith("skipped check "):
                    skipped[(name.removeprefix("skipped check "), str(value))] += 1
    for (check, why), count in skipped.items():
        terminalreporter.write_line(
            f"kvconform: check {check} SKIPPED in {count} item{'s' if count > 1 else ''}: {why}"
        )


def _target_version(config: pytest.Config) -> str | None:
    release = config.getoption("vllm_release")
    if release:
        return str(release)
    src = config.getoption("vllm_src")
    return vllm_compat.tree_version(src) if src else vllm_compat.installed_version()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix not in SCENARIO_SUFFIXES or not is_scenario_file(file_path):
        return None
    explicit = parent.session.isinitpath(file_path)
    if explicit or "scenarios" in file_path.parts:
        collector: pytest.Collector = ScenarioFile.from_parent(parent, path=file_path)
        return collector
    return None


def _expectations_for(path: Path, config: pytest.Config) -> list[Expectation]:
    explicit = config.getoption("kvconform_expectations")
    candidates = [Path(explicit)] if explicit else [p / DEFAULT_FILE for p in path.parents]
    for candidate in candidates:
        if candidate.exists():
            return load_expectations(candidate)
    return []


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenarios = load_file(self.path)
            expectations = _expectations_for(self.path, self.config)
        except ScenarioError as error:
            yield BadScenarioItem.from_parent(self, name=self.path.name, error=error)
            return
        version = _target_version(self.config)
        for scenario in scenarios:
            item = ScenarioItem.from_parent(self, name=scenario.id, scenario=scenario)
            for tag in scenario.tags:
                self.config.addinivalue_line("markers", f"{tag}: kvconform scenario tag")
                item.add_marker(tag)
            item.add_marker(scenario.kind)
            for entry in expectations:
                if version is not None and entry.applies(scenario.id, version):
                    item.expectation = entry
                    item.add_marker(
                        pytest.mark.xfail(
                            reason=entry.reason, raises=ExpectedDivergence, strict=False
                        )
                    )
                    break
            yield item


class ScenarioFailed(Exception):
    def __init__(self, result: ScenarioResult) -> None:
        self.result = result
        super().__init__(result.headline())


class ExpectedDivergence(ScenarioFailed):
    """The scenario diverged the way its expectations entry says."""


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.expectation: Expectation | None = None
        for marker in ("trajectory", "warmup", "scheduler"):
            self.config.addinivalue_line("markers", f"{marker}: kvconform scenario kind")

    def runtest(self) -> None:
        from kvconform.harness.engine import run_scenario

        checks = selected_checks(self.config)
        result = run_scenario(self.scenario, _vllm(self.config), checks)
        self.user_properties.append(("verdict", result.verdict.value))
        self.user_properties.append(("vllm_loads", ",".join(f"{s:.2f}" for s in _LOAD_SECONDS)))
        self.user_properties.append(("pid", os.getpid()))
        for name, why in result.skipped_checks.items():
            self.user_properties.append((f"skipped check {name}", why))
        if result.verdict is Verdict.PASSED:
            return
        if result.skipped_checks and len(result.skipped_checks) == len(checks):
            pytest.skip(result.error or "no selected check could run")
        if self.expectation is not None and self.expectation.covers(result):
            raise ExpectedDivergence(result)
        raise ScenarioFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        exc = excinfo.value
        if isinstance(exc, ScenarioFailed):
            result = exc.result
            lines = [f"{self.scenario.id}: {result.verdict.value}"]
            if result.error:
                lines.append(result.error)
            lines += [f"[{f.check}] {f.message}" for f in result.failures[:10]]
            if len(result.failures) > 10:
                lines.append(f"... {len(result.failures) - 10} more")
            lines.append(f"rerun alone: kvconform explain {self.scenario.file}")
            return "\n".join(lines)
        if isinstance(exc, KvconformError):
            return str(exc)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        line = self.scenario.line - 1 if self.scenario.line else None
        return self.path, line, f"scenario {self.scenario.id}"


class BadScenarioItem(pytest.Item):
    """A scenario file that did not load: errors in setup with the loader's message."""

    def __init__(self, *, error: ScenarioError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def setup(self) -> None:
        raise self.error

    def runtest(self) -> None:  # pragma: no cover - setup always raises
        raise self.error

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value)

    # pytest renders setup errors with this method, not repr_failure; a bad
    # scenario file deserves its one-line message, not a traceback into the loader.
    def _repr_failure_py(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> Any:
        if isinstance(excinfo.value, ScenarioError):
            return str(excinfo.value)
        return super()._repr_failure_py(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        line = self.error.where.line
        return self.path, (line - 1) if line else None, f"scenario file {self.path.name}"
