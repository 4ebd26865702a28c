"""Every test's outcome, written as it happens, one JSON line each.

The runner (:mod:`kvconform.peer.runner`) reads this file back instead of
parsing pytest's terminal output. One line per test phase report that is not
a plain pass of setup or teardown, and one per failed collection::

    {"kind": "test", "nodeid": "...", "when": "call", "outcome": "failed",
     "message": "AssertionError: assert 3 == 4", "seconds": 0.01}
    {"kind": "collect", "nodeid": "tests/x.py", "outcome": "failed",
     "message": "ImportError: ..."}

``message`` is the first line of the exception that failed the test (pytest's
"crash" message). The lines are flushed one by one, so a run killed by its
timeout still leaves every finished test behind. The file is named by
``$KVCONFORM_PEER_RECORD``; load with ``-p kvconform.peer.plugins.record``.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("KVCONFORM_PEER_RECORD")
    if path and not hasattr(config, "workerinput"):  # the controller writes, not xdist workers
        config.pluginmanager.register(Recorder(path), "kvconform-peer-record")


def message_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The first line of what failed: the crash message, else the report's last line."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        text = str(crash.message)
    elif isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        text = str(longrepr[2])
    else:
        lines = [ln for ln in str(longrepr or "").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("E ")]
        text = (errors[0][1:] if errors else lines[-1]) if lines else ""
    first = text.strip().splitlines()
    return first[0].strip()[:500] if first else ""


class Recorder:
    """Appends one JSON line per report to ``path``, flushed at once."""

    def __init__(self, path: str) -> None:
        self.out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at unconfigure

    def _write(self, line: dict[str, Any]) -> None:
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return
        self._write(
            {
                "kind": "test",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "message": "" if report.passed else message_of(report),
                "seconds": round(report.duration, 4),
            }
        )

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write(
                {
                    "kind": "collect",
                    "nodeid": report.nodeid,
                    "outcome": "failed",
                    "message": message_of(report),
                }
            )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.out.close()
