"""The CI recipes in ci/ run as written, judge the vLLM they are given, and run what make nightly runs.

docs/ci.md tells vLLM's pipeline to upload ci/buildkite.yml (or copy ci/github-actions.yml).
A recipe that names a removed flag or target, drops the vLLM under test on the way, or
pays the full install where it only reads reports would fail (or, worse, pass) only on the
CI machine, at night. So:

* every ``kvconform`` invocation parses with the command line's own parser, every ``make``
  target exists;
* every command of every job **runs here**, in a stand-in vLLM checkout, with stand-ins for
  git, make and buildkite-agent on ``PATH`` (``ci_standin.py``), once per way of giving the
  vLLM under test (the image's installed vLLM, a wheel, a source checkout): the vLLM under
  test reaches every ``make install-nightly`` / ``make nightly``, kvconform is checked out at
  the pinned commit, and the merge step runs the real ``kvconform merge`` and the nightly's
  summary in a light install where vLLM, torch and NumPy cannot be imported;
* the Makefile passes the vLLM under test and the parts on to ``tools/nightly.sh``, sets
  pip's cache under ``KVCONFORM_CACHE``, and its light install installs no extra;
* ``tools/nightly.sh`` itself, with a stand-in interpreter, hands ``--vllm-src`` to every
  kvconform command, runs the parts asked for, and prints the bisect command with the
  nightly's checks;
* timeouts everywhere; exit 3 retried, exit 1 never (Buildkite's ``retry`` and
  ``tools/retry-not-exercised.sh``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import ci_standin
import pytest
import yaml

from kvconform.fronts.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
RECIPES = {"buildkite": REPO / "ci" / "buildkite.yml", "github": REPO / "ci" / "github-actions.yml"}
PARTS = {"corpus", "fuzz", "explore", "mutate", "cuda"}
PINNED = re.compile(r"^[0-9a-f]{40}$")
UPLOAD_ENV = {  # what vLLM's uploading step gives ci/buildkite.yml (docs/ci.md)
    "KVCONFORM_REPO": "https://example.invalid/kvconform.git",
    "KVCONFORM_REF": "2a3892dec25f5c3377fe6b3849253af550fb3cab",
    "VLLM_CI_IMAGE": "vllm-ci:abc",
}


# -- reading the recipes -------------------------------------------------------------------


def upload_interpolated(text: str, env: dict[str, str]) -> str:
    """The recipe as Buildkite reads it after ``pipeline upload`` in ``env``: ``$$`` is a
    ``$`` left for the agent's shell, ``${X?msg}`` must be set, ``${X:-d}`` has a default."""

    def value(match: re.Match[str]) -> str:
        name, op, rest = match.group(1), match.group(2), match.group(3)
        if op == "?":
            assert env.get(name), f"the uploading step must set {name}: {rest}"
            return env[name]
        return env.get(name) or (rest if op == ":-" else "")

    parts = text.split("$$")
    pattern = re.compile(r"\$\{(\w+)(\?|:-)?([^}]*)\}")
    return "$".join(pattern.sub(value, part) for part in parts)


def buildkite_steps(env: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load(upload_interpolated(RECIPES["buildkite"].read_text(), env))
    return doc, [
        s for s in doc["steps"] if isinstance(s, dict) and ("command" in s or "plugins" in s)
    ]


def commands_of(step: dict[str, Any]) -> list[str]:
    command = step.get("command", step.get("commands", []))
    return [command] if isinstance(command, str) else list(command)


def github_doc(env: dict[str, str]) -> dict[str, Any]:
    text = RECIPES["github"].read_text()
    return yaml.safe_load(text)


def github_expr(text: str, context: dict[str, str]) -> str:
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: context.get(m.group(1), ""), text)


def all_commands() -> dict[str, list[str]]:
    _, steps = buildkite_steps({**UPLOAD_ENV})
    doc = github_doc({})
    github = [s["run"] for job in doc["jobs"].values() for s in job["steps"] if "run" in s]
    return {"buildkite": [c for s in steps for c in commands_of(s)], "github": github}


