"""Stand-ins for what a CI machine has, so that the recipes' commands run here as written.

:func:`install_standins` puts on ``PATH``:

* ``git``: ``git clone URL DIR`` makes DIR a kvconform checkout (links to this repository's
  folders, so nothing is written into the repository); ``git -C DIR checkout REF`` is logged;
* ``make``: logs its targets, its ``VAR=value`` words and the vLLM variables of its
  environment; ``install-light`` makes ``DIR/.venv-light/bin/{python,kvconform}``, which run
  this checkout's kvconform with vLLM, torch, Triton, NumPy, Matplotlib and Hypothesis made
  unimportable (what the light install lacks); ``nightly`` with the corpus among its parts
  writes a real shard report (kvconform's own writers) into ``NIGHTLY_DIR``, shard 2 failing;
* ``buildkite-agent``: logs its arguments, and what ``annotate`` reads on stdin.

Every call is one JSON line in the file ``STANDIN_LOG`` names.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINKED = ("kvconform", "tools", "scenarios", "tests", "ci", "docs", "Makefile", "pyproject.toml",
          "constraints.txt")  # fmt: skip

# What the light install lacks; importing any of them fails as an uninstalled package does.
BLOCKED = ("vllm", "torch", "triton", "numpy", "matplotlib", "hypothesis", "transformers")
BLOCKER = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the light install)")
sys.meta_path.insert(0, _NotInstalled())
sys.path.insert(0, {str(REPO)!r})
"""
LIGHT_KVCONFORM = BLOCKER + "from kvconform.fronts.cli import main\nsys.exit(main(sys.argv[1:]))\n"
LIGHT_PYTHON = (
    BLOCKER
    + "import runpy\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
)

_PRELUDE = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import ci_standin
def log(entry):
    with open(os.environ["STANDIN_LOG"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\\n")
"""

_GIT = (
    _PRELUDE
    + """
args = sys.argv[1:]
if args[0] == "clone":
    ci_standin.fake_checkout(Path(args[-1]))
    log({"tool": "git", "args": args})
else:
    log({"tool": "git", "args": args, "cwd": os.getcwd()})
"""
)

_MAKE = (
    _PRELUDE
    + """
args, directory, words = sys.argv[1:], ".", []
while args:
    word = args.pop(0)
    if word == "-C":
        directory = args.pop(0)
    else:
        words.append(word)
assigned = dict(w.split("=", 1) for w in words if "=" in w)
targets = [w for w in words if "=" not in w and not w.startswith("-")]
env = {k: os.environ.get(k, "") for k in ("VLLM_SRC", "VLLM_WHEEL", "SHARD", "PIP_CACHE_DIR",
                                          "KVCONFORM_CACHE", "BUILDKITE_PARALLEL_JOB")}
log({"tool": "make", "dir": directory, "targets": targets, "vars": assigned, "env": env})
if "install-light" in targets:
    ci_standin.light_venv(Path(directory) / ".venv-light")
if "nightly" in targets and "corpus" in assigned.get("NIGHTLY_PARTS", "").split():
    ci_standin.shard_report(Path(assigned["NIGHTLY_DIR"]), assigned, os.environ)
"""
)

_AGENT = (
    _PRELUDE
    + """
args = sys.argv[1:]
log({"tool": "buildkite-agent", "args": args,
     "stdin": sys.stdin.read() if args[:1] == ["annotate"] else ""})
"""
)


def _script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def install_standins(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("git", _GIT), ("make", _MAKE), ("buildkite-agent", _AGENT)):
        _script(bin_dir / name, text)


def fake_checkout(directory: Path) -> None:
    """A kvconform checkout at ``directory``: links to this repository's folders and files."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if not (directory / name).exists():  # a job of the same simulated machine made it
            (directory / name).symlink_to(REPO / name)


def light_venv(venv: Path) -> None:
    """``bin/kvconform`` and ``bin/python`` of a light install: this checkout's kvconform,
    with the packages the light install lacks unimportable."""
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, code in (("kvconform", LIGHT_KVCONFORM), ("python", LIGHT_PYTHON)):
        _script(bin_dir / name, f"#!{sys.executable}\n{code}")


VERSION = "0.34.0.dev5+g1234abcd"  # a vLLM development build's version names its commit


def shard_report(directory: Path, assigned: dict[str, str], env: os._Environ[str]) -> None:
    """A corpus shard's reports, written by kvconform's own writers: shard 2 fails."""
    sys.path.insert(0, str(REPO))
    from kvconform.harness.checks import CHECKS
    from kvconform.model.results import Failure, RunReport, ScenarioResult, Verdict
    from kvconform.reports import write_reports

    shard = (
        assigned.get("SHARD")
        or env.get("SHARD")
        or (f"{int(env['BUILDKITE_PARALLEL_JOB']) + 1}/{env['BUILDKITE_PARALLEL_JOB_COUNT']}")
    )
    index = int(shard.split("/")[0])
    failed = index == 2
    failures = [Failure("floor", "the live allocator holds 1 block, below the floor of 2",
                        party="live")] if failed else []  # fmt: skip
    result = ScenarioResult(f"s{index}", "scenarios/x.yaml", Verdict.FAILED if failed else
                            Verdict.PASSED, failures=failures, line=1)  # fmt: skip
    src = assigned.get("VLLM_SRC")
    report = RunReport(
        results=[result],
        input_errors=[],
        vllm_version=VERSION,
        vllm_source="src" if src else "installed",
        vllm_path=f"{src}/vllm" if src else "/usr/lib/python3/site-packages/vllm",
        checks=tuple(CHECKS),
        rerun_options=("--checks", ",".join(CHECKS)),
        shard=shard,
        exit_status=1 if failed else 0,
    )
    write_reports(report, directory)


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
