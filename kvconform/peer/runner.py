"""One pytest subprocess over vLLM's tests, and what it reported.

:func:`run_pytest` starts ``python -m pytest`` in the suite folder with the
environment of :mod:`kvconform.peer.environment` and kvconform's plugins
(:mod:`kvconform.peer.plugins`) named with ``-p``, waits for it up to a
timeout, and reads back the JSON lines the ``record`` plugin wrote. The
process runs in a session of its own, so a timeout ends it and every process
it started, by its process group, and nothing else.

The result keeps the records and the last lines of pytest's output; the
interpretation (a verdict, a baseline) belongs to the callers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLUGINS = ("record", "deselect", "cpu_warmup")
TREE_PLUGIN = "tree"
LIGHT_CLEANUP_PLUGIN = "light_cleanup"
_TAIL = 6000


@dataclass
class PytestRun:
    """What one pytest subprocess did."""

    records: list[dict[str, Any]]
    returncode: int | None  # None: ended by the timeout
    seconds: float
    output_tail: str
    command: list[str] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def counts(self) -> dict[str, int]:
        """passed / failed / skipped / errors (a failed setup or teardown) / collect_errors."""
        counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "collect_errors": 0}
        for record in self.records:
            if record["kind"] == "collect":
                counts["collect_errors"] += 1
            elif record["outcome"] == "failed":
                counts["failed" if record["when"] == "call" else "errors"] += 1
            elif record["outcome"] == "skipped":
                counts["skipped"] += 1
            elif record["when"] == "call":
                counts["passed"] += 1
        return counts


def pytest_command(
    targets: Iterable[str],
    *,
    tree_plugin: bool = False,
    light_cleanup: bool = False,
    extra_args: Iterable[str] = (),
) -> list[str]:
    plugins = list(PLUGINS)
    plugins += [TREE_PLUGIN] if tree_plugin else []
    plugins += [LIGHT_CLEANUP_PLUGIN] if light_cleanup else []
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN"]
    for name in plugins:
        command += ["-p", f"kvconform.peer.plugins.{name}"]
    # pytest-asyncio warns at every start without it; "function" is its own default.
    command += ["-o", "asyncio_default_fixture_loop_scope=function"]
    return [*command, *extra_args, "--", *targets]


def run_pytest(
    suite: Path,
    targets: Iterable[str],
    env: Mapping[str, str],
    *,
    deselect: Iterable[str] = (),
    extra_args: Iterable[str] = (),
    timeout: float | None = None,
    light_cleanup: bool = False,
) -> PytestRun:
    """Runs pytest over ``targets`` (paths or node ids relative to ``suite``).

    ``light_cleanup`` skips vLLM's teardown after each test
    (:mod:`kvconform.peer.plugins.light_cleanup`).
    """
    tree_plugin = "KVCONFORM_PEER_INSTALLED_VLLM" in env
    command = pytest_command(
        targets, tree_plugin=tree_plugin, light_cleanup=light_cleanup, extra_args=extra_args
    )
    with tempfile.TemporaryDirectory(prefix="kvconform-peer-") as tmp:
        record = Path(tmp) / "record.jsonl"
        listed = Path(tmp) / "deselect.txt"
        listed.write_text("".join(f"{nodeid}\n" for nodeid in deselect))
        run_env = dict(env, KVCONFORM_PEER_RECORD=str(record), KVCONFORM_PEER_DESELECT=str(listed))
        output = Path(tmp) / "output.txt"
        started = time.monotonic()
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                command,
                cwd=suite,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            returncode: int | None
            try:
                returncode = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end_group(process)
                returncode = None
        seconds = time.monotonic() - started
        records = _read_records(record)
        tail = output.read_bytes()[-_TAIL:].decode("utf-8", "replace")
    return PytestRun(records, returncode, seconds, tail, command)


def _end_group(process: subprocess.Popen[bytes]) -> None:
    """Ends the pytest process and whatever it started (its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records
