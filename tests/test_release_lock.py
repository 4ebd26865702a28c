"""Every claimed release stays green: the scenarios changed since the last green matrix run on each.

``make release-matrix`` writes scenarios/release-matrix.lock after a matrix in which
every claimed release exited 0 (kvconform/matrix/lock.py). A scenario file added or
changed since is unverified; this test runs the unverified ones with every check
against each locked release (their Python trees, downloaded once and cached), so a
scenario written for one release that breaks another fails ``make test``. With the
lock up to date it runs nothing; ``make release-matrix`` renews the lock, and ``make
campaigns`` runs the whole matrix over the claimed releases (``make release-matrix-claimed``).
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_copy import REPO, run_kvconform

from kvconform.harness.loader import discover
from kvconform.harness.loader.files import load_file
from kvconform.matrix.lock import LOCK_FILE, read_lock, write_lock


def test_the_lock_names_the_claimed_releases():
    lock = read_lock(REPO / LOCK_FILE)
    assert lock.releases[0] == "0.28.0" and "0.33.0" in lock.releases
    assert lock.files, "the lock verifies no scenario file"


# In make test, not marked slow: with the lock up to date it runs nothing; after a scenario
# changes it runs that file against each locked release (their trees cached once).
def test_scenarios_changed_since_the_lock_pass_on_every_claimed_release(tmp_path):
    lock = read_lock(REPO / LOCK_FILE)
    unverified = lock.unverified(discover([REPO / "scenarios"]), REPO / "scenarios")
    if not unverified:
        return  # the lock is up to date: the last green matrix ran exactly these files
    for release in lock.releases:
        # A file written for other releases (its vllm: field) is unsupported there by its
        # own word; the release matrix runs it where it applies.
        applying = [path for path in unverified if _applies(path, release)]
        if not applying:
            continue
        out = tmp_path / release
        done = run_kvconform(
            "run", *applying, "--checks", "all", "--vllm-release", release,
            "--report-dir", out, "--progress", "off", cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"scenarios changed since the last green release matrix fail on vLLM {release} "
            f"(exit {done.returncode}); fix them or say which releases they apply to "
            f"(vllm: in the file):\n{done.stdout[-3000:]}"
        )


def _applies(path: Path, release: str) -> bool:
    """Whether some scenario of the file is written for ``release`` (its ``vllm:`` field)."""
    from packaging.specifiers import SpecifierSet

    return any(
        s.vllm_releases is None or SpecifierSet(s.vllm_releases).contains(release)
        for s in load_file(path)
    )


def test_a_changed_or_new_file_is_unverified(tmp_path):
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    kept, changed = scenarios / "kept.yaml", scenarios / "changed.yaml"
    kept.write_text("name: kept\n")
    changed.write_text("name: changed\n")
    lock_path = scenarios / "release-matrix.lock"
    write_lock(lock_path, ["0.28.0", "0.33.0"], [kept, changed])
    assert json.loads(lock_path.read_text())["releases"] == ["0.28.0", "0.33.0"]
    lock = read_lock(lock_path)
    assert lock.unverified([kept, changed], scenarios) == []
    changed.write_text("name: changed\ndescription: now different\n")
    new = scenarios / "new.yaml"
    new.write_text("name: new\n")
    assert lock.unverified([kept, changed, new], scenarios) == [changed, new]


def test_the_matrix_writes_the_lock_only_when_green(tmp_path, monkeypatch):
    from kvconform.errors import ExitStatus
    from kvconform.matrix import command
    from kvconform.matrix.runner import ReleaseRun

    scenario = tmp_path / "a.yaml"
    scenario.write_text("name: a\n")

    def fake_run(status: int):
        def run(release, run_args, folder, supported):
            return ReleaseRun(release, folder, supported, exit_status=status)

        return run

    import argparse

    args = argparse.Namespace(
        releases="0.28.0,0.33.0", checks="all", report_dir=str(tmp_path / "m"), jobs=1,
        paths=[str(tmp_path)], expression=None, expectations=None, no_expectations=False,
        lock=str(tmp_path / "release-matrix.lock"),
    )  # fmt: skip
    monkeypatch.setattr(command, "releases_in", lambda text, say: ["0.28.0", "0.33.0"])
    monkeypatch.setattr(command, "run_release", fake_run(1))
    assert command.matrix(args, lambda line: None) is ExitStatus.NONCONFORMANCE
    assert not Path(args.lock).exists()
    monkeypatch.setattr(command, "run_release", fake_run(0))
    assert command.matrix(args, lambda line: None) is ExitStatus.CONFORM
    assert read_lock(Path(args.lock)).releases == ("0.28.0", "0.33.0")
