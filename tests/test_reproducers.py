"""The reproducers in docs/reproducers/ fail on the installed release, and export writes them.

``docs/reproducers/upstream.yaml`` lists each finding's reproducer, the release it was
made on and the folder of vLLM's test tree it belongs in. This is the fast part of
``make upstream-check`` (``kvconform/upstream/``): each reproducer of the installed
release, put in a copy of that release's own test tree (its sdist's ``tests/``, fetched
once and cached by ``kvconform.peer``), fails against the installed vLLM, with no
collection error; the exported ones are exported again and must be what is checked in.
Whether each passes with its fix, on the release that fixed it, and whether vLLM's own
tests stay green with the fixes is ``make upstream-check``'s (``make campaigns``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from vllm_copy import run_kvconform

from kvconform.errors import UsageError
from kvconform.fronts.cli import main
from kvconform.peer import prepare
from kvconform.peer.environment import installed_vllm_version
from kvconform.peer.runner import run_pytest
from kvconform.upstream import load_catalogue

REPO = Path(__file__).resolve().parent.parent
REPRODUCERS = REPO / "docs" / "reproducers"
CATALOGUE = load_catalogue(REPO)
INSTALLED = installed_vllm_version()


def test_every_reproducer_and_fix_is_listed_and_linked_from_findings():
    listed = {f.reproducer.name for f in CATALOGUE.findings}
    assert listed == {p.name for p in REPRODUCERS.glob("test_*.py")}
    fixes = {f.fix.name for f in CATALOGUE.findings if f.fix is not None}
    fixes |= {p.name for p in CATALOGUE.combined.values()}
    assert fixes == {p.name for p in (REPRODUCERS / "fixes").glob("*.patch")}
    findings = (REPO / "docs" / "findings.md").read_text()
    for finding in CATALOGUE.findings:
        assert f"reproducers/{finding.reproducer.name}" in findings
        if finding.fix is not None:
            assert f"reproducers/fixes/{finding.fix.name}" in findings


@pytest.mark.parametrize("finding", CATALOGUE.findings, ids=lambda f: f"#{f.number}")
def test_a_reproducer_imports_no_kvconform_and_says_where_it_belongs(finding):
    source = finding.reproducer.read_text()
    code = source.split('"""', 2)[2]  # after the docstring, which names the command
    assert "kvconform" not in code
    assert f"it belongs in {finding.folder}/" in " ".join(source.lower().split())
    assert f"vLLM {finding.release}" in " ".join(source.split('"""', 2)[1].split())


@pytest.mark.network
@pytest.mark.slow
def test_the_reproducers_fail_on_the_installed_release(tmp_path):
    mine = [f for f in CATALOGUE.findings if f.release == INSTALLED]
    if not mine:
        pytest.skip(f"no reproducer was made on the installed vLLM {INSTALLED}")
    suite = prepare(INSTALLED)
    tests = tmp_path / "suite"
    shutil.copytree(suite.suite, tests, symlinks=True)
    for finding in mine:
        shutil.copyfile(finding.reproducer, tests / finding.destination)
    done = run_pytest(tests, [f.destination for f in mine], suite.env(None), timeout=900)
    collect = [r for r in done.records if r["kind"] == "collect"]
    assert not collect, collect
    for finding in mine:
        outcomes = {
            r["outcome"]
            for r in done.records
            if r["nodeid"].startswith(finding.destination) and r["when"] == "call"
        }
        assert "failed" in outcomes, (finding.destination, done.output_tail[-3000:])


EXPORTED = [
    pytest.param(
        f,
        id=f"#{f.number}",
        marks=[] if f.release == INSTALLED else [pytest.mark.network, pytest.mark.slow],
    )
    for f in CATALOGUE.findings
    if f.scenario is not None
]


@pytest.mark.parametrize("finding", EXPORTED)
def test_the_checked_in_reproducer_is_what_export_writes(vllm, finding, tmp_path):
    out = tmp_path / finding.reproducer.name
    argv = ["export", finding.scenario, "--vllm-test", "--out", str(out)]
    if finding.release == INSTALLED:
        assert main(argv) == 0
    else:  # another release: its tree is loaded in a process of its own
        argv += ["--vllm-release", finding.release]
        done = run_kvconform(*argv, cwd=REPO)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert out.read_text() == finding.reproducer.read_text(), (
        f"regenerate it: kvconform {' '.join(argv[:3])} --out "
        f"docs/reproducers/{finding.reproducer.name}"
    )


def test_export_refuses_what_it_cannot_reproduce(vllm, write_scenario):
    conforming = write_scenario(
        """
        name: fine
        requests: {a: {prompt_len: 20}}
        steps: [{a: {prefill: 20}}, {a: finish}]
        """
    )
    with pytest.raises(UsageError, match="nothing to export"):
        main_raising(["export", f"{conforming}::fine", "--vllm-test"])


def main_raising(argv: list[str]) -> None:
    """The subcommand's run without main()'s translation of errors into statuses."""
    from kvconform.fronts.cli import build_parser
    from kvconform.fronts.options import FRONT

    args = build_parser().parse_args(argv)
    args.subcommand.run(args, FRONT)
