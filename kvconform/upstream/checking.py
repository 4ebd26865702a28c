"""``make upstream-check``: each finding's reproducer and fix, in vLLM's own test tree.

For every finding of the catalogue (:mod:`kvconform.upstream.catalogue`), in a copy of
its release's test tree (the ``tests/`` of the release's sdist, fetched and cached by
:mod:`kvconform.peer`) with the reproducer put where it belongs:

1. **fails on the release**: pytest over the reproducer, with the release's ``vllm/``
   (the installed vLLM when it is that release, else its Python tree ahead of the
   installed compiled parts), reports at least one failed test and no collection error;
2. **passes with the fix**: the same with a copy of the release's tree the fix's patch
   was applied to (``patch -p1``), and, for a finding vLLM fixed (``fixed_in``), with
   that release's tree and its own test tree;
3. **vLLM's own tests stay green** (a fix kvconform proposes): the files of the peer
   selection that reach the functions the fix changes (the peer's reach map), with the
   fix alone; then, once per release, the whole green selection (``tests/v1/core`` and
   the worker and spec-decode files that run without a GPU, less what fails on the
   unmodified release here) with every proposed fix of the release applied together.

The peer suite's baseline and reach map are computed once per release and cached
(``python -m kvconform.peer survey``, about 20 minutes on a 2-core machine); the runs
here reuse them. The result is a table and an exit status: 0 when every step holds.
"""

from __future__ import annotations

import compileall
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kvconform.errors import KvconformError
from kvconform.harness.releases import release_tree
from kvconform.peer import PeerOutcome, PeerSuite, Verdict, prepare
from kvconform.peer.environment import installed_vllm_version
from kvconform.peer.runner import PytestRun, run_pytest
from kvconform.upstream.catalogue import Catalogue, Finding

__all__ = ["Step", "check", "reproducer_run"]

REPRODUCER_TIMEOUT = 900.0
OWN_TESTS_TIMEOUT = 5400.0


@dataclass
class Step:
    finding: int | None  # None: the release's combined run
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        who = f"#{self.finding}" if self.finding is not None else "all"
        return f"{mark} {who:>4}  {self.name}: {self.detail} ({self.seconds:.0f} s)"


@dataclass
class _Release:
    """One release's test tree copy, its peer suite, and its trees."""

    version: str
    suite: PeerSuite
    tests: Path  # the copy of the suite folder, reproducers added
    tree: Path | None  # the release's vllm tree for the runs; None: the installed vLLM
    trees: dict[str, Path] = field(default_factory=dict)


def _tree_of(version: str) -> Path | None:
    return None if installed_vllm_version() == version else release_tree(version)


def _release(version: str, work: Path, cache: dict[str, _Release]) -> _Release:
    if version not in cache:
        tree = _tree_of(version)
        suite = prepare(version, reference_tree=tree)
        tests = work / f"tests-{version}"
        if tests.exists():
            shutil.rmtree(tests)
        shutil.copytree(suite.suite, tests, symlinks=True)
        cache[version] = _Release(version, suite, tests, tree)
    return cache[version]


