"""vLLM's own tests against each real bug (``kvconform realbugs --peer-tests``).

The yardstick for a real bug is whether vLLM's *own* tests would have caught it on the
same tree: for each bug, the release's CPU-runnable tests (:mod:`kvconform.peer`) run
against the patched tree, only the test files that reach a function the bug's patch
changes (the peer suite's reach map), stopping at the first failure. A patch that
changes only module-level code reaches every file: the whole green selection runs.
Each bug gets a ``peer`` entry; :func:`kvconform.realbugs.report.who_catches` is the
four-way table beside kvconform's own verdicts (``kvconform mutate --peer-tests`` gives the same for mutants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvconform.harness.impact import parse_diff
from kvconform.model.vllm_code import MODULE_LEVEL, FunctionMap
from kvconform.peer import PeerSuite
from kvconform.realbugs.catalogue import RealBug

PEER_TIMEOUT_S = 1800.0


def changed_functions(patch: str, pristine: Path) -> set[tuple[str, str]]:
    """``(vllm/....py, Qual.name)`` of every function a patch changes, read against the
    unpatched tree ``pristine`` (the folder holding ``vllm/``); module-level changes are
    not functions, and a file the tree lacks is skipped."""
    functions: set[tuple[str, str]] = set()
    for path, part in parse_diff(patch).items():
        source = pristine / path
        if part.new_file or not source.is_file():
            continue
        names = FunctionMap(source.read_text(encoding="utf-8"))
        for line in part.changed:
            name = names.defining(line)
            if name != MODULE_LEVEL:
                functions.add((path, name))
    return functions


def peer_entry(
    suite: PeerSuite, bug: RealBug, tree: Path, pristine: Path, timeout: float = PEER_TIMEOUT_S
) -> dict[str, Any]:
    """vLLM's tests against one bug's patched ``tree``: the ``peer`` entry of its result."""
    functions = changed_functions(bug.patch.read_text(encoding="utf-8"), pristine)
    outcome = suite.run(tree, functions or None, timeout)
    return {
        "verdict": outcome.verdict.value,
        "first_failure": str(outcome.first_failure) if outcome.first_failure else None,
        "tests_run": outcome.tests_run,
        "seconds": outcome.seconds,
        "functions": sorted(f"{path}::{name}" for path, name in functions),
        "files": list(outcome.files),
    }
