"""The peer yardstick as one object: vLLM's own tests, prepared, baselined and mapped.

:func:`prepare` gathers what a run needs (the tests of a release, the pinned
plugins, the config-only models) and returns a :class:`PeerSuite` for a
*reference* tree: the installed vLLM, or a ``--vllm-src``-style folder holding
an unmodified ``vllm/``. Against that reference the suite computes, once per
version and tree fingerprint, and caches under ``<cache>/peer/<version>/``:

* its :class:`~kvconform.peer.baseline.Baseline` (the selection made green);
* its :class:`~kvconform.peer.reach.ReachMap` and coverage report, from one
  run of the green selection under coverage with per-test contexts.

:meth:`PeerSuite.run` then judges a mutated tree (a copy of the reference with
a bug put in): only the test files that reach the mutated functions, ``-x``,
a time limit, and a :class:`PeerOutcome`. Concurrent processes share each
computation through a file lock; the first computes, the others read.
"""

from __future__ import annotations

import fcntl
import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.errors import UsageError, VllmUnavailable
from kvconform.paths import cache_dir
from kvconform.peer import baseline as baselines
from kvconform.peer import coverage_report
from kvconform.peer.deps import PINS, deps_dir
from kvconform.peer.environment import FIXED, build_env, installed_vllm_dir, installed_vllm_version
from kvconform.peer.fetch import fetch_tests
from kvconform.peer.fingerprint import key_of, tree_fingerprint
from kvconform.peer.models import default_redirect_map
from kvconform.peer.reach import (
    ReachMap,
    coverage_rc,
    definition_key,
    export_json,
    from_coverage,
)
from kvconform.peer.runner import PytestRun, run_pytest
from kvconform.peer.selection import selection
from kvconform.peer.verdict import Failure, Verdict, decide

BASELINE_TEST_TIMEOUT = 300  # seconds for one test of a baseline run (pytest-timeout)


@dataclass(frozen=True)
class PeerOutcome:
    """What vLLM's own tests said about one tree."""

    verdict: Verdict
    first_failure: Failure | None
    tests_run: int
    seconds: float
    files: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        tail = f": {self.first_failure}" if self.first_failure else ""
        return f"{self.verdict.value} ({self.tests_run} tests, {self.seconds:.1f} s){tail}"


def _failed(done: PytestRun) -> set[str]:
    return {r["nodeid"] for r in done.records if r["outcome"] == "failed"}


def prepare(
    version: str | None = None,
    reference_tree: Path | None = None,
    paths: Sequence[str] | None = None,
    workers: int = 1,
    global_cleanup: bool = False,
    tests: Path | None = None,
) -> PeerSuite:
    """vLLM ``version``'s tests, ready to run against ``reference_tree`` and its mutants.

    Without ``version`` the installed vLLM's; without ``reference_tree`` the
    installed vLLM is the reference, and it must be that version. ``paths``
    (test files or folders relative to the suite) narrow the selection of
    :mod:`kvconform.peer.selection`; their baseline and map are cached apart.
    ``workers`` > 1 spreads the baseline and coverage runs over that many
    pytest-xdist processes (the results, and so the caches, are the same).
    ``global_cleanup`` keeps vLLM's teardown after every test, which costs ~95%
    of a CPU run (:mod:`kvconform.peer.plugins.light_cleanup`); it is skipped
    by default, and the caches are kept apart for each choice. ``tests``: a folder
    holding vLLM's ``tests/`` (a checkout) instead of the release's sdist.
    """
    installed = installed_vllm_version()
    version = version or installed
    if version is None:
        raise VllmUnavailable("-", "an installed vllm (or a version to prepare)")
    if reference_tree is None:
        if installed != version:
            raise UsageError(
                f"the installed vLLM is {installed}; the tests of {version} need a "
                f"reference tree of {version} (--reference TREE, reference_tree=TREE)"
            )
        vllm_dir = installed_vllm_dir()
        if vllm_dir is None:
            raise VllmUnavailable(version, "an installed vllm package folder")
    else:
        vllm_dir = reference_tree / "vllm"
        if not (vllm_dir / "__init__.py").exists():
            raise UsageError(f"{reference_tree} holds no vllm/ package")
    return PeerSuite(
        version=version,
        suite=tests if tests is not None else fetch_tests(version),
        deps=deps_dir(),
        redirect=default_redirect_map(),
        reference_tree=reference_tree,
        vllm_dir=vllm_dir,
        paths=list(paths) if paths is not None else None,
        workers=workers,
        global_cleanup=global_cleanup,
    )


