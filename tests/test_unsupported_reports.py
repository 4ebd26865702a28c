"""The ``unsupported`` verdict, counted apart in every report and on the console.

The run is real (installed vLLM): one scenario needs ``KpoolTailSpec``, which only
vLLM 0.30-0.31 offer, next to one that runs. Every front and report must show the
first as unsupported with vLLM's reason, never as an error, and the exit status
must be that of the scenario that ran.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from kvconform.fronts.cli import main

NOT_OFFERED = """
name: not-here
model: {groups: [{type: kpool_tail, sliding_window: 32}]}
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}]
"""
RUNS = """
name: runs
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}, {a: decode}, {a: finish}]
"""


def test_every_report_counts_unsupported_apart(vllm, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "not-here.yaml").write_text(NOT_OFFERED)
    (corpus / "runs.yaml").write_text(RUNS)
    reports = tmp_path / "reports"
    status = main(["run", str(corpus), "--report-dir", str(reports), "--progress", "off"])
    out = capsys.readouterr().out
    assert status == 0, out
    reason = f"vLLM {vllm.version} lacks vllm.v1.kv_cache_interface.KpoolTailSpec"
    # One line per reason (-v lists each scenario).
    assert (
        f"UNSUPPORTED 1 scenario: not offered here, not counted against it: {reason} (not-here)"
        in out
    )
    assert "1 passed, 1 unsupported in" in out

    data = json.loads((reports / "report.json").read_text())
    assert data["exit_status"] == 0
    assert data["counts"]["unsupported"] == 1 and data["counts"]["error"] == 0
    entry = next(s for s in data["scenarios"] if s["id"] == "not-here")
    assert (entry["verdict"], entry["error_kind"], entry["error"]) == (
        "unsupported",
        "unsupported",
        reason,
    )

    root = ET.parse(reports / "junit.xml").getroot()
    assert (root.get("skipped"), root.get("errors"), root.get("failures")) == ("1", "0", "0")
    (skipped,) = root.iter("skipped")
    assert skipped.get("type") == "unsupported" and reason in skipped.get("message", "")

    summary = (reports / "summary.md").read_text()
    assert "## Not offered by this vLLM (unsupported: 1)" in summary
    assert f"| `not-here` | {reason} |" in summary
    assert "## Failing scenarios" not in summary

    page = (reports / "report.html").read_text()
    assert '<span class="chip unsupported">1 unsupported</span>' in page
    assert 'id="unsupported">Not offered by this vLLM (1 unsupported)' in page
    assert 'id="problems"' not in page


def test_pytest_skips_an_unsupported_scenario_with_the_reason(vllm, pytester):
    pytester.makeconftest('pytest_plugins = ["kvconform.fronts.pytest_plugin"]')
    (pytester.mkdir("scenarios") / "not-here.yaml").write_text(NOT_OFFERED)
    result = pytester.runpytest_inprocess("scenarios", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*unsupported: vLLM * lacks *KpoolTailSpec*"])


pytest_plugins = ["pytester"]
