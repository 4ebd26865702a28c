"""pytest front: ``pytest scenarios/`` collects every YAML scenario as a test item.

The repository's ``conftest.py`` loads this plugin. Each scenario file becomes a
collector and each scenario (each ``matrix`` combination) an item named by its id,
so ``-k`` selects as usual and tags and kinds become markers (``-m eagle``).

The plugin decides nothing itself: one :class:`~kvconform.harness.session.Session`
per process loads vLLM (once, on the first item that needs it, so ``pytest -n 2
--kvconform-xdist`` imports it once per xdist worker, each worker taking whole
files; without ``--kvconform-xdist`` a run over scenarios only declines ``-n``),
finds each file's expectations and runs each item. The item reports the session's verdict as pytest's outcome: ``passed``,
``failed`` and ``error`` as such (with the checks' messages, not a traceback),
``xfailed`` and ``xpassed`` as XFAIL and XPASS. ``--kvconform-slots`` (or
``slots`` in ``--kvconform-checks``) adds the slots check; the process is then
prepared for vLLM's slot-mapping kernel at configure time, before anything
imports vLLM. A check that could not run is listed in the terminal summary as
skipped, with its reason. A file that does not load becomes an item that errors
in setup with the loader's message; the other files still run. Where pytest's short
summary would cut a failure's first message at the terminal's width, a section just
above it prints the message whole, wrapped. The exit status
follows kvconform's rule: 1 for any failure, 2 when the only trouble was bad input.
"""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.errors import ExitStatus, KvconformError, ScenarioError, ScenarioFailed
from kvconform.harness import session as sessions
from kvconform.harness.loader import SCENARIO_SUFFIXES, is_scenario_file, load_file
from kvconform.model.kinds import Kind
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.model.wording import count, plural, shorten
from kvconform.oracles.vllm import prepare_slot_kernel

_SESSION = pytest.StashKey["sessions.Session"]()
# The user property that marks an item's failure as bad input (its exit status is 2).
INPUT_ERROR = "kvconform input error"


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
    group.addoption(
        "--kvconform-xdist",
        action="store_true",
        help="keep pytest-xdist's workers (-n) for a run of scenarios only, each worker taking "
        "whole files; without it such a run declines -n and runs in one process, since each "
        "worker imports vLLM for itself",
    )


def _request(config: pytest.Config) -> sessions.RunRequest:
    try:
        checks = sessions.checks_from(config.getoption("kvconform_checks"), "--kvconform-checks")
    except KvconformError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("kvconform_slots") and "slots" not in checks:
        checks += ("slots",)
    return sessions.RunRequest(
        checks=checks,
        vllm_src=config.getoption("vllm_src"),
        vllm_release=config.getoption("vllm_release"),
        expectations=config.getoption("kvconform_expectations"),
        command="pytest",
    )


# Why a run of scenarios only declines pytest-xdist's -n (pytest_report_header says it).
_DECLINED = pytest.StashKey[str]()


def _scenarios_only(config: pytest.Config) -> bool:
    """Whether every path on the command line is a scenario file or a folder of scenarios
    that holds no Python tests (``pytest scenarios/``, not ``pytest tests/`` nor a bare
    ``pytest``, which collects the testpaths)."""
    folders = _named_folders(config)
    paths = [
        Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve() for arg in config.args
    ]
    if not config.invocation_params.args or not paths:
        return False
    for path in paths:
        if path.is_file() and path.suffix in SCENARIO_SUFFIXES:
            continue
        if path.is_dir() and path in folders:
            continue
        return False
    return True


def _decline_or_group_xdist(config: pytest.Config) -> None:
    """``-n N`` over scenarios only: each worker would import vLLM for itself (seconds to a
    minute) for a corpus whose own work is seconds, so on a small machine ``-n 2`` is
    several times slower than one process (docs/cli.md says what was measured). Declined,
    with one line, unless ``--kvconform-xdist``; then each worker takes whole files
    (``--dist loadfile``), so a matrix file's cases and a file's expectations stay on one
    worker."""
    workers = getattr(config.option, "numprocesses", None)
    if not workers or hasattr(config, "workerinput") or not _scenarios_only(config):
        return
    if config.getoption("kvconform_xdist"):
        if config.option.dist == "load":
            config.option.dist = "loadfile"
        return
    config.option.numprocesses = 0
    config.option.dist = "no"
    config.option.tx = []
    config.stash[_DECLINED] = (
        f"kvconform: -n {workers} declined: every pytest-xdist worker imports vLLM for itself, "
        "which takes longer than the scenarios' own work; running in one process "
        "(--kvconform-xdist keeps the workers, each taking whole files)"
    )


