"""make upstream-check's parts that need no vLLM test run: the catalogue and the verdicts.

The check itself (``python -m kvconform.upstream``) runs vLLM's own suite and takes
minutes (``make campaigns`` runs it). Here: the catalogue of docs/reproducers/upstream.yaml loads
and refuses what it cannot check, a patch that does not apply is an error naming it, and
a reproducer run "fails" only with a failed test and no collection error.
"""

from __future__ import annotations

import importlib.util
import marshal
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvconform.errors import KvconformError, ScenarioError
from kvconform.peer import Failure, PeerOutcome, Verdict
from kvconform.peer.runner import PytestRun
from kvconform.upstream import checking as upstream_check
from kvconform.upstream.catalogue import load_catalogue

REPO = Path(__file__).resolve().parent.parent


def test_the_catalogue_names_each_finding_once_a_release_with_a_fix_or_a_fixing_release():
    catalogue = load_catalogue(REPO)
    by_release: dict[str, list[int]] = {}
    for finding in catalogue.findings:
        by_release.setdefault(finding.release, []).append(finding.number)
    assert by_release == {
        "0.31.0": [5],
        "0.32.0": [6],
        "0.33.0": [1, 2, 3, 4],
        "0.34.0": [1, 10, 12, 13, 15],  # the findings still open in 0.34.0 (issues 36, 35)
    }
    for finding in catalogue.findings:
        assert finding.fix is not None or finding.fixed_in is not None
        assert finding.folder in ("tests/v1/core", "tests/v1/worker")
        if finding.proposed:
            assert finding.changes, f"#{finding.number}: which functions does the fix change?"
            assert finding.release in catalogue.combined
    assert {f.number for f in catalogue.findings if f.proposed} == {1, 2, 3, 4, 10, 12, 13, 15}
    # Each form of #10, #12 and #13 is a test of its reproducer: all must fail on 0.34.0.
    assert {f.number for f in catalogue.findings if f.every_test_fails} == {1, 10, 12, 13}


def test_a_finding_listed_twice_for_one_release_is_refused(tmp_path):
    (tmp_path / "t.py").write_text("")
    entry = "  - {finding: 10, release: 0.34.0, reproducer: t.py, folder: tests/v1/core, fixed_in: 0.35.0}\n"
    (tmp_path / "c.yaml").write_text("findings:\n" + entry + entry)
    with pytest.raises(ScenarioError, match="finding 10 on vLLM 0.34.0 is listed twice"):
        load_catalogue(tmp_path, "c.yaml")
    (tmp_path / "c.yaml").write_text("findings:\n" + entry + entry.replace("0.34.0", "0.33.0", 1))
    assert [f.release for f in load_catalogue(tmp_path, "c.yaml").findings] == ["0.34.0", "0.33.0"]


def test_a_bad_catalogue_entry_is_refused(tmp_path):
    (tmp_path / "docs" / "reproducers").mkdir(parents=True)
    (tmp_path / "t.py").write_text("")
    base = "findings:\n  - {finding: 1, release: 0.33.0, reproducer: t.py, folder: tests/v1/core"
    for tail, words in [
        (", fixed_in: 0.34.0}", None),
        ("}", "a fix or fixed_in"),
        (", fixed_in: next}", "not a release"),
        (", fix: gone.patch}", "no file"),
        (", fixed_in: 0.34.0, changes: [warmup.py]}", "vllm/FILE::QUALNAME"),
    ]:
        (tmp_path / "c.yaml").write_text(base + tail + "\n")
        if words is None:
            assert load_catalogue(tmp_path, "c.yaml").findings[0].fixed_in == "0.34.0"
        else:
            with pytest.raises(ScenarioError, match=words):
                load_catalogue(tmp_path, "c.yaml")


def _run(*outcomes: tuple[str, str, str], returncode: int = 1) -> PytestRun:
    records = [
        {"nodeid": f"t.py::test_{i}", "kind": kind, "outcome": outcome, "when": when}
        for i, (kind, outcome, when) in enumerate(outcomes)
    ]
    return PytestRun(records, returncode, 1.0, "")


def test_fails_means_a_failed_test_and_no_collection_error():
    failed = _run(("test", "failed", "call"), ("test", "passed", "call"))
    assert upstream_check._fails(failed) and not upstream_check._passes(failed)
    broken = _run(("collect", "failed", "collect"))
    assert not upstream_check._fails(broken) and not upstream_check._passes(broken)
    green = _run(("test", "passed", "call"), returncode=0)
    assert upstream_check._passes(green) and not upstream_check._fails(green)
    assert not upstream_check._passes(_run(returncode=0))  # nothing ran: not a pass


def test_every_test_fails_means_no_test_passed_or_skipped():
    both = _run(("test", "failed", "call"), ("test", "failed", "call"))
    assert upstream_check._fails(both, every_test=True)
    one_form = _run(("test", "failed", "call"), ("test", "passed", "call"))
    assert upstream_check._fails(one_form) and not upstream_check._fails(one_form, every_test=True)
    skipped = _run(("test", "failed", "call"), ("test", "skipped", "setup"))
    assert not upstream_check._fails(skipped, every_test=True)


