"""--update-expectations: add new failures, narrow what conforms now, touch nothing else."""

from __future__ import annotations

import datetime
import json
import textwrap
from dataclasses import replace

import pytest

from kvconform.fronts.cli import main
from kvconform.harness.expectations import (
    apply_expectations,
    load_expectations,
    parse_expectations,
    raw_verdict,
)
from kvconform.harness.expectations_update import (
    TODO_REASON,
    ExpectationsUpdateError,
    update_expectations,
)
from kvconform.model import methods
from kvconform.model.results import ErrorKind, Failure, ScenarioResult, Verdict

V = "0.33.0"
TODAY = datetime.date(2026, 11, 2)

EXISTING = """\
# Known divergences (hand-written header).

# Sinks crash the allocator in 0.33.
- id: sink-*          # every sink scenario
  vllm: ">=0.33.0"
  checks: [error]
  reason: SinkFullAttentionManager rejects needs_kv_cache_zeroing
  evidence: https://github.com/vllm-project/vllm/issues/1

# Fixed in 0.28; kept for bisecting older trees.
- id: warmup-lookahead-*
  vllm: "<0.28.0"
  reason: warmup ignored the lookahead
  evidence: docs/findings.md#warmup

- id: dcp-*
  reason: DCP > 1 over-predicts
  evidence: https://example.invalid/2

- {id: hisparse-hot, vllm: "==0.33.0", reason: flow style entry}
"""


def outcome(scenario_id: str, checks: tuple[str, ...] = (), crash: str | None = None):
    """A result as the engine leaves it before expectations: passed, failed or crashed."""
    result = ScenarioResult(scenario_id, f"scenarios/{scenario_id}.yaml", Verdict.PASSED)
    result.failures = [
        Failure(c, f"step 3 (line 9, spec 3) request a, group 0: {c} says no") for c in checks
    ]
    if checks:
        result.verdict = Verdict.FAILED
    if crash:
        result.verdict, result.error_kind, result.error = Verdict.ERROR, ErrorKind.CRASH, crash
    return result


def judged(results, text, version=V):
    entries = parse_expectations(text, "expectations.yaml")
    return [
        apply_expectations(replace(r, verdict=raw_verdict(r), expectation=None), entries, version)
        for r in results
    ]


@pytest.fixture
def run():
    raw = [
        outcome("sink-a", crash="vLLM 0.33.0 raised TypeError"),
        outcome("sink-b"),
        outcome("warmup-lookahead-x", ("floor",)),
        outcome("dcp-a"),
        outcome("dcp-b"),
        outcome("hisparse-hot"),
        outcome("m[eagle-k1]", ("floor", "agree")),
        outcome("plain"),
    ]
    return judged(raw, EXISTING)


def test_the_run_sees_xpassed_not_passed(run):
    verdicts = {r.id: r.verdict for r in run}
    assert verdicts["sink-a"] is Verdict.XFAILED
    assert verdicts["sink-b"] is Verdict.XPASSED
    assert verdicts["dcp-a"] is verdicts["hisparse-hot"] is Verdict.XPASSED
    assert verdicts["warmup-lookahead-x"] is Verdict.FAILED  # its entry is for < 0.28 only
    assert verdicts["plain"] is Verdict.PASSED


def test_rewrite(tmp_path, run):
    path = tmp_path / "expectations.yaml"
    path.write_text(EXISTING)
    changes = update_expectations(path, run, V, {"m[eagle-k1]": "kvconform run x -k m"}, TODAY)
    assert sorted((c.kind, c.pattern) for c in changes) == [
        ("added", "m[eagle-k1]"),
        ("added", "warmup-lookahead-x"),
        ("dropped", "hisparse-hot"),
        ("narrowed", "dcp-*"),
        ("narrowed", "sink-*"),
        ("split", "sink-a"),
    ]
    text = path.read_text()
    old_lines = EXISTING.splitlines()
    # Untouched: the header, the comments, the entry for other versions, byte for byte.
    assert text.startswith("# Known divergences (hand-written header).\n\n# Sinks crash")
    block = "\n".join(old_lines[9:14])
    assert block.startswith("# Fixed in 0.28") and block in text
    # Narrowed in place, keeping the inline comment and the reason.
    assert '- id: sink-*          # every sink scenario\n  vllm: ">=0.33.0,!=0.33.0"\n' in text
    assert '- id: dcp-*\n  vllm: "!=0.33.0"\n  reason: DCP > 1 over-predicts\n' in text
    assert "hisparse-hot" not in text
    # Added at the end: exact ids, pinned, checks listed, visibly unreviewed.
    assert (
        textwrap.dedent(
            f"""\
        # Added by `kvconform run --update-expectations` on 2026-11-02 against vLLM {V}; not reviewed yet.
        # Rerun: kvconform run x -k m
        - id: "m[eagle-k1]"
          vllm: "=={V}"
          checks: [agree, floor]
          reason: "{TODO_REASON}"
          evidence: "first seen on vLLM {V}: [floor] step 3 (line 9, spec 3) request a, group 0: floor says no"
        """
        )
        in text
    )
    # Split: right after the entry it came from, with its reason.
    assert (
        "  evidence: https://github.com/vllm-project/vllm/issues/1\n\n"
        "# Split from 'sink-*' by `kvconform run --update-expectations` on 2026-11-02: it still "
        'diverges on vLLM 0.33.0.\n- id: "sink-a"\n  vllm: "==0.33.0"\n  checks: [error]\n'
        '  reason: "SinkFullAttentionManager rejects needs_kv_cache_zeroing"\n'
    ) in text

    # Round trip: the new file excuses this run exactly, on this version.
    again = judged(run, text)
    verdicts = {r.id: r.verdict for r in again}
    assert verdicts == {
        "sink-a": Verdict.XFAILED,
        "sink-b": Verdict.PASSED,
        "warmup-lookahead-x": Verdict.XFAILED,
        "dcp-a": Verdict.PASSED,
        "dcp-b": Verdict.PASSED,
        "hisparse-hot": Verdict.PASSED,
        "m[eagle-k1]": Verdict.XFAILED,
        "plain": Verdict.PASSED,
    }
    # ... and keeps every other version as it was.
    for version, scenario in [
        ("0.34.0", "sink-b"),
        ("0.32.0", "dcp-a"),
        ("0.27.1", "warmup-lookahead-q"),
    ]:
        before = any(e.applies(scenario, version) for e in parse_expectations(EXISTING, "x"))
        after = any(e.applies(scenario, version) for e in load_expectations(path))
        assert before and after, (version, scenario)
    assert not any(e.applies("m[eagle-k1]", "0.34.0") for e in load_expectations(path))

    # A second update from the judged run changes nothing.
    assert update_expectations(path, again, V, today=TODAY) == []
    assert path.read_text() == text