def invocations(command: str, program: str) -> list[list[str]]:
    """Each call of ``program`` in a shell command line, as its argument words."""
    command = re.sub(r"\$\{\{[^}]*\}\}", "x", command)
    command = re.sub(r"\$\([^()]*\)", "x", command)  # a command substitution's value
    calls = []
    for part in re.split(r"\s*(?:&&|\|\||;|\||\n)\s*", command):
        try:
            words = shlex.split(part.split(" < ")[0].split(" > ")[0].split(" >> ")[0])
        except ValueError:
            continue
        if words[:1] == ["bash"] and words[1].endswith("retry-not-exercised.sh"):
            words = words[3:]  # tools/retry-not-exercised.sh N COMMAND...
        if words and Path(words[0]).name == program:
            calls.append(words[1:])
    return calls


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_kvconform_command_parses_and_every_make_target_exists(name):
    commands = all_commands()[name]
    calls = [call for command in commands for call in invocations(command, "kvconform")]
    assert {call[0] for call in calls} == {"merge"}, name  # the rest runs in tools/nightly.sh
    for call in calls:
        try:
            build_parser().parse_args(call)
        except SystemExit:
            pytest.fail(f"{RECIPES[name].name}: `kvconform {shlex.join(call)}` does not parse")
    targets = set(re.findall(r"^([A-Za-z][\w.-]*):", (REPO / "Makefile").read_text(), re.M))
    makes = [call for command in commands for call in invocations(command, "make")]
    used = set()
    for call in makes:
        words = [w for i, w in enumerate(call) if w != "-C" and (i == 0 or call[i - 1] != "-C")]
        used |= {w for w in words if "=" not in w and not w.startswith("-")}
    assert used == {"install-nightly", "install-light", "nightly"} and used <= targets


# -- running the recipes against stand-ins ---------------------------------------------------

MODES = {
    "installed": {},
    "wheel": {"VLLM_WHEEL": "dist/vllm-0.34.0.dev5-cp312-linux_x86_64.whl"},
    "src": {"VLLM_SRC": "."},
}


def run_shell(command: str, cwd: Path, env: dict[str, str], stdin: str = "") -> int:
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=cwd, env=env,
                          input=stdin, text=True, capture_output=True)  # fmt: skip
    if done.returncode not in (0, 1):
        print(command, done.stdout, done.stderr, sep="\n")
    return done.returncode


