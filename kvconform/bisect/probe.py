"""One probe: ``kvconform check`` on the selected scenarios, in a fresh process.

Every vLLM tree needs its own process: once ``vllm`` is imported, another tree
cannot replace it. A probe therefore runs ``python -m kvconform check`` with
the same interpreter and the same kvconform (its folder is put first on
``PYTHONPATH``), in the probe's own report folder (so that a ``vllm/`` in the
caller's working directory cannot shadow the tree under test), with its output
in ``output.log`` there, and reads the verdicts back from ``report.json``.

Results are cached per target (a release or a commit) and selection digest
(:mod:`.selection`): ``~/.cache/kvconform/bisect/probes/<digest>/<target>/``
holds the probe's reports and ``probe.json``. A probe that aborted (bad input,
kvconform failing) is not cached, nor is a release that could not be
downloaded: both may be transient.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import kvconform
from kvconform.bisect.selection import Selection
from kvconform.bisect.state import ProbeRecord
from kvconform.paths import cache_dir

LOG_FILE = "output.log"
PROBE_FILE = "probe.json"


class ProbeCache:
    def __init__(self, selection: Selection) -> None:
        self.root = cache_dir("bisect", "probes", selection.digest[:16])

    def folder(self, label: str) -> Path:
        return self.root / re.sub(r"[^A-Za-z0-9._-]", "_", label)

    def get(self, label: str) -> ProbeRecord | None:
        path = self.folder(label) / PROBE_FILE
        try:
            record = ProbeRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None
        record.cached = True
        return record

    def put(self, record: ProbeRecord) -> None:
        if record.cacheable:
            path = self.folder(record.label) / PROBE_FILE
            path.write_text(json.dumps(record.to_json(), indent=1) + "\n", encoding="utf-8")

    def fresh_folder(self, label: str) -> Path:
        folder = self.folder(label)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder


def kvconform_env() -> dict[str, str]:
    """The environment of a child that must import this very kvconform."""
    env = dict(os.environ)
    root = str(Path(kvconform.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH", "")] if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_check(label: str, vllm_args: list[str], selection: Selection, folder: Path) -> ProbeRecord:
    """Run ``kvconform check`` in a fresh process; its reports land in ``folder``."""
    command = [
        sys.executable, "-m", "kvconform", "check", *selection.check_args(),
        "--report-dir", str(folder), *vllm_args,
    ]  # fmt: skip
    started = time.perf_counter()
    done = run_logged(command, folder)
    record = read_report(label, folder)
    record.duration = time.perf_counter() - started
    if record.run_status is None:
        record.cacheable = False
        record.reason = f"kvconform check exited {done.returncode} without a report: " + (
            log_tail(folder)
        )
    return record


def read_report(label: str, folder: Path) -> ProbeRecord:
    try:
        data = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ProbeRecord(label, None, str(folder))
    verdicts, headlines = {}, {}
    for entry in data.get("scenarios", []):
        verdicts[entry["id"]] = entry["verdict"]
        failures = entry.get("failures") or []
        text = entry.get("error") or (
            f"[{failures[0]['check']}] {failures[0]['message']}" if failures else ""
        )
        if text:
            headlines[entry["id"]] = text
    vllm = data.get("vllm") or {}
    status = data.get("exit_status")
    reason = vllm.get("error") or ""
    if not reason and data.get("input_errors"):
        first = data["input_errors"][0]
        reason = f"{first['file']}:{first['line']}: {first['field']}: {first['message']}"
    if not reason and status == 3:
        reason = next((h for h in headlines.values()), "")
    return ProbeRecord(
        label,
        int(status) if status is not None else None,
        str(folder),
        verdicts,
        headlines,
        vllm_version=vllm.get("version"),
        root_causes=list(data.get("root_causes") or []),
        reason=reason,
    )


def log_tail(folder: Path, lines: int = 3, log_file: str = LOG_FILE) -> str:
    """The last ``lines`` lines of a child's log in ``folder``, on one line."""
    try:
        text = (folder / log_file).read_text(encoding="utf-8").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) or "(no output)"


def run_logged(
    command: list[str], folder: Path, log_file: str = LOG_FILE
) -> subprocess.CompletedProcess[bytes]:
    """Run a kvconform command in ``folder`` with :func:`kvconform_env`, its output (after
    the command line itself) in ``folder / log_file``."""
    with open(folder / log_file, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        return subprocess.run(
            command, cwd=folder, env=kvconform_env(), stdout=log, stderr=subprocess.STDOUT
        )
