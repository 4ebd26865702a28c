"""Commit bisection on a synthetic vLLM history (see ``vllm_history.py``).

The history is the installed vLLM's Python tree with a bug injected at a known
commit (``allocate_slots`` drops the lookahead) and, before it, a commit whose
``vllm/v1/request.py`` does not parse. Bisection must name the injected commit,
skip the broken one, say which scenario flipped, and leave the user's checkout
and the user's own ``git bisect`` exactly as they were. Each probe imports vLLM
in a fresh process, so these tests are slow; nothing here needs the network.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import vllm_history

from kvconform.fronts.cli import main

SCENARIO = Path(__file__).parent / "data" / "bisect" / "eagle-decode-lookahead.yaml"
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    repo = tmp_path_factory.mktemp("history") / "vllm"
    return repo, vllm_history.build_history(repo)


def kvconform(*args: str, cache: Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVCONFORM_CACHE": str(cache), **vllm_history.GIT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "kvconform", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


def snapshot(repo: Path) -> dict[str, object]:
    """Everything of the user's checkout a bisection must not touch."""
    git = vllm_history.git
    return {
        "refs": git(repo, "for-each-ref"),
        "head": git(repo, "rev-parse", "HEAD"),
        "symbolic": git(repo, "rev-parse", "--symbolic-full-name", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "bisect_log": git(repo, "bisect", "log"),
        "git_dir": sorted(p.name for p in (repo / ".git").iterdir()),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
    }


@pytest.mark.slow
def test_bisect_repo_names_the_injected_commit(history, tmp_path):
    repo, shas = history
    # The user is in the middle of their own bisection: it must survive ours.
    vllm_history.git(repo, "bisect", "start")
    vllm_history.git(repo, "bisect", "bad", shas["later"])
    vllm_history.git(repo, "bisect", "good", shas["docs"])
    before = snapshot(repo)
    assert "refs/bisect/bad" in str(before["refs"])

    args = ["bisect", "--repo", str(repo), "--good", shas["base"], "--bad", shas["later"]]
    done = kvconform(*args, str(SCENARIO), cache=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"First bad (first nonconforming) commit: {shas['bug']}" in out
    assert "eagle-decode-lookahead: passed -> failed" in out
    assert re.search(rf"probe \d: {shas['broken'][:12]} .*not exercisable -> skip", out), out
    assert "SyntaxError" in out
    probes = re.findall(r"^probe (\d+): ([0-9a-f]{12})", out, re.MULTILINE)
    assert [sha for _, sha in probes[:2]] == [shas["base"][:12], shas["later"][:12]]
    # git's own midpoint is the broken commit, so the skip adds one probe to the budget.
    assert len(probes) <= math.ceil(math.log2(len(shas))) + 2 + 1
    for _, sha in probes:
        assert list((tmp_path / "bisect" / "probes").glob(f"*/{sha}/report.json"))
    assert snapshot(repo) == before

    # Leave the private clone as an interrupt would: mid-bisection, on some commit.
    state_file = Path(re.search(r"^State: (.+)$", out, re.MULTILINE).group(1))
    checkout = state_file.parent / "checkout"
    assert not checkout.exists()  # removed once the bisection ended
    subprocess.run(["git", "clone", "-q", "--shared", str(repo), str(checkout)], check=True)
    vllm_history.git(checkout, "bisect", "start", shas["later"], shas["base"])

    again = kvconform(*args, str(SCENARIO), cache=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming the bisection" in again.stdout
    lines = [line for line in again.stdout.splitlines() if line.startswith("probe ")]
    assert lines and all(line.endswith("[cached]") for line in lines)
    assert f"commit: {shas['bug']}" in again.stdout
    assert snapshot(repo) == before


@pytest.mark.slow
def test_check_drives_a_users_git_bisect_run(history, tmp_path):
    repo, shas = history
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True)
    vllm_history.git(clone, "bisect", "start", shas["later"], shas["base"])
    env = {**os.environ, "KVCONFORM_CACHE": str(tmp_path / "cache"), **vllm_history.GIT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "kvconform", "check", "--vllm-src", ".", str(SCENARIO)]
    done = subprocess.run(
        ["git", "-C", str(clone), "bisect", "run", *command],
        capture_output=True,
        text=True,
        env=env,
    )
    out = done.stdout + done.stderr
    assert f"{shas['bug']} is the first bad commit" in out, out
    assert "check: exit 125 for git bisect (run status 3)" in out  # the broken commit


def test_bisect_repo_refuses_reversed_ends(history, tmp_path, capsys, monkeypatch):
    repo, shas = history
    monkeypatch.setenv("KVCONFORM_CACHE", str(tmp_path))
    args = ["bisect", "--repo", str(repo), "--good", shas["later"], "--bad", shas["base"]]
    assert main([*args, str(SCENARIO)]) == 2
    assert "add --find-fix" in capsys.readouterr().out
    assert main(["bisect", "--repo", str(repo), "--good", "nosuchrev", "--bad", "HEAD"]) == 2
    assert "'nosuchrev' is not a commit" in capsys.readouterr().out
    assert main(["bisect", "--repo", str(repo), str(SCENARIO)]) == 2
    assert "--good" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["check", "--no-such-option"], ["check", "no/such/scenarios"], ["check", "-k", "("]]
)
def test_check_aborts_git_bisect_on_bad_usage(argv, capsys):
    # 2 would tell git "bad"; a usage error must abort the bisection instead.
    assert main(argv) == 128