def test_a_new_file_gets_a_header(tmp_path):
    path = tmp_path / "scenarios" / "expectations.yaml"
    path.parent.mkdir()
    changes = update_expectations(path, [outcome("x", ("floor",))], V, today=TODAY)
    assert [c.kind for c in changes] == ["added"]
    text = path.read_text()
    assert text.startswith("# Known divergences: scenarios expected to fail")
    assert [e.pattern for e in load_expectations(path)] == ["x"]


def test_a_version_that_is_not_pep440_is_refused(tmp_path):
    with pytest.raises(ExpectationsUpdateError, match="PEP 440"):
        update_expectations(tmp_path / "e.yaml", [outcome("x", ("floor",))], "unknown")


EAGLE = """
name: eagle-steps
model: {groups: [full_attention]}
speculative: {method: eagle, num_speculative_tokens: 2}
requests: {a: {prompt_len: 20}}
steps:
  - {a: {prefill: 20}}
  - {a: {spec: 2, accepted: 1}}
  - {a: finish}
"""
PLAIN = """
name: plain
requests: {a: {prompt_len: 20}}
steps:
  - {a: {prefill: 20}}
  - {a: decode}
  - {a: finish}
"""


def test_run_update_expectations_end_to_end(vllm, write_scenario, tmp_path, monkeypatch, capsys):
    # kvconform's own method registry loses its EAGLE entry: the lookahead check
    # then fails every eagle scenario (vLLM itself is untouched). The session rebuilds
    # the registry in use from BUILTIN_METHODS; the entries in use come back after the test.
    monkeypatch.setattr(
        methods, "BUILTIN_METHODS", tuple(m for m in methods.BUILTIN_METHODS if m.name != "eagle")
    )
    monkeypatch.setattr(methods.METHODS, "_entries", methods.registry())
    write_scenario(EAGLE, "eagle.yaml")
    write_scenario(PLAIN, "plain.yaml")
    expectations = write_scenario(
        "- id: plain\n  reason: pretend it diverged\n", "expectations.yaml"
    )
    out = tmp_path / "report"
    args = ["run", str(tmp_path), "--report-dir", str(out), "--progress", "off", "-v"]

    assert main([*args, "--update-expectations"]) == 1
    console = capsys.readouterr().out
    assert "XPASSED  plain" in console and "conforms now" in console
    assert f"narrowed plain: vllm (all) -> !={vllm.version}" in console
    assert "added eagle-steps: lookahead" in console
    report = json.loads((out / "report.json").read_text())
    verdicts = {s["id"]: s["verdict"] for s in report["scenarios"]}
    assert verdicts == {"eagle-steps": "failed", "plain": "xpassed"}
    assert report["counts"]["xpassed"] == 1
    assert report["coverage"]["group_types"]["full_attention"]["methods"]["eagle"] == [
        "prefill",
        "spec",
        "rollback",
        "finish",
    ]
    assert "Known divergences that conform now (xpassed)" in (out / "summary.md").read_text()
    page = (out / "report.html").read_text()
    assert 'id="xpassed"' in page and '<span class="badge xpassed">xpassed</span>' in page
    entries = load_expectations(expectations)
    assert [(e.pattern, str(e.vllm), e.checks) for e in entries] == [
        ("plain", f"!={vllm.version}", ()),
        ("eagle-steps", f"=={vllm.version}", ("lookahead",)),
    ]

    assert main(args) == 0
    console = capsys.readouterr().out
    assert "XFAILED  eagle-steps" in console and "PASSED   plain" in console
