"""The CI recipes in ci/ run only commands that exist: kvconform's and the Makefile's.

docs/ci.md tells a nightly job to copy ci/buildkite.yml or ci/github-actions.yml as they
are. A recipe that names a removed flag or target would fail only on the CI machine, at
night, so this test parses both files, takes every command they run, and checks each
``kvconform`` invocation against the command line's own parser (with the CI variables
filled in) and each ``make`` target against the Makefile.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvconform.fronts.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
RECIPES = {"buildkite": REPO / "ci" / "buildkite.yml", "github": REPO / "ci" / "github-actions.yml"}


def buildkite_commands(doc: dict[str, Any]) -> list[str]:
    commands: list[str] = []
    for step in doc["steps"]:
        if not isinstance(step, dict):
            continue
        command = step.get("command", step.get("commands", []))
        commands += [command] if isinstance(command, str) else list(command)
    # `$$` is Buildkite's escape for a `$` the agent's shell sees.
    return [c.replace("$$", "$") for c in commands]


def github_commands(doc: dict[str, Any]) -> list[str]:
    return [
        step["run"]
        for job in doc["jobs"].values()
        for step in job["steps"]
        if isinstance(step, dict) and "run" in step
    ]


def filled_in(command: str) -> str:
    """The command as the CI machine's shell would run it, with sample values."""
    command = re.sub(r"\$\{\{\s*matrix\.shard\s*\}\}", "1", command)
    command = re.sub(r"\$\{\{[^}]*\}\}", "x", command)
    command = re.sub(r"\$\(date [^)]*\)", "20260101", command)
    command = re.sub(r"\$\(cat [^)]*\)", "0", command)
    samples = {"SHARDS": "4", "FUZZ_EXAMPLES": "20000", "BUILDKITE_PARALLEL_JOB": "0"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: samples.get(m.group(1), "x"), command)


def invocations(command: str, program: str) -> list[list[str]]:
    """Each call of ``program`` in a shell command line, as its argument words."""
    calls = []
    for part in re.split(r"\s*(?:&&|\|\||;|\||\n)\s*", filled_in(command)):
        words = shlex.split(part.split(" < ")[0].split(" > ")[0].split(" >> ")[0])
        if words and Path(words[0]).name == program:
            calls.append(words[1:])
    return calls


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*):", text, re.MULTILINE))


@pytest.fixture(params=sorted(RECIPES))
def recipe(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    doc = yaml.safe_load(RECIPES[request.param].read_text())
    read = buildkite_commands if request.param == "buildkite" else github_commands
    return request.param, read(doc)


def test_every_kvconform_command_parses_with_the_cli(recipe):
    name, commands = recipe
    calls = [call for command in commands for call in invocations(command, "kvconform")]
    assert {call[0] for call in calls} >= {"run", "fuzz", "merge"}, name
    parser = build_parser()
    for call in calls:
        try:
            parser.parse_args(call)
        except SystemExit:  # argparse has printed what is wrong
            pytest.fail(f"{RECIPES[name].name}: `kvconform {shlex.join(call)}` does not parse")


def test_every_make_target_exists(recipe):
    name, commands = recipe
    targets = make_targets()
    calls = [call for command in commands for call in invocations(command, "make")]
    assert calls, name
    for call in calls:
        for target in (w for w in call if not w.startswith("-") and "=" not in w):
            assert target in targets, f"{RECIPES[name].name}: make {target}: no such target"


def test_the_recipes_shard_and_publish_what_docs_ci_md_says():
    buildkite = yaml.safe_load(RECIPES["buildkite"].read_text())
    steps = [s for s in buildkite["steps"] if isinstance(s, dict)]
    corpus = next(s for s in steps if s.get("key") == "corpus")
    assert corpus["agents"]["queue"] == "gpu" and corpus["parallelism"] > 1
    plugins = [p for s in steps for p in s.get("plugins", [])]
    assert any(next(iter(p)).startswith("junit-annotate#") for p in plugins)
    assert any("junit.xml" in str(p) for p in plugins)
    text = "\n".join(buildkite_commands(buildkite))
    assert "buildkite-agent annotate" in text and "summary.md" in text
    artifacts = " ".join(a for s in steps for a in s.get("artifact_paths", []))
    assert "build/report/merged" in artifacts and "build/fuzz/**/*.yaml" in artifacts

    github = yaml.safe_load(RECIPES["github"].read_text())
    jobs = github["jobs"]
    assert len(jobs["corpus"]["strategy"]["matrix"]["shard"]) == int(github["env"]["SHARDS"])
    runs = "\n".join(github_commands(github))
    assert '>> "$GITHUB_STEP_SUMMARY"' in runs and "--shard" in runs
    uploads = [
        s for job in jobs.values() for s in job["steps"] if "upload-artifact" in s.get("uses", "")
    ]
    assert {job for job in jobs if any(s in uploads for s in jobs[job]["steps"])} == set(jobs)
    assert jobs["merge"]["if"] == "always()" and jobs["merge"]["needs"] == "corpus"