def standin_env(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    ci_standin.install_standins(bin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVCONFORM_"))}
    env.update(extra)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["STANDIN_LOG"] = str(tmp_path / "calls.jsonl")
    return env


def run_buildkite(tmp_path: Path, mode: dict[str, str]) -> tuple[Path, list[dict], dict]:
    checkout = tmp_path / "vllm"  # Buildkite's job starts in the checkout of vLLM
    checkout.mkdir()
    doc, steps = buildkite_steps({**UPLOAD_ENV, **mode})
    env = standin_env(tmp_path, {k: str(v) for k, v in doc["env"].items()})
    env["BUILDKITE_COMMIT"] = "fedcba9876543210fedcba9876543210fedcba98"
    statuses = {}
    for step in steps:
        for job in range(int(step.get("parallelism", 1))):
            job_env = {**env, "BUILDKITE_PARALLEL_JOB": str(job),
                       "BUILDKITE_PARALLEL_JOB_COUNT": str(step.get("parallelism", 1))}  # fmt: skip
            for command in commands_of(step):
                statuses[step.get("key", step["label"])] = run_shell(command, checkout, job_env)
    return checkout, ci_standin.read_log(tmp_path / "calls.jsonl"), statuses


def run_github(tmp_path: Path, mode: dict[str, str]) -> tuple[Path, list[dict], dict]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    doc = github_doc({})
    context = {"github.workspace": str(workspace), "inputs.vllm_wheel": mode.get("VLLM_WHEEL", "")}
    env_values = {k: github_expr(str(v), context) for k, v in doc["env"].items()}
    if "VLLM_SRC" in mode:  # the recipe's comment: the checkout of this commit
        env_values["VLLM_SRC"] = f"{workspace}/vllm"
    env = standin_env(tmp_path, env_values)
    env.update(GITHUB_WORKSPACE=str(workspace), GITHUB_SHA="fedcba9876543210fedcba9876543210fedcba98",
               GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"))  # fmt: skip
    context.update({f"env.{k}": v for k, v in env_values.items()})
    uploads: dict[str, Path] = {}
    statuses: dict[str, int] = {}
    for name, job in doc["jobs"].items():
        shards = job.get("strategy", {}).get("matrix", {}).get("shard", [None])
        for shard in shards:
            ctx = {**context, "matrix.shard": str(shard)}
            failed = False
            for step in job["steps"]:
                if failed and step.get("if") != "always()":
                    continue
                uses, with_ = step.get("uses", ""), step.get("with", {})
                if uses.startswith("actions/checkout"):
                    path = workspace / with_.get("path", ".")
                    if "repository" in with_:
                        ci_standin.fake_checkout(path)
                        ref = github_expr(with_["ref"], ctx)
                        ci_standin_log(env, {"tool": "checkout", "ref": ref})
                    else:
                        path.mkdir(parents=True, exist_ok=True)
                elif uses.startswith("actions/upload-artifact"):
                    uploads[github_expr(with_["name"], ctx)] = workspace / github_expr(
                        with_["path"], ctx
                    )
                elif uses.startswith("actions/download-artifact"):
                    pattern = with_["pattern"].replace("*", ".*")
                    for artifact, source in uploads.items():
                        if re.fullmatch(pattern, artifact) and source.is_dir():
                            target = workspace / with_["path"] / artifact
                            target.mkdir(parents=True, exist_ok=True)
                            for file in source.iterdir():
                                (target / file.name).write_bytes(file.read_bytes())
                elif "run" in step:
                    status = run_shell(github_expr(step["run"], ctx), workspace, env)
                    statuses[f"{name}/{step.get('name')}"] = status
                    failed = failed or status != 0
    return workspace, ci_standin.read_log(tmp_path / "calls.jsonl"), statuses


def ci_standin_log(env: dict[str, str], entry: dict[str, Any]) -> None:
    with open(env["STANDIN_LOG"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_recipes_run_and_pass_the_vllm_under_test_through(recipe, mode, tmp_path):
    run = run_buildkite if recipe == "buildkite" else run_github
    root, calls, statuses = run(tmp_path, MODES[mode])
    makes = [c for c in calls if c["tool"] == "make"]
    src = str(root if recipe == "buildkite" else root / "vllm") if mode == "src" else ""
    wheel = MODES[mode].get("VLLM_WHEEL", "")

    # kvconform at the pinned commit, in every job.
    refs = [c["args"][-1] for c in calls if c["tool"] == "git" and "checkout" in c["args"]]
    refs += [c["ref"] for c in calls if c["tool"] == "checkout"]
    assert refs and all(PINNED.match(ref) for ref in refs), refs

    nightly = [m for m in makes if m["targets"] == ["nightly"]]
    installs = [m for m in makes if m["targets"] == ["install-nightly"]]
    assert len(nightly) == len(installs) == 8  # 4 corpus shards, 2 fuzz shards, explore, mutate
    for call in nightly:
        assert call["vars"]["NIGHTLY_PYTHON"] == "python3", call  # the image's vLLM, no .venv
        assert call["vars"].get("VLLM_SRC", call["env"]["VLLM_SRC"]) == src, call
    for call in installs:
        assert call["vars"]["NIGHTLY_PYTHON"] == "python3", call
        assert call["vars"].get("VLLM_WHEEL", "") == wheel, call
    parts = [p for call in nightly for p in call["vars"]["NIGHTLY_PARTS"].split()]
    assert set(parts) == PARTS
    assert sorted(c["vars"].get("SHARD") or str(int(c["env"]["BUILDKITE_PARALLEL_JOB"]) + 1)
                  for c in nightly if c["vars"]["NIGHTLY_PARTS"] == "corpus") == [
        s if recipe == "buildkite" else f"{s}/4" for s in "1234"
    ]  # fmt: skip

    # The merge step: the light install only, and the real `kvconform merge` in it.
    lights = [m for m in makes if m["targets"] == ["install-light"]]
    assert len(lights) == 1
    merged = root / "build" / "kvconform" / "merged"
    report = json.loads((merged / "report.json").read_text())
    assert report["exit_status"] == 1 and len(report["scenarios"]) == 4
    shown = (
        next(c["stdin"] for c in calls if c["tool"] == "buildkite-agent" and c["args"][0] == "annotate")
        if recipe == "buildkite"
        else (tmp_path / "step-summary.md").read_text()
    )  # fmt: skip
    assert "kvconform bisect --repo VLLM_CHECKOUT --good LAST_GREEN_COMMIT --bad fedcba98" in shown
    assert "scenarios --checks all" in shown
    assert (merged / "nightly.txt").read_text().count("kvconform bisect") == 1
    merge_status = statuses["merge" if recipe == "buildkite" else "merge/merge"]
    assert merge_status == 1  # the nonconformance the shards found, not green


# -- the Makefile, the light install, tools/nightly.sh ----------------------------------------


def make_dry(*args: str) -> str:
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_makefile_passes_the_vllm_under_test_to_the_nightly_script():
    out = make_dry("nightly", "NIGHTLY_PYTHON=python3", "VLLM_SRC=/src/vllm", "NIGHTLY_PARTS=corpus",
                   "SHARD=2/4")  # fmt: skip
    assert "PYTHON='python3' VLLM_SRC='/src/vllm' NIGHTLY_PARTS='corpus'" in out
    assert "SHARD='2/4' bash tools/nightly.sh" in out
    out = make_dry("install-nightly", "NIGHTLY_PYTHON=python3", "VLLM_WHEEL=dist/v.whl")
    assert out.splitlines() == [
        "python3 -m pip install -q 'dist/v.whl'", "python3 -m pip install -q -e '.[nightly]'",
    ]  # fmt: skip
    light = make_dry("install-light")
    assert "-e ." in light and "[" not in light  # no extra: no vLLM, no torch
    default = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), "--eval", "show-pip-cache: ; @echo $$PIP_CACHE_DIR",
         "show-pip-cache", "KVCONFORM_CACHE=/cache/kvconform"],
        capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "PIP_CACHE_DIR"},
    )  # fmt: skip
    assert default.stdout.strip() == "/cache/kvconform/pip"


def test_the_light_install_has_no_heavy_dependency():
    pyproject = (REPO / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*)\]$", pyproject, re.M).group(1)
    assert not re.search(r"vllm|torch|numpy|matplotlib|hypothesis", dependencies)
    nightly = re.search(r"^nightly = \[(.*)\]$", pyproject, re.M).group(1)
    assert not re.search(r"vllm|torch", nightly)