def pytest_collection(session: pytest.Session) -> None:
    """Say that ``-n`` was declined, under the header (which ``-q`` leaves out)."""
    declined = session.config.stash.get(_DECLINED, None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if declined and reporter is not None:
        reporter.write_line(declined)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which starts the workers
def pytest_configure(config: pytest.Config) -> None:
    _decline_or_group_xdist(config)
    request = _request(config)
    config.stash[_SESSION] = sessions.Session(request)
    for kind in Kind:
        config.addinivalue_line("markers", f"{kind}: kvconform scenario kind")


def _named_folders(config: pytest.Config) -> list[Path]:
    """The folders named on the command line that hold no Python tests of their own
    (``pytest /tmp/somewhere/``, not ``pytest tests/`` or ``pytest .``)."""
    folders = []
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve()
        if path.is_dir() and not any(
            (path / name).exists() for name in ("conftest.py", "pyproject.toml", "setup.py")
        ):
            if not any(path.glob("test_*.py")):
                folders.append(path)
    return folders


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A YAML scenario file named on the command line, under a folder named
    ``scenarios``, or under a folder named on the command line that holds no Python
    tests (a folder of scenarios anywhere: ``pytest /tmp/somewhere/``)."""
    if file_path.suffix not in SCENARIO_SUFFIXES or not is_scenario_file(file_path):
        return None
    explicit = parent.session.isinitpath(file_path)
    if not (
        explicit
        or "scenarios" in file_path.parts
        or any(file_path.resolve().is_relative_to(f) for f in _named_folders(parent.config))
    ):
        return None
    collector: pytest.Collector = ScenarioFile.from_parent(parent, path=file_path)
    return collector


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        # Triton's interpreter must be chosen before vLLM is imported (on any worker),
        # whichever checks run: kvconform.oracles.vllm.loading.load says why. Done here,
        # at the first scenario file, so that a pytest run without scenarios (the plugin
        # is installed for every pytest of the environment) is left alone.
        prepare_slot_kernel()
        try:
            scenarios = load_file(self.path)
        except ScenarioError as error:
            yield BadScenarioItem.from_parent(self, name=self.path.name, error=error)
            return
        # A broken expectations file is the input error of the first file it serves.
        session = self.config.stash[_SESSION]
        reported = len(session.expectation_errors)
        session.expectations_for(self.path)
        for broken in session.expectation_errors[reported:]:
            name = Path(broken.where.file).name
            yield BadScenarioItem.from_parent(self, name=name, error=broken)
        for scenario in scenarios:
            # The node id spelled out, so that pytest parses a matrix case's "[...]" as it
            # parses the ids it keeps (--lf, --ff, the cache): name[eagle-k3] is the
            # name "name" with params "eagle-k3", as a parametrized test's.
            item = ScenarioItem.from_parent(
                self, name=scenario.id, nodeid=f"{self.nodeid}::{scenario.id}", scenario=scenario
            )
            for tag in scenario.tags:
                self.config.addinivalue_line("markers", f"{tag}: kvconform scenario tag")
                item.add_marker(tag)
            # The plain name: a marker's name is a key of the report's keywords, which
            # xdist sends between processes (execnet serializes builtin types only).
            item.add_marker(scenario.kind.value)
            if scenario.speculative is not None:  # -k eagle picks eagle's scenarios
                item.extra_keyword_matches.add(scenario.speculative.method)
            yield item


FIRST_MESSAGE = "kvconform first message"


def first_message(result: ScenarioResult) -> str:
    """The failure's first message on one line, as the short summary carries it."""
    messages = ([result.error] if result.error else []) + [
        f"[{f.check}] {f.message}" for f in result.failures
    ]
    return " ".join((messages or [result.verdict.value])[0].split())


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.result: ScenarioResult | None = None

    def runtest(self) -> None:
        session = self.config.stash[_SESSION]
        result = self.result = session.run_scenario(self.scenario)
        self.user_properties.append(("verdict", result.verdict.value))
        loads = ",".join(f"{s:.2f}" for s in sessions.LOAD_SECONDS)
        self.user_properties.append(("vllm_loads", loads))
        self.user_properties.append(("pid", os.getpid()))
        for name, why in result.skipped_checks.items():
            self.user_properties.append((f"skipped check {name}", why))
        if result.verdict in (Verdict.FAILED, Verdict.ERROR):
            # For the terminal summary's first messages (user properties travel under xdist).
            self.user_properties.append((FIRST_MESSAGE, first_message(result)))
        if result.error_kind is ErrorKind.INPUT:
            self.user_properties.append((INPUT_ERROR, True))
        if result.verdict in (Verdict.PASSED, Verdict.XPASSED):
            return
        if result.verdict is Verdict.SKIPPED:
            pytest.skip(result.skip_reason or "skipped")
        if result.verdict is Verdict.XFAILED:
            raise ScenarioFailed(result)  # reported as XFAIL by pytest_runtest_makereport
        if result.verdict is Verdict.UNSUPPORTED:
            pytest.skip(f"unsupported: {result.error}")
        raise ScenarioFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        exc = excinfo.value
        if isinstance(exc, ScenarioFailed):
            result: ScenarioResult = exc.result
            # The first line is what pytest's short summary shows: the first message.
            messages = ([result.error] if result.error else []) + [
                f"[{f.check}] {f.message}" for f in result.failures
            ]
            records = (
                f" ({count(len(result.failures), 'failure record')})" if result.failures else ""
            )
            lines = [
                first_message(result),
                f"{self.scenario.id}: {result.verdict.value}{records}",
            ]
            lines += messages[1:10]
            if len(messages) > 10:
                lines.append(f"... {len(messages) - 10} more")
            session = self.config.stash[_SESSION]
            lines.append(f"rerun alone: {session.rerun_command(result)}")
            return "\n".join(lines)
        if isinstance(exc, KvconformError):
            return str(exc)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        line = self.scenario.line - 1 if self.scenario.line else None
        return self.path, line, f"scenario {self.scenario.id}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """The session's xfailed / xpassed verdicts as pytest's XFAIL / XPASS outcomes; a file
    that does not load marked as an input error (exit status, pytest_sessionfinish)."""
    report = yield
    if isinstance(item, BadScenarioItem) and report.failed:
        report.user_properties.append((INPUT_ERROR, True))
    result = getattr(item, "result", None)
    if call.when != "call" or result is None or result.expectation is None:
        return report
    if result.verdict is Verdict.XFAILED:
        report.outcome = "skipped"
        report.wasxfail = result.expectation
    elif result.verdict is Verdict.XPASSED:
        report.outcome = "passed"
        report.wasxfail = result.expectation
    return report


def _on_ci() -> bool:
    """pytest's own test (``_pytest.compat.running_on_ci``): there its short summary
    prints each message whole."""
    return any(os.environ.get(name) for name in ("CI", "BUILD_NUMBER"))


def _first_messages(terminalreporter: Any) -> None:
    """The failures whose first message pytest's short summary would cut at this width
    (``FAILED node - message...``, or the node alone where nothing fits): each node, then
    its message wrapped at the width, prose shortened, figures whole. Printed just above
    pytest's short summary; not on CI nor with ``-vv``, where pytest prints them whole."""
    config = terminalreporter.config
    if _on_ci() or config.getoption("verbose") >= 2:
        return
    width = config.get_terminal_writer().fullwidth
    cut = []
    for report in terminalreporter.stats.get("failed", []):
        message = dict(getattr(report, "user_properties", ())).get(FIRST_MESSAGE)
        if message is None:
            continue
        node = config.cwd_relative_nodeid(report.nodeid)
        if len(f"FAILED {node} - {message}") > width:
            cut.append((node, str(message)))
    if not cut:
        return
    terminalreporter.section(
        f"kvconform: first {plural(len(cut), 'message')} the short summary cuts", sep="-"
    )
    wrap = max(40, width - 4)
    for node, message in cut:
        terminalreporter.write_line(f"FAILED {node}")
        for line in textwrap.wrap(shorten(message, 3 * wrap), wrap):
            terminalreporter.write_line(f"    {line}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """kvconform's exit rule (docs/cli.md): 1 for any failure, whatever input errors came
    with it; 2 when nothing failed and some input was bad (pytest alone says 1)."""
    if exitstatus != pytest.ExitCode.TESTS_FAILED:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    bad = [report for key in ("failed", "error") for report in reporter.stats.get(key, ())]
    if bad and all(
        dict(getattr(report, "user_properties", ())).get(INPUT_ERROR) for report in bad
    ):
        session.exitstatus = ExitStatus.BAD_INPUT


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _first_messages(terminalreporter)
    # From the items' reports (user properties travel with them under xdist).
    skipped: Counter[tuple[str, str]] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name.startswith("skipped check "):
                    skipped[(name.removeprefix("skipped check "), str(value))] += 1
    for (check, why), n in skipped.items():
        terminalreporter.write_line(
            sessions.skip_line(f"kvconform: check {check} SKIPPED in {count(n, 'item')}", why)
        )


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