def test_a_patch_that_does_not_apply_is_an_error_naming_it(tmp_path, monkeypatch):
    tree = tmp_path / "release"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(upstream_check, "release_tree", lambda version: tree)
    good, bad = tmp_path / "good.patch", tmp_path / "bad.patch"
    good.write_text("--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    bad.write_text("--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-y = 1\n+y = 2\n")
    fixed = upstream_check._patched("9.9.9", [good], tmp_path / "fixed")
    assert (fixed / "vllm" / "a.py").read_text() == "x = 2\n"
    # Byte-compiled at both levels, from the patched source (tests import it under -O too).
    for level in ("", 1):
        pyc = Path(
            importlib.util.cache_from_source(str(fixed / "vllm" / "a.py"), optimization=level)
        )
        assert 2 in marshal.loads(pyc.read_bytes()[16:]).co_consts  # x = 2
    assert (tree / "vllm" / "a.py").read_text() == "x = 1\n"  # the release tree is untouched
    with pytest.raises(KvconformError, match="bad.patch does not apply to vLLM 9.9.9"):
        upstream_check._patched("9.9.9", [bad], tmp_path / "again")


def test_a_fixed_tree_under_a_relative_work_folder_is_named_absolutely(tmp_path, monkeypatch):
    # make upstream-check passes --work build/upstream; the fixed tree goes on the PYTHONPATH
    # of a pytest run in the release's test tree, where a relative path names nothing and the
    # unpatched vLLM is imported: every "passes with the fix" step failed that way.
    tree = tmp_path / "release"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(upstream_check, "release_tree", lambda version: tree)
    monkeypatch.chdir(tmp_path)
    fixed = upstream_check._patched("9.9.9", [], Path("build") / "fixed-1")
    assert fixed.is_absolute() and fixed == tmp_path / "build" / "fixed-1"


def test_only_releases_runs_that_releases_entries_and_every_step_of_them(tmp_path, monkeypatch):
    ran: list[tuple[int, str, str]] = []
    survived = PeerOutcome(Verdict.SURVIVED, None, 1, 0.0, ["tests/v1/core/test_x.py"])

    def release(version, work, cache):
        return SimpleNamespace(
            version=version,
            tree=None,
            trees={},
            suite=SimpleNamespace(run=lambda *a, **k: survived),
        )

    def reproducer_run(release, finding, tree):
        ran.append((finding.number, finding.release, "release" if tree is None else "fixed"))
        return _run(
            ("test", "failed" if tree is None else "passed", "call"), returncode=int(tree is None)
        )

    monkeypatch.setattr(upstream_check, "_release", release)
    monkeypatch.setattr(upstream_check, "reproducer_run", reproducer_run)
    monkeypatch.setattr(upstream_check, "_patched", lambda version, patches, into: into)
    steps = upstream_check.check(
        load_catalogue(REPO), tmp_path, whole_selection=False, say=lambda line: None,
        only_releases={"0.34.0"},
    )  # fmt: skip
    assert {(n, r) for n, r, _ in ran} == {
        (1, "0.34.0"),
        (10, "0.34.0"),
        (12, "0.34.0"),
        (13, "0.34.0"),
        (15, "0.34.0"),
    }
    assert all(step.ok for step in steps) and len(steps) == 5 * 3  # fails, passes, own tests
    assert "(every test)" in steps[0].name


def test_a_test_failing_on_the_unmodified_release_too_is_set_aside(monkeypatch):
    # The whole-selection run stops on test_a; alone on the release it fails too (a subprocess
    # limit on a loaded machine, say): set aside, the run goes on and passes. test_b fails
    # with the fix only: the step fails on it.
    fails_on_release = {"t.py::test_a"}
    runs: list[dict] = []

    def run(tree, timeout, deselect):
        runs.append(dict(deselect))
        first = next(
            (n for n in ("t.py::test_a", "t.py::test_b") if n in stopping and n not in deselect),
            None,
        )
        if first is None:
            return PeerOutcome(Verdict.SURVIVED, None, 10, 1.0)
        return PeerOutcome(Verdict.KILLED, Failure(first, "Timeout\nmore"), 3, 1.0)

    def alone(suite, targets, env, timeout):
        (nodeid,) = targets
        return _run(("test", "failed" if nodeid in fails_on_release else "passed", "call"))

    monkeypatch.setattr(upstream_check, "run_pytest", alone)
    release = SimpleNamespace(
        tree=None, suite=SimpleNamespace(run=run, suite=Path("suite"), env=lambda tree: {})
    )
    stopping = {"t.py::test_a"}
    outcome, aside = upstream_check._whole_selection(release, Path("combined"))
    assert outcome.verdict is Verdict.SURVIVED and aside == {"t.py::test_a": "Timeout"}
    assert runs == [{}, {"t.py::test_a": "Timeout"}]
    stopping = {"t.py::test_a", "t.py::test_b"}
    outcome, aside = upstream_check._whole_selection(release, Path("combined"))
    assert outcome.verdict is Verdict.KILLED and outcome.first_failure.nodeid == "t.py::test_b"
