"""The real-bug catalogue, its replay command and its report (``kvconform realbugs``).

The catalogue must hold what the issue asks (at least 15 bugs, each with its upstream
numbers and a patch that applies to its release's tree); a malformed entry is one error
naming file, line and field while the others are still read; vLLM's own tests are aimed
at the functions a bug's patch changes; the report's four-way table counts who catches
what. The replays themselves (a patched tree through the corpus) are
tests/test_realbugs_caught.py's and ``make realbugs``'.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvconform.fronts.cli import main
from kvconform.realbugs.catalogue import read_catalogue
from kvconform.realbugs.peer import changed_functions
from kvconform.realbugs.replay import Replay
from kvconform.realbugs.report import BugResult, RealBugsReport, render_markdown, who_catches
from kvconform.realbugs.trees import pristine_tree

REPO = Path(__file__).resolve().parent.parent
CATALOGUE = read_catalogue(REPO / "realbugs" / "catalogue.yaml")


def test_the_catalogue_holds_at_least_15_bugs_each_with_its_upstream_numbers():
    assert not CATALOGUE.errors, [str(e) for e in CATALOGUE.errors]
    assert len(CATALOGUE.bugs) >= 15
    for bug in CATALOGUE.bugs:
        # Upstream numbers: the fix's pull request, or the issue where the PR is unknown.
        assert bug.pr or bug.issue, f"{bug.name}: neither a pull request nor an issue"
        assert bug.patch.is_file(), f"{bug.name}: {bug.patch} is missing"


@pytest.mark.parametrize(
    "bug",
    [pytest.param(b, id=b.name) for b in CATALOGUE.bugs if b.patch_target == "0.33.0"],
)
def test_every_patch_applies_to_its_release_tree(bug):
    # The release's own tree (the installed vLLM when it is that release, else its wheel's
    # Python tree, downloaded once and cached): the catalogue targets 0.33.0 whatever is pinned.
    done = subprocess.run(
        ["patch", "-p1", "--dry-run", "--silent", "-i", str(bug.patch)],
        cwd=pristine_tree(bug.patch_target), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, f"{bug.patch.name} does not apply:\n{done.stdout}{done.stderr}"


def test_a_malformed_entry_is_one_error_with_file_line_and_field(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "good-bug.patch").write_text("--- a/x\n+++ b/x\n")
    good = (
        "- name: good-bug\n  title: t\n  upstream: {pr: [1], issue: []}\n"
        "  last_buggy: 0.1.0\n  first_fixed: 0.1.1\n  patch: good-bug.patch\n"
        "  patch_target: 0.33.0\n  files: [vllm/x.py]\n  bug_class: c\n  symptom: s\n"
        "  trigger: t\n"
    )
    bad = good.replace("good-bug", "bad-bug").replace("last_buggy: 0.1.0", "last_buggy: soon")
    path = tmp_path / "catalogue.yaml"
    path.write_text(good + bad)
    catalogue = read_catalogue(path)
    assert [b.name for b in catalogue.bugs] == ["good-bug"]
    (error,) = catalogue.errors
    assert error.where.file == str(path) and error.where.line == 15, error  # entry [1] starts on line 12
    assert "[1]" in str(error) and "last_buggy" in str(error), error


def test_an_unknown_bug_is_a_usage_error(capsys):
    assert main(["realbugs", "--bug", "no-such-bug", "--report-dir", "/nonexistent"]) == 2
    assert "no such bug in realbugs/catalogue.yaml: no-such-bug" in capsys.readouterr().out


def test_vllms_tests_are_aimed_at_the_function_a_patch_changes():
    # The patch puts back 0.19.0's assertion in SlidingWindowManager.find_longest_cache_hit
    # (upstream #39450): the function, not the module, is what vLLM's tests must reach.
    (bug,) = [b for b in CATALOGUE.bugs if b.name == "swa-eagle-alignment-assert"]
    assert changed_functions(bug.patch.read_text(), pristine_tree(bug.patch_target)) == {
        ("vllm/v1/core/single_type_kv_cache_manager.py", "SlidingWindowManager.find_longest_cache_hit")
    }


def test_a_patch_of_module_level_code_names_no_function(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "m.py").write_text("LIMIT = 1\n\n\ndef f():\n    return LIMIT\n")
    patch = "--- a/vllm/m.py\n+++ b/vllm/m.py\n@@ -1 +1 @@\n-LIMIT = 1\n+LIMIT = 2\n"
    assert changed_functions(patch, tmp_path) == set()
    inside = "--- a/vllm/m.py\n+++ b/vllm/m.py\n@@ -5 +5 @@\n-    return LIMIT\n+    return 0\n"
    assert changed_functions(inside, tmp_path) == {("vllm/m.py", "f")}


def _result(name: str, ours: str, theirs: str | None) -> BugResult:
    (bug,) = [b for b in CATALOGUE.bugs if b.name == name]
    peer = None if theirs is None else {"verdict": theirs, "first_failure": "t.py::x boom"}
    return BugResult(bug, Replay(ours, 1 if ours == "detected" else 0), peer)


def test_who_catches_counts_each_bug_once_in_its_cell():
    names = [b.name for b in CATALOGUE.bugs[:6]]
    results = [
        _result(names[0], "detected", "killed"),
        _result(names[1], "detected", "survived"),
        _result(names[2], "missed", "killed"),
        _result(names[3], "missed", "survived"),
        _result(names[4], "detected", "broken"),
        _result(names[5], "broken", "killed"),
    ]
    assert who_catches(results) == {
        "both": 1,
        "kvconform only": 1,
        "vLLM's tests only": 1,
        "neither": 1,
        "not judged by vLLM's tests": 1,
        "not judged by kvconform": 1,
    }
    text = render_markdown(RealBugsReport(results))
    assert "| vLLM's own tests |" in text and "caught (`t.py::x`)" in text
    assert "- vLLM's tests only: 1" in text
    # Without --peer-tests the column is absent.
    assert "vLLM's own tests" not in render_markdown(
        RealBugsReport([BugResult(r.bug, r.replay) for r in results])
    )


def test_trees_are_byte_compiled_once_and_a_patched_tree_never_writes_through_its_links(
    tmp_path,
):
    # Fresh processes import these trees where no bytecode is written
    # (PYTHONDONTWRITEBYTECODE): each import compiled the whole of vLLM anew.
    import os
    import sys
    import time

    from kvconform.harness.releases import link_tree
    from kvconform.realbugs.trees import with_bytecode

    tag = sys.implementation.cache_tag
    pristine = tmp_path / "pristine"
    (pristine / "vllm" / "core").mkdir(parents=True)
    (pristine / "vllm" / "__init__.py").write_text("")
    (pristine / "vllm" / "core" / "__init__.py").write_text("")
    (pristine / "vllm" / "core" / "blocks.py").write_text("NEED = 1\n")
    assert with_bytecode(pristine) == pristine
    original = pristine / "vllm" / "core" / "__pycache__" / f"blocks.{tag}.pyc"
    assert original.is_file() and (pristine / f".bytecode-{tag}").is_file()
    before = original.read_bytes()

    patched = link_tree(pristine / "vllm", tmp_path / "patched")
    linked = patched / "vllm" / "core" / "__pycache__" / f"blocks.{tag}.pyc"
    assert linked.stat().st_ino == original.stat().st_ino  # link_tree links the bytecode
    unchanged = patched / "vllm" / "core" / "__pycache__" / f"__init__.{tag}.pyc"
    unchanged.unlink()  # as a tree cached before its pristine tree had bytecode
    source = patched / "vllm" / "core" / "blocks.py"
    source.unlink()  # as patched_tree breaks the link of a file the patch changes
    source.write_text("NEED = 0\n")
    later = time.time() + 5
    os.utime(source, (later, later))
    with_bytecode(patched, like=pristine)
    assert original.read_bytes() == before  # the pristine bytecode is untouched
    assert linked.read_bytes() != before  # the patched file's is its own
    assert unchanged.stat().st_ino == (original.parent / f"__init__.{tag}.pyc").stat().st_ino
    stamp = (patched / f".bytecode-{tag}").stat().st_mtime_ns
    with_bytecode(patched, like=pristine)  # once: the marker says it is done
    assert (patched / f".bytecode-{tag}").stat().st_mtime_ns == stamp
