"""Which of vLLM's tests reach which reservation function, from coverage contexts.

coverage.py can label every line it records with the test that was running
(pytest-cov's ``--cov-context=test``: the context of a line is the node id of
the test, with ``|setup``, ``|run`` or ``|teardown``). One run of the green
selection under coverage, restricted to the reservation code
(:data:`kvconform.model.vllm_code.RESERVATION_CODE`), therefore says for each function which tests execute
it. Lines executed while a module is imported (its ``def`` statements) carry
no test's context and are not counted as reaching.

A mutant of a function can only be killed by a test that runs that function,
so a targeted peer run (:meth:`ReachMap.files_for`) takes only the test files
that reach the mutated functions. The map is cached per vLLM version and tree
fingerprint; node ids are stored once and referred to by index.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform.model.vllm_code import RESERVATION_CODE
from kvconform.model.vllm_code import counted as counted_in

# vLLM's reservation code is defined once, in kvconform.model.vllm_code: what `kvconform
# coverage --vllm-code` measures of the corpus is what is measured of vLLM's own tests here.
MODULE_LEVEL = ""  # coverage's name for the code outside any function


def coverage_rc(vllm_dir: Path, path: Path) -> Path:
    """A coverage.py configuration measuring branches of the reservation files only."""
    include = "\n".join(f"    {vllm_dir.parent / target.pattern}" for target in RESERVATION_CODE)
    path.write_text(f"[run]\nbranch = True\ninclude =\n{include}\n")
    return path


def counted(relative: str, function: str) -> bool:
    """Whether ``function`` of ``relative`` (``vllm/...``) is reservation code."""
    return counted_in(RESERVATION_CODE, relative, function)


def definition_key() -> str:
    """The reservation code's definition as text: part of a cached reach map's key, so a
    change of definition measures again instead of reading a map of other files."""
    return ";".join(target.to_text() for target in RESERVATION_CODE)


def relative_name(measured: str, vllm_dir: Path) -> str:
    """``vllm/v1/core/block_pool.py`` for a measured absolute path inside ``vllm_dir``."""
    return (Path("vllm") / Path(measured).resolve().relative_to(vllm_dir.resolve())).as_posix()


def export_json(
    data_file: Path, rc: Path, out: Path, env: Mapping[str, str], contexts: bool
) -> dict[str, Any]:
    """coverage.py's JSON report of ``data_file`` (run as a subprocess: kvconform never
    imports coverage.py itself; the pinned copy lives in the peer-deps folder)."""
    command = [
        sys.executable, "-m", "coverage", "json", f"--data-file={data_file}",
        f"--rcfile={rc}", "-o", str(out), "-q",
    ]  # fmt: skip
    if contexts:
        command.append("--show-contexts")
    subprocess.run(command, env=dict(env), check=True, capture_output=True, text=True)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@dataclass
class ReachMap:
    """Function (``vllm/...py::Qual.name``) -> the node ids of the tests that execute it."""

    tests: list[str]
    functions: dict[str, list[int]]

    def nodeids(self, file: str, function: str) -> list[str]:
        return [self.tests[i] for i in self.functions.get(f"{file}::{function}", [])]

    def tests_reaching(self, file: str, function: str) -> list[str]:
        """The test files with a test that executes ``function`` of ``file``."""
        return sorted({nodeid.split("::")[0] for nodeid in self.nodeids(file, function)})

    def known(self, file: str, function: str) -> bool:
        return f"{file}::{function}" in self.functions

    def files_for(self, functions: Iterable[tuple[str, str]]) -> list[str]:
        """The test files reaching any of ``functions``.

        A function the map does not know (module-level code, a function the mutant
        added) stands for its whole file: every test file reaching any function there.
        """
        found: set[str] = set()
        for file, function in functions:
            if function != MODULE_LEVEL and self.known(file, function):
                found.update(self.tests_reaching(file, function))
                continue
            prefix = f"{file}::"
            for key in self.functions:
                if key.startswith(prefix):
                    found.update(self.tests_reaching(file, key[len(prefix) :]))
        return sorted(found)

    def test_files(self) -> dict[str, list[str]]:
        """Function -> the test files reaching it: the map as people read it."""
        return {
            key: sorted({self.tests[i].split("::")[0] for i in indices})
            for key, indices in sorted(self.functions.items())
        }

    def to_json(self) -> dict[str, Any]:
        return {"tests": self.tests, "functions": self.functions}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReachMap:
        return cls(list(data["tests"]), {k: list(v) for k, v in data["functions"].items()})


def from_coverage(
    report: dict[str, Any], vllm_dir: Path, leave_out: Collection[str] = ()
) -> ReachMap:
    """The reach map of a coverage JSON report made with ``--show-contexts``.

    ``leave_out``: node ids that do not count (tests that failed in that run).
    """
    index: dict[str, int] = {}
    functions: dict[str, list[int]] = {}
    for measured, entry in report.get("files", {}).items():
        relative = relative_name(measured, vllm_dir)
        contexts: dict[str, list[str]] = entry.get("contexts", {})
        for name, function in entry.get("functions", {}).items():
            if name == MODULE_LEVEL or not counted(relative, name):
                continue
            reached: set[int] = set()
            for line in function.get("executed_lines", []):
                for context in contexts.get(str(line), []):
                    nodeid = context.rsplit("|", 1)[0]
                    if nodeid and nodeid not in leave_out:
                        reached.add(index.setdefault(nodeid, len(index)))
            functions[f"{relative}::{name}"] = sorted(reached)
    return ReachMap(list(index), functions)