@dataclass
class PeerSuite:
    version: str
    suite: Path  # holds tests/ and pyproject.toml
    deps: Path
    redirect: Path
    reference_tree: Path | None  # None: the installed vLLM
    vllm_dir: Path  # the reference's vllm package folder
    paths: list[str] | None = None  # a narrower selection than the default one
    workers: int = 1  # pytest-xdist processes for the baseline and coverage runs
    global_cleanup: bool = False  # keep vLLM's teardown after each test (slow on a CPU)
    _fingerprint: str | None = field(default=None, repr=False)

    # -- environment and cache ---------------------------------------------------------------

    def env(self, vllm_tree: Path | None = None) -> dict[str, str]:
        return build_env(
            deps=self.deps, redirect_map=self.redirect, version=self.version, vllm_tree=vllm_tree
        )

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = tree_fingerprint(self.vllm_dir)
        return self._fingerprint

    def selection(self) -> list[str]:
        if self.paths is not None:
            return [path for path in self.paths if (self.suite / path).exists()]
        return selection(self.suite)

    def _cache(self, kind: str) -> Path:
        cleanup = "global-cleanup" if self.global_cleanup else "light-cleanup"
        # The fixed environment is part of what a cached baseline was judged under.
        fixed = [f"{name}={value}" for name, value in sorted(FIXED.items())]
        # A reach map is of the reservation code as defined now (a survey writes both).
        measured = [definition_key()] if kind == "reach" else []
        key = key_of(self.fingerprint, self.selection(), PINS, cleanup, fixed, *measured)
        return cache_dir("peer", self.version) / f"{kind}-{key}.json"

    @contextmanager
    def _locked(self, kind: str) -> Iterator[None]:
        with open(self._cache(kind).with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _pytest(self, *args: Any, **kwargs: Any) -> PytestRun:
        return run_pytest(*args, light_cleanup=not self.global_cleanup, **kwargs)

    def _xdist(self) -> list[str]:
        return ["-n", str(self.workers)] if self.workers > 1 else []

    # -- the baseline --------------------------------------------------------------------------

    def baseline(self, refresh: bool = False) -> baselines.Baseline:
        """The green selection on the reference tree; the first call runs it (minutes:
        docs/peer-tests.md has the measured times)."""
        path = self._cache("baseline")
        with self._locked("baseline"):
            found = None if refresh else baselines.load(path)
            if found is not None:
                return found
            files = self.selection()
            done = self._pytest(
                self.suite,
                files,
                self.env(self.reference_tree),
                extra_args=[
                    "--continue-on-collection-errors",
                    f"--timeout={BASELINE_TEST_TIMEOUT}",
                    *self._xdist(),
                ],
            )
            if done.timed_out or not done.records:
                raise VllmUnavailable(
                    self.version, "a baseline run of its tests", done.output_tail[-500:]
                )
            made = baselines.derive(
                self.version, self.fingerprint, files, done.records, done.seconds
            )
            baselines.save(made, path)
            return made

    # -- reach and coverage --------------------------------------------------------------------

    def reach(self, refresh: bool = False) -> ReachMap:
        """Function -> tests, from a run of the selection under coverage; cached.

        With the baseline already known, the green selection is run (and a test
        that fails there after all is deselected as flaky). Without it, one run
        gives both (:meth:`survey`).
        """
        path = self._cache("reach")
        if path.exists() and not refresh:
            return ReachMap.from_json(json.loads(path.read_text()))
        if baselines.load(self._cache("baseline")) is None:
            return self.survey()[1]
        with self._locked("reach"):
            if path.exists() and not refresh:
                return ReachMap.from_json(json.loads(path.read_text()))
            base = self.baseline()
            done, with_contexts, report = self._covered_run(
                base.files,
                deselect=base.deselected,
                extra=[*baselines.ignore_args(base), *self._xdist()],
            )
            self._note_flaky(base, done)
            made = from_coverage(with_contexts, self.vllm_dir, _failed(done))
            self._save_reach(made, report)
            return made

    def survey(self) -> tuple[baselines.Baseline, ReachMap]:
        """The baseline, the reach map and the coverage from *one* run of the whole
        selection under coverage: half the time of :meth:`baseline` then :meth:`reach`.

        The reach map leaves out the tests that failed; the coverage figures keep
        what those tests executed before failing (the separate green run does not).
        """
        # Locks in the order reach() takes them (reach, then baseline): no deadlock.
        with self._locked("reach"), self._locked("baseline"):
            found = baselines.load(self._cache("baseline"))
            if found is not None and self._cache("reach").exists():  # another process did it
                return found, ReachMap.from_json(json.loads(self._cache("reach").read_text()))
            files = self.selection()
            done, with_contexts, report = self._covered_run(
                files, extra=["--continue-on-collection-errors", *self._xdist()]
            )
            if done.timed_out or not done.records:
                raise VllmUnavailable(self.version, "a run of its tests", done.output_tail[-500:])
            made = baselines.derive(
                self.version, self.fingerprint, files, done.records, done.seconds
            )
            baselines.save(made, self._cache("baseline"))
            reached = from_coverage(with_contexts, self.vllm_dir, _failed(done))
            self._save_reach(reached, report)
            return made, reached

    def _covered_run(
        self, files: list[str], deselect: dict[str, str] | None = None, extra: Sequence[str] = ()
    ) -> tuple[PytestRun, dict, dict]:
        with tempfile.TemporaryDirectory(prefix="kvconform-peer-cov-") as tmp:
            rc = coverage_rc(self.vllm_dir, Path(tmp) / "coveragerc")
            data = Path(tmp) / ".coverage"
            env = self.env(self.reference_tree)
            env["COVERAGE_FILE"] = str(data)
            done = self._pytest(
                self.suite,
                files,
                env,
                deselect=deselect or {},
                extra_args=[
                    *extra,
                    f"--timeout={BASELINE_TEST_TIMEOUT}",
                    "--cov",
                    f"--cov-config={rc}",
                    "--cov-context=test",
                    "--cov-report=",
                ],
            )
            with_contexts = export_json(data, rc, Path(tmp) / "c.json", env, contexts=True)
            report = export_json(data, rc, Path(tmp) / "r.json", env, contexts=False)
        report["kvconform"] = {"seconds": round(done.seconds, 1), "counts": done.counts()}
        return done, with_contexts, report

    def _save_reach(self, made: ReachMap, report: dict) -> None:
        self._cache("coverage").write_text(json.dumps(report))
        self._cache("reach").write_text(json.dumps(made.to_json()))

    def _note_flaky(self, base: baselines.Baseline, done: PytestRun) -> None:
        """Tests that failed in the green run after passing in the first: deselected too."""
        failed = {
            r["nodeid"]: r.get("message", "") for r in done.records if r["outcome"] == "failed"
        }
        if failed:
            for nodeid, message in failed.items():
                base.deselected.setdefault(nodeid, f"flaky: {message}")
            base.counts["deselected"] = len(base.deselected)
            baselines.save(base, self._cache("baseline"))

    def tests_reaching(self, file: str, function: str) -> list[str]:
        """The test files with a test that executes ``function`` (a qualname) of ``file``."""
        return self.reach().tests_reaching(file, function)

    def coverage(self, report_dir: Path) -> coverage_report.CoverageSummary:
        """Branch coverage of the reservation code by the green selection, written to
        ``report_dir`` (``coverage.json``, coverage.py's own report, and ``summary.json``/
        ``summary.md``, per file and per function with the branches never taken)."""
        self.reach()
        report = json.loads(self._cache("coverage").read_text())
        summary = coverage_report.summarize(report, self.vllm_dir)
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "coverage.json").write_text(json.dumps(report, indent=1))
        (report_dir / "reach.json").write_text(json.dumps(self.reach().test_files(), indent=1))
        coverage_report.write(summary, report_dir)
        return summary

    # -- judging a tree ------------------------------------------------------------------------

    def run(
        self,
        vllm_tree: Path | None = None,
        functions: set[tuple[str, str]] | None = None,
        timeout: float = 600.0,
        deselect: Mapping[str, str] | None = None,
    ) -> PeerOutcome:
        """vLLM's tests against ``vllm_tree`` (None: the reference), stopping at the first
        failure. With ``functions`` ({(``vllm/...py``, qualname)}) only the test files
        reaching them run; no test reaching them at all means ``survived`` at once.
        ``deselect`` (node id -> why) leaves out tests beyond the baseline's."""
        # The map first: with nothing cached, one survey run makes the baseline too.
        reaching = None if functions is None else self.reach().files_for(functions)
        base = self.baseline()
        if reaching is None:
            files = list(base.files)
            extra = baselines.ignore_args(base)
        else:
            files, extra = reaching, []
            if not files:
                return PeerOutcome(Verdict.SURVIVED, None, 0, 0.0, [])
        done = self._pytest(
            self.suite,
            files,
            self.env(vllm_tree or self.reference_tree),
            deselect={**base.deselected, **(deselect or {})},
            extra_args=["-x", *extra],
            timeout=timeout,
        )
        verdict, failure = decide(done.records, done.returncode, done.output_tail)
        tests_run = len({r["nodeid"] for r in done.records if r["kind"] == "test"})
        return PeerOutcome(verdict, failure, tests_run, round(done.seconds, 2), files)