def _patched(version: str, patches: Iterable[Path], into: Path) -> Path:
    """A copy of release ``version``'s Python tree with ``patches`` applied in order.

    The path returned is absolute: it goes on the ``PYTHONPATH`` of a pytest run in the
    release's test tree, where a relative one would name nothing and the unpatched vLLM
    would be imported instead (``make upstream-check`` passes ``--work build/upstream``).

    The copy is byte-compiled at both optimization levels. Every pytest run imports it,
    and some of vLLM's tests import it again in a subprocess under a time limit (``python
    -O`` in ``test_kv_cache_planning.py::test_is_kv_cache_spec_uniform``, 60 s); where no
    bytecode is written (``PYTHONDONTWRITEBYTECODE``) each import compiled the whole of
    vLLM anew, and on the loaded 2-core machine that subprocess ran past its limit.
    """
    into = into.resolve()
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(release_tree(version), into, symlinks=True)
    for patch in patches:
        done = subprocess.run(
            ["patch", "-p1", "--forward", "--no-backup-if-mismatch", "-i", str(patch)],
            cwd=into,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise KvconformError(
                f"{patch.name} does not apply to vLLM {version}: "
                f"{(done.stdout + done.stderr).strip()[-400:]}"
            )
    for level in (0, 1):
        compileall.compile_dir(into / "vllm", quiet=1, optimize=level)
    return into


def reproducer_run(release: _Release, finding: Finding, tree: Path | None) -> PytestRun:
    """pytest over ``finding``'s reproducer in the release's test tree copy."""
    destination = release.tests / finding.destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(finding.reproducer, destination)
    return run_pytest(
        release.tests,
        [finding.destination],
        release.suite.env(tree),
        timeout=REPRODUCER_TIMEOUT,
    )


def _summary(done: PytestRun) -> str:
    counts = done.counts()
    shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    first = next(
        (r for r in done.records if r["outcome"] == "failed"),
        None,
    )
    why = f"; first: {first['nodeid'].split('::')[-1]}: {first.get('message', '')[:200]}" if first else ""
    return (shown or f"exit {done.returncode}") + why


def _fails(done: PytestRun, every_test: bool = False) -> bool:
    """A failed test and no collection error; with ``every_test``, none passed or skipped."""
    counts = done.counts()
    fails = counts["failed"] > 0 and counts["collect_errors"] == 0 and counts["errors"] == 0
    return fails and not (every_test and (counts["passed"] or counts["skipped"]))


def _passes(done: PytestRun) -> bool:
    counts = done.counts()
    return (
        done.returncode == 0
        and counts["passed"] > 0
        and not (counts["failed"] or counts["errors"] or counts["collect_errors"])
    )


SET_ASIDE_AT_MOST = 3


def _whole_selection(release: _Release, tree: Path) -> tuple[PeerOutcome, dict[str, str]]:
    """The green selection against ``tree``, and the tests set aside on the way.

    The baseline is computed once; a test that passed then can fail later for reasons of
    the machine (a subprocess under a time limit on a loaded machine). A test the run stops
    on is run alone on the unmodified release: failing there too, it says nothing of the
    fix, and is set aside (up to ``SET_ASIDE_AT_MOST``) for the rest of the run.
    """
    set_aside: dict[str, str] = {}
    while True:
        outcome = release.suite.run(tree, timeout=OWN_TESTS_TIMEOUT, deselect=set_aside)
        failure = outcome.first_failure
        if (
            outcome.verdict is Verdict.SURVIVED
            or failure is None
            or len(set_aside) >= SET_ASIDE_AT_MOST
        ):
            return outcome, set_aside
        alone = run_pytest(
            release.suite.suite,
            [failure.nodeid],
            release.suite.env(release.tree),
            timeout=REPRODUCER_TIMEOUT,
        )
        if not _fails(alone):
            return outcome, set_aside  # the fix's doing: the step fails on it
        set_aside[failure.nodeid] = failure.message.splitlines()[0][:120] if failure.message else ""


def check(
    catalogue: Catalogue,
    work: Path,
    only: set[int] | None = None,
    whole_selection: bool = True,
    say: Callable[[str], None] = print,
    only_releases: set[str] | None = None,
) -> list[Step]:
    """Run every step for the chosen findings (by number, by the release they were
    made on); each step is said as it ends."""
    work = work.resolve()  # trees under it go on PYTHONPATH of runs in other folders
    work.mkdir(parents=True, exist_ok=True)
    releases: dict[str, _Release] = {}
    steps: list[Step] = []

    def record(step: Step) -> None:
        steps.append(step)
        say(step.line())

    chosen = [
        f
        for f in catalogue.findings
        if (only is None or f.number in only)
        and (only_releases is None or f.release in only_releases)
    ]
    for finding in chosen:
        release = _release(finding.release, work, releases)
        started = time.monotonic()
        done = reproducer_run(release, finding, release.tree)
        every = " (every test)" if finding.every_test_fails else ""
        record(
            Step(
                finding.number,
                f"{finding.reproducer.name} fails on vLLM {finding.release}{every}",
                _fails(done, finding.every_test_fails),
                _summary(done),
                time.monotonic() - started,
            )
        )
        if finding.fix is not None:
            started = time.monotonic()
            fixed = _patched(
                finding.release, [finding.fix], work / f"fixed-{finding.number}-{finding.release}"
            )
            release.trees[f"fix-{finding.number}"] = fixed
            done = reproducer_run(release, finding, fixed)
            record(
                Step(
                    finding.number,
                    f"passes with {finding.fix.name}",
                    _passes(done),
                    _summary(done),
                    time.monotonic() - started,
                )
            )
        if finding.fixed_in is not None:
            started = time.monotonic()
            later = _release(finding.fixed_in, work, releases)
            done = reproducer_run(later, finding, later.tree)
            record(
                Step(
                    finding.number,
                    f"passes on vLLM {finding.fixed_in} (fixed upstream)",
                    _passes(done),
                    _summary(done),
                    time.monotonic() - started,
                )
            )
        if finding.proposed and finding.changes:
            started = time.monotonic()
            outcome = release.suite.run(
                release.trees[f"fix-{finding.number}"],
                set(finding.changes),
                timeout=OWN_TESTS_TIMEOUT,
            )
            files = ", ".join(outcome.files) or "none reach the changed functions"
            record(
                Step(
                    finding.number,
                    "vLLM's own tests reaching the change pass with the fix",
                    outcome.verdict is Verdict.SURVIVED and outcome.tests_run > 0,
                    f"{outcome} [{files}]",
                    time.monotonic() - started,
                )
            )
    if whole_selection:
        for version, patch in catalogue.combined.items():
            proposed = [f for f in chosen if f.release == version and f.proposed]
            if not proposed:
                continue
            release = _release(version, work, releases)
            started = time.monotonic()
            combined = _patched(version, [patch], work / f"combined-{version}")
            outcome, set_aside = _whole_selection(release, combined)
            aside = "; failing on the unmodified release here too, set aside: " + ", ".join(
                f"{nodeid} ({why})" for nodeid, why in set_aside.items()
            )
            record(
                Step(
                    None,
                    f"vLLM {version}'s whole green selection passes with {patch.name}",
                    outcome.verdict is Verdict.SURVIVED,
                    str(outcome) + (aside if set_aside else ""),
                    time.monotonic() - started,
                )
            )
            for finding in proposed:
                started = time.monotonic()
                done = reproducer_run(release, finding, combined)
                record(
                    Step(
                        finding.number,
                        f"passes with {patch.name}",
                        _passes(done),
                        _summary(done),
                        time.monotonic() - started,
                    )
                )
    return steps
