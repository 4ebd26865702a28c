"""The script ``git bisect run`` calls for each commit of a ``--repo`` bisection.

``python -m kvconform.bisect.gitprobe STATE_DIR`` probes the commit
checked out in the current folder (the private clone's working tree, which
holds ``vllm/``): from the bisection's saved state if it was probed before the
interrupt, from the probe cache if another bisection on the same selection
probed it, and otherwise by running ``kvconform check --vllm-src .`` in a
fresh process. It records the probe in the state file, prints one progress
line and exits with git bisect's code (0 old, 1 new, 125 skip, 128 abort).
Anything unexpected aborts the bisection rather than marking a commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvconform.bisect.outcome import ABORT_CODE, git_code
from kvconform.bisect.probe import ProbeCache, run_check
from kvconform.bisect.selection import Selection
from kvconform.bisect.state import BisectState, ProbeRecord
from kvconform.bisect.summary import probe_line

CONFIG_FILE = "probe-config.json"


def write_config(state: BisectState, selection: Selection, find_fix: bool, fresh: bool) -> None:
    config = {
        "fresh": fresh,
        "key": state.key,
        "settings": state.settings,
        "selection": asdict(selection),
        "find_fix": find_fix,
    }
    (state.directory / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")


def git(checkout: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit_title(checkout: Path, sha: str) -> str:
    return git(checkout, "log", "-1", "--format=%s", sha)


def probe_commit(
    state: BisectState, selection: Selection, checkout: Path, fresh: bool = False
) -> ProbeRecord:
    """Probe the commit checked out in ``checkout`` and record it in ``state``."""
    label = git(checkout, "rev-parse", "HEAD")[:12]
    record = state.probes.get(label)
    if record is not None:
        record.cached = True
        return record
    cache = ProbeCache(selection)
    record = None if fresh else cache.get(label)
    if record is None:
        folder = cache.fresh_folder(label)
        record = run_check(label, ["--vllm-src", str(checkout)], selection, folder)
        cache.put(record)
    state.record(record)
    return record


def load_config(state_dir: Path) -> tuple[BisectState, Selection, bool, bool]:
    config: dict[str, Any] = json.loads((state_dir / CONFIG_FILE).read_text())
    selection_data = config["selection"]
    selection = Selection(
        tuple(selection_data["paths"]),
        selection_data["expression"],
        tuple(selection_data["scenario_ids"]),
        selection_data["digest"],
        selection_data["expectations"],
        tuple(selection_data["checks"]),
    )
    state, _ = BisectState.open(state_dir, config["key"], config["settings"])
    return state, selection, bool(config["find_fix"]), bool(config["fresh"])


def main(argv: list[str]) -> int:
    try:
        state, selection, find_fix, fresh = load_config(Path(argv[0]))
        checkout = Path.cwd()
        record = probe_commit(state, selection, checkout, fresh)
        title = f" {commit_title(checkout, 'HEAD')[:60]!r}"
        print(probe_line(state.number(record.label), record, find_fix, title), flush=True)
        return git_code(record.run_status, find_fix)
    except BaseException as exc:  # noqa: BLE001 - never let git read a crash as "bad"
        print(f"kvconform probe failed, aborting the bisection: {exc!r}", flush=True)
        return ABORT_CODE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