def write_shards(root: Path, count: int = 2) -> list[Path]:
    dirs = []
    for index in range(1, count + 1):
        folder = root / f"shard-{index}"
        ci_standin.shard_report(folder, {"SHARD": f"{index}/{count}"}, os.environ)  # type: ignore[arg-type]
        dirs.append(folder)
    return dirs


def test_merge_runs_where_vllm_torch_and_numpy_cannot_be_imported(tmp_path):
    dirs = write_shards(tmp_path)
    code = ci_standin.LIGHT_KVCONFORM.replace(
        "sys.exit(main(sys.argv[1:]))",
        "status = main(sys.argv[1:])\n"
        f"assert not {{m.partition('.')[0] for m in sys.modules}} & set({ci_standin.BLOCKED!r})\n"
        "sys.exit(status)",
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "merge", *map(str, dirs), "--report-dir", str(tmp_path / "m")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # shard 2 failed
    assert "merged 2 shards" in done.stdout
    assert {p.name for p in (tmp_path / "m").iterdir()} >= {
        "report.json",
        "summary.md",
        "report.html",
    }


FAKE_PYTHON = """#!/bin/sh
# A stand-in interpreter: kvconform's commands are logged (a corpus run writes a failing
# report); pytest finds nothing; anything else runs on the real interpreter.
if [ "$1" = "-m" ] && [ "$2" = "kvconform" ]; then
    shift 2
    printf '%s\\n' "$*" >> "$NIGHTLY_LOG"
    if [ "$1" = run ]; then
        while [ "$#" -gt 0 ]; do [ "$1" = --report-dir ] && dir=$2; shift; done
        exec {python} -c "import sys; sys.path.insert(0, {tests!r}); import ci_standin, os, pathlib
ci_standin.shard_report(pathlib.Path('$dir'), {{'SHARD': '2/2', 'VLLM_SRC': os.environ.get('VLLM_SRC', '')}}, os.environ)
sys.exit(1)"
    fi
    exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then printf 'pytest %s\\n' "$*" >> "$NIGHTLY_LOG"; exit 5; fi
exec {python} "$@"
"""


@pytest.mark.parametrize("parts", ["corpus fuzz explore mutate cuda", "fuzz", "explore", "mutate cuda"])
def test_the_nightly_script_judges_the_vllm_under_test(tmp_path, parts):
    python = tmp_path / "python"
    tests = str(Path(__file__).resolve().parent)
    python.write_text(FAKE_PYTHON.format(python=sys.executable, tests=tests))
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHON": str(python), "VLLM_SRC": "/src/vllm", "NIGHTLY_PARTS": parts,
           "NIGHTLY_LOG": str(log), "NIGHTLY_GOOD": "0123abcd", "FUZZ_EXAMPLES": "10",
           "EXPLORE_BUDGET": "5"}  # fmt: skip
    out = tmp_path / "nightly"
    done = subprocess.run(["bash", str(REPO / "tools" / "nightly.sh"), str(out)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    calls = log.read_text().splitlines()
    kvconform = [shlex.split(c) for c in calls if not c.startswith("pytest")]
    commands = {"corpus": "run", "fuzz": "fuzz", "explore": "explore", "mutate": "mutate"}
    assert [c[0] for c in kvconform] == [commands[p] for p in parts.split() if p != "cuda"]
    for call in kvconform:
        assert call[call.index("--vllm-src") + 1] == "/src/vllm", call
        build_parser().parse_args(call)  # what the script runs parses
    assert any(c.startswith("pytest") for c in calls) == ("cuda" in parts)
    summary = (out / "nightly.txt").read_text()
    if "corpus" in parts:
        assert done.returncode == 1, done.stdout + done.stderr  # the corpus's status
        assert "--checks all" in shlex.join(kvconform[0])
        bisect = "kvconform bisect --repo /src/vllm --good 0123abcd --bad 1234abcd scenarios --checks all"
        assert bisect in summary and bisect in (out / "summary.md").read_text()
    else:
        assert done.returncode == 0 and "kvconform bisect" not in summary
    assert all(f"{p} exit" in summary for p in parts.split())


def test_make_nightly_the_recipes_and_the_docs_name_the_same_parts():
    script = (REPO / "tools" / "nightly.sh").read_text()
    assert re.search(r"PARTS=\$\{NIGHTLY_PARTS:-corpus fuzz explore mutate cuda\}", script)
    assert "NIGHTLY_PARTS ?= corpus fuzz explore mutate cuda" in (REPO / "Makefile").read_text()
    for doc in ("docs/gpu.md", "docs/ci.md"):
        text = (REPO / doc).read_text()
        assert "tools/nightly.sh" in text and "corpus fuzz explore mutate cuda" in text, doc
    assert "tools/nightly.sh" in (REPO / "tools" / "gpu-run.sh").read_text()


# -- timeouts and retries -------------------------------------------------------------------


def test_every_job_has_a_timeout_and_retries_exit_3_never_exit_1():
    _, steps = buildkite_steps({**UPLOAD_ENV})
    for step in steps:
        assert step.get("timeout_in_minutes"), step["label"]
        if step.get("agents", {}).get("queue") == "gpu":
            statuses = {r["exit_status"] for r in step["retry"]["automatic"]}
            assert 3 in statuses and 1 not in statuses and "*" not in statuses, step["label"]
    github = github_doc({})
    for name, job in github["jobs"].items():
        assert job.get("timeout-minutes"), name
        for step in job["steps"]:
            if "make -C kvconform nightly" in step.get("run", ""):
                assert step["run"].startswith("bash kvconform/tools/retry-not-exercised.sh "), name


@pytest.mark.parametrize(("statuses", "runs", "final"), [
    ([3, 3, 0], 3, 0), ([1], 1, 1), ([3, 1], 2, 1), ([3, 3, 3, 3], 3, 3), ([0], 1, 0), ([2], 1, 2),
])  # fmt: skip
def test_retry_not_exercised_retries_exit_3_only(tmp_path, statuses, runs, final):
    counter = tmp_path / "n"
    counter.write_text("0")
    script = (
        f"n=$(cat {counter}); echo $((n + 1)) > {counter}; "
        f"set -- {' '.join(map(str, statuses))}; shift $n; exit ${{1:-0}}"
    )
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "retry-not-exercised.sh"), "2", "bash", "-c", script],
        env={**os.environ, "RETRY_DELAY": "0"}, capture_output=True, text=True,
    )  # fmt: skip
    assert (done.returncode, int(counter.read_text())) == (final, runs)


# -- what docs/ci.md shows vLLM's pipeline -----------------------------------------------------


def test_docs_ci_shows_the_step_vllms_pipeline_adds():
    text = (REPO / "docs" / "ci.md").read_text()
    assert "buildkite-agent pipeline upload .kvconform/ci/buildkite.yml" in text
    assert re.search(r"KVCONFORM_REF: [0-9a-f]{40}", text)
    header = RECIPES["buildkite"].read_text().split("\nenv:")[0]
    assert "buildkite-agent pipeline upload .kvconform/ci/buildkite.yml" in header
    github = github_doc({})
    assert PINNED.match(github["env"]["KVCONFORM_REF"])
