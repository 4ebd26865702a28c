"""``kvconform bisect --repo DIR --good REV --bad REV``: bisect a vLLM checkout's commits.

The user's checkout is only read. The bisection runs in a private clone,
``git clone --shared --no-checkout DIR`` under
``~/.cache/kvconform/bisect/<key>/checkout``: it borrows the checkout's
objects (no copy) but has its own refs, index and working tree, so neither
the user's files nor their own ``git bisect`` (``refs/bisect/*``,
``BISECT_LOG``) are touched. (A ``git worktree`` would also keep its bisect
refs apart -- git makes ``refs/bisect`` per worktree -- but it registers
itself in the user's ``.git/worktrees``; a clone writes nothing there.)

Both ends are probed first, exactly as in a release bisection. Then ``git
bisect start`` (terms good/bad, or broken/fixed with ``--find-fix``) and
``git bisect run python -m kvconform.bisect.gitprobe STATE_DIR``,
which probes each commit git picks with ``kvconform check --vllm-src`` on the
clone's tree. The tree under test is the checkout itself (it holds ``vllm/``);
its compiled parts come from the installed vLLM. An interrupted bisection
resumes by starting ``git bisect`` over: every probe already made answers from
the state file at once, and git, being deterministic, asks for them again.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kvconform.bisect import gitprobe
from kvconform.bisect.outcome import Outcome, describe_status, outcome_of, terms
from kvconform.bisect.probe import kvconform_env
from kvconform.bisect.releases_mode import ENDS_WRONG, FOUND, UNDECIDED
from kvconform.bisect.selection import bisect_key, select
from kvconform.bisect.state import BisectState, ProbeRecord
from kvconform.bisect.summary import (
    Say,
    flipped,
    print_flip_causes,
    print_flips,
    print_probes,
    probe_line,
)
from kvconform.errors import UsageError
from kvconform.paths import cache_dir

_FIRST = re.compile(r"^([0-9a-f]{40}) is the first (\w+) commit$")
_SHA = re.compile(r"^[0-9a-f]{40}$")


def run_git(where: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, check=check
    )


def resolve(repo: Path, rev: str, option: str) -> str:
    done = run_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if done.returncode != 0:
        raise UsageError(f"{option}: {rev!r} is not a commit of {repo}")
    return done.stdout.strip()


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return run_git(repo, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


def bisect_commits(args: argparse.Namespace, say: Say) -> int:
    if not args.good or not args.bad:
        raise UsageError("--repo needs --good REV (conforms) and --bad REV (does not)")
    repo = Path(args.repo).resolve()
    if run_git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise UsageError(f"--repo: {repo} is not a git checkout")
    good, bad = resolve(repo, args.good, "--good"), resolve(repo, args.bad, "--bad")
    if good == bad:
        raise UsageError("--good and --bad name the same commit")
    find_fix = bool(args.find_fix)
    old, new = (bad, good) if find_fix else (good, bad)
    if is_ancestor(repo, new, old):
        hint = "drop --find-fix" if find_fix else "add --find-fix to look for a fix"
        raise UsageError(
            f"the {'good' if find_fix else 'bad'} commit {new[:12]} is older than the "
            f"{'bad' if find_fix else 'good'} one {old[:12]}; {hint}"
        )
    selection = select(
        args.paths,
        args.expression,
        args.expectations,
        args.no_expectations,
        checks=getattr(args, "checks", None),
    )
    settings = {
        "mode": "commits",
        "repo": str(repo),
        "old": old,
        "new": new,
        "find_fix": find_fix,
        "selection": selection.digest,
    }
    key = bisect_key(**settings)
    state, resumed = BisectState.open(cache_dir("bisect", key), key, settings, fresh=args.fresh)
    if resumed:
        say(f"resuming the bisection saved in {state.path} ({len(state.probes)} probes done)")
    gitprobe.write_config(state, selection, find_fix, bool(args.fresh))
    checkout = prepare_clone(repo, state.directory / "checkout")
    count = run_git(repo, "rev-list", "--count", f"{old}..{new}").stdout.strip()
    say(
        f"bisecting {count} commits of {repo} after {old[:12]} up to {new[:12]} on "
        f"{len(selection.scenario_ids)} scenarios"
        + (f" with checks {','.join(selection.checks)}" if selection.checks_args() else "")
        + (", looking for the fix" if find_fix else "")
        + f", in a private clone at {checkout}"
    )
    term_old, term_new = terms(find_fix)
    ends = []
    for sha, want in ((old, Outcome.OLD), (new, Outcome.NEW)):
        run_git(checkout, "checkout", "--quiet", "--force", "--detach", sha)
        record = gitprobe.probe_commit(state, selection, checkout, fresh=args.fresh)
        title = f" {gitprobe.commit_title(checkout, sha)[:60]!r}"
        say(probe_line(state.number(record.label), record, find_fix, title))
        ends.append((record, outcome_of(record.run_status, find_fix) is want))
    if not all(ok for _, ok in ends):
        (a, _), (b, _) = ends
        say(
            f"\ncannot bisect: {term_old} end {a.label} is {describe_status(a.run_status)} "
            f"and {term_new} end {b.label} is {describe_status(b.run_status)}; --good must "
            "conform and --bad must not"
        )
        return ENDS_WRONG
    lines = drive_git_bisect(checkout, state, old, new, term_old, term_new, say)
    state.reload()
    first, maybe = read_conclusion(lines, term_new)
    if first is None and not maybe:
        raise UsageError("git bisect ended without a conclusion:\n" + "\n".join(lines[-10:]))
    new_sha = first or maybe[-1]
    new_record = state.probes.get(new_sha[:12])
    old_record = nearest_old_ancestor(checkout, state, new_sha, find_fix)
    say("")
    if first is not None:
        what = "fixed (first conforming)" if find_fix else "bad (first nonconforming)"
        subject = gitprobe.commit_title(checkout, first)
        say(f"First {what} commit: {first}  {subject!r}")
    else:
        say(
            f"Only commits that cannot be exercised are left: the first {term_new} commit "
            f"is any of {', '.join(s[:12] for s in maybe)}"
        )
    causes = []
    if old_record is not None and new_record is not None:
        flips = flipped(old_record, new_record)
        print_flips(flips, old_record.label, new_record.label, say)
        causes = print_flip_causes(flips, old_record if find_fix else new_record, say)
    else:
        flips = []
    print_probes(state, find_fix, say)
    state.result = {
        "first_new": first,
        "candidates": maybe,
        "last_old": old_record.label if old_record else None,
        "flipped": [f.to_json() for f in flips],
        "root_causes": [c.to_json() for c in causes],
        "probes": len(state.probes),
    }
    state.save()
    run_git(checkout, "bisect", "reset", "--quiet", check=False)
    shutil.rmtree(checkout, ignore_errors=True)  # the working tree is big; state and reports stay
    return FOUND if first is not None else UNDECIDED


def prepare_clone(repo: Path, checkout: Path) -> Path:
    if (checkout / ".git").exists():
        run_git(checkout, "bisect", "reset", "--quiet", check=False)
        return checkout
    shutil.rmtree(checkout, ignore_errors=True)
    done = subprocess.run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(repo), str(checkout)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise UsageError(f"--repo: cannot clone {repo}: {done.stderr.strip()}")
    return checkout


def drive_git_bisect(
    checkout: Path,
    state: BisectState,
    old: str,
    new: str,
    term_old: str,
    term_new: str,
    say: Say,
) -> list[str]:
    """``git bisect start`` and ``git bisect run`` in the clone; git's output lines."""
    started = run_git(
        checkout,
        "bisect", "start", f"--term-old={term_old}", f"--term-new={term_new}", new, old,
    )  # fmt: skip
    lines = started.stdout.splitlines()
    if any(_FIRST.match(line) for line in lines):
        return lines  # adjacent ends: git has concluded already
    for line in lines:
        say(f"git: {line}")
    script = [sys.executable, "-m", "kvconform.bisect.gitprobe", str(state.directory)]
    process = subprocess.Popen(
        ["git", "-C", str(checkout), "bisect", "run", *script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=kvconform_env(),
    )
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.rstrip("\n")
        lines.append(line)
        if line.startswith("probe "):
            say(line)
        elif line.startswith(("Bisecting:", "kvconform probe failed")) or line.startswith(
            "         "
        ):
            say(f"git: {line.strip()}" if line.startswith("Bisecting:") else line)
    process.wait()
    return lines


def read_conclusion(lines: list[str], term_new: str) -> tuple[str | None, list[str]]:
    """(first new commit, []) or (None, the commits it could be) from git's output."""
    for line in lines:
        match = _FIRST.match(line.strip())
        if match:
            return match.group(1), []
    maybe: list[str] = []
    collecting = False
    for line in lines:
        if "could be any of" in line:
            collecting = True
        elif collecting and _SHA.match(line.strip()):
            maybe.append(line.strip())
        elif collecting and maybe:
            break
    return None, maybe


def nearest_old_ancestor(
    checkout: Path, state: BisectState, new_sha: str, find_fix: bool
) -> ProbeRecord | None:
    """The probed old commit closest below the first new one: the other side of the flip."""
    best: tuple[int, ProbeRecord] | None = None
    for record in state.probes.values():
        if outcome_of(record.run_status, find_fix) is not Outcome.OLD:
            continue
        if not is_ancestor(checkout, record.label, new_sha):
            continue
        distance = int(
            run_git(checkout, "rev-list", "--count", f"{record.label}..{new_sha}").stdout
        )
        if best is None or distance < best[0]:
            best = (distance, record)
    return best[1] if best else None
