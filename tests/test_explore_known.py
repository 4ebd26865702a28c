"""The explorer's file of triaged findings (kvconform/explore/known.py).

* The committed scenarios/explore-known.yaml makes the failure of findings.md #14 -- its
  scenario run on the installed vLLM, signed as the explorer signs a finding -- known on
  the pinned release; an entry for other releases, or another invariant, does not.
* Bad entries are one ScenarioError with file, line and field; on the command line,
  exit 2 before vLLM is loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.errors import ScenarioError
from kvconform.explore.known import (
    DEFAULT_KNOWN_FINDINGS,
    load_known_findings,
    parse_known_findings,
    triaged,
)
from kvconform.fronts.cli import main
from kvconform.fuzz.findings import Signature, signatures
from kvconform.harness.loader.files import load_file
from kvconform.harness.runner import run_scenario
from kvconform.oracles.vllm import Vllm

REPO = Path(__file__).resolve().parent.parent
FINDING_14 = REPO / "scenarios/scheduler/sched-remote-prefill-sliding-window-last-token.yaml"


def test_finding_14_is_known_on_the_pinned_vllm_and_not_on_other_releases(vllm: Vllm) -> None:
    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    (scenario,) = load_file(FINDING_14)
    result = run_scenario(scenario, vllm)  # no expectations: the raw failure
    found = signatures(result)
    assert found, result.headline()
    entries = [triaged(signature, vllm.version, known) for signature in found]
    assert [e.finding for e in entries if e is not None] == [14], found
    assert all(s.check == "sanity" and s.subject == "SlidingWindowSpec" for s in found)
    # The same signature on a release the entry does not name is a new finding.
    assert triaged(found[0], "0.27.1", known) is None
    other = parse_known_findings(
        f'- {{signature: "{found[0]}", vllm: "!={vllm.version}", finding: 14, evidence: x}}\n',
        "other.yaml",
    )
    assert triaged(found[0], vllm.version, other) is None
    # Another invariant of the same manager is another finding.
    sibling = Signature("sanity", "SlidingWindowSpec", "shares a block between live requests")
    assert triaged(sibling, vllm.version, known) is None


FINDING_19 = REPO / "scenarios/scheduler/sched-draft-model-pad-over-budget.yaml"
FINDING_22 = REPO / "scenarios/scheduler/sched-mm-input-past-long-prefill-threshold.yaml"
# #22 where the request stopped at the input runs and holds the seat of the one that waits.
FINDING_22_SEAT = FINDING_22.with_name("sched-mm-input-past-long-prefill-threshold-seat.yaml")
# #22 through a drafter's prefill shift: the input fits the threshold, the input plus the
# token before it that the roll-back leaves (EAGLE's shift) does not.
FINDING_22_SHIFT = FINDING_22.with_name("sched-mm-input-past-long-prefill-threshold-shift.yaml")
# #24: an input that fits max_num_batched_tokens but not the one chunk the request needs for
# it, no threshold in play: through the drafter's prefill shift, and draft_model's draft slot.
FINDING_24_SHIFT = REPO / "scenarios/scheduler/sched-mm-input-past-request-budget-shift.yaml"
FINDING_24_SLOT = FINDING_24_SHIFT.with_name("sched-mm-input-past-request-budget-draft-slot.yaml")
# #26: multi-module MTP's prefill lookahead cuts a threshold-capped chunk to nothing; the two
# requests stuck at their prompts' last 2 tokens hold both seats.
FINDING_26 = REPO / "scenarios/scheduler/sched-mtp-prefill-lookahead-past-threshold.yaml"
# #26 where Mamba "align"'s block-aligned split, not the threshold, caps the last chunk.
FINDING_26_MAMBA = FINDING_26.with_name("sched-mtp-prefill-lookahead-past-mamba-split.yaml")
# #28: Mamba "align"'s split floors every chunk the draft slot leaves a request to nothing.
FINDING_28 = REPO / "scenarios/scheduler/sched-mamba-align-block-past-draft-slot-budget.yaml"
# #30: a load failed as a whole (recompute) frees its blocks and heads a loaded request.
FINDING_30 = REPO / "scenarios/scheduler/sched-failed-load-heads-loaded-request.yaml"


def test_a_stalls_signature_names_its_cause_and_excuses_no_other_stall(vllm: Vllm) -> None:
    """A stall (``capacity / schedule``) is signed with the cause the scheduler oracle
    reads from it, so #19's entry excuses #19's stall only: #22's and #24's, other causes,
    have entries of their own (#24's stalls have no threshold in play, #22's fit the request's
    token budget; #26's has no multimodal input; #28's is Mamba align's split with no
    lookahead; #30's a head before a request whose load arrived), and a stall of no named
    cause stays new."""
    from kvconform.harness.checks import capacity
    from kvconform.model.observations import (
        ARRIVED_LOAD_BEHIND_HEAD,
        MAMBA_BLOCK_PAST_BUDGET,
        MM_INPUT_PAST_BUDGET,
        MM_INPUT_PAST_THRESHOLD,
        PADDED_ROW_PAST_BUDGET,
        PREFILL_LOOKAHEAD_PAST_CAP,
    )
    from kvconform.model.results import Failure

    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    found = {}
    cases = (
        ("19", FINDING_19),
        ("22", FINDING_22),
        ("22 seat", FINDING_22_SEAT),
        ("22 shift", FINDING_22_SHIFT),
        ("24 shift", FINDING_24_SHIFT),
        ("24 slot", FINDING_24_SLOT),
        ("26", FINDING_26),
        ("26 mamba", FINDING_26_MAMBA),
        ("28", FINDING_28),
        ("30", FINDING_30),
    )
    for key, path in cases:
        (scenario,) = load_file(path)
        result = run_scenario(scenario, vllm)  # no expectations: the raw failure
        signed = signatures(result)
        if key in ("26", "26 mamba"):
            # a and b, stuck within the lookahead, run while c waits (through the split: a
            # runs while b waits): the liveness family's progress rule sees the same stall,
            # named as #26's running form (issue 35).
            from kvconform.harness.checks.liveness import NO_PROGRESS_LOOKAHEAD

            running_form = Signature("sanity", "-", NO_PROGRESS_LOOKAHEAD)
            assert running_form in signed, signed
            signed = [s for s in signed if s != running_form]
        (found[key],) = signed
    assert found["19"] == Signature("capacity", "schedule", PADDED_ROW_PAST_BUDGET)
    assert found["22"] == found["22 seat"] == found["22 shift"]
    assert found["22"] == Signature("capacity", "schedule", MM_INPUT_PAST_THRESHOLD)
    assert found["24 shift"] == found["24 slot"]
    assert found["24 shift"] == Signature("capacity", "schedule", MM_INPUT_PAST_BUDGET)
    assert found["26"] == found["26 mamba"]
    assert found["26"] == Signature("capacity", "schedule", PREFILL_LOOKAHEAD_PAST_CAP)
    assert found["28"] == Signature("capacity", "schedule", MAMBA_BLOCK_PAST_BUDGET)
    assert found["30"] == Signature("capacity", "schedule", ARRIVED_LOAD_BEHIND_HEAD)
    for key, signature in found.items():
        entry = triaged(signature, vllm.version, known)
        assert entry is not None and entry.finding == int(key.split()[0]), signature
    # A stall whose cause the oracle does not name keeps the bare signature: no entry.
    bare = Failure("capacity", "m", detail={"who": "schedule"})
    assert capacity.signature(None, bare) == ("schedule", "")  # type: ignore[arg-type]
    assert triaged(Signature("capacity", "schedule"), vllm.version, known) is None


# #29: a sliding window of one token keeps none of its blocks for a prefix-cache hit.
FINDING_29 = REPO / "scenarios/scheduler/sched-sliding-window-of-one-token-resend-hit.yaml"


def test_a_lost_hit_in_a_one_token_window_is_signed_with_its_cause_and_known(vllm: Vllm) -> None:
    """#29's lost hit is signed with the cause the hits family names, so its entry excuses
    it alone: a lost hit of any other shape (the bare signature) stays a new finding."""
    from kvconform.model.observations import HIT_LOST
    from kvconform.model.prefix_hits import ONE_TOKEN_WINDOW

    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    (scenario,) = load_file(FINDING_29)
    result = run_scenario(scenario, vllm)  # no expectations: the raw failure
    (signed,) = signatures(result)
    assert signed == Signature("sanity", "-", f"{HIT_LOST}: {ONE_TOKEN_WINDOW}")
    entry = triaged(signed, vllm.version, known)
    assert entry is not None and entry.finding == 29
    assert triaged(Signature("sanity", "-", HIT_LOST), vllm.version, known) is None


def test_the_running_forms_of_22_24_26_and_28_are_signed_with_their_cause(vllm: Vllm) -> None:
    """#22's and #24's inputs after some text, #26's requests alone (none waits) and #28's
    streaming turn resumed off the block grid: the requests run and stop, running; the
    liveness family's progress failure names the cause in its invariant, so each is known as
    its finding, and a progress failure of no named cause stays new."""
    from kvconform.harness.checks.liveness import (
        NO_PROGRESS,
        NO_PROGRESS_LOOKAHEAD,
        NO_PROGRESS_MAMBA,
        NO_PROGRESS_PAST_BUDGET,
        NO_PROGRESS_PAST_THRESHOLD,
    )

    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    cases = (
        (22, FINDING_22.with_name("sched-mm-input-past-long-prefill-threshold-running.yaml")),
        (24, FINDING_24_SHIFT.with_name("sched-mm-input-past-request-budget-shift-running.yaml")),
        (26, FINDING_26.with_name("sched-mtp-prefill-lookahead-past-threshold-running.yaml")),
        (
            26,
            FINDING_26_MAMBA.with_name("sched-mtp-prefill-lookahead-past-mamba-split-running.yaml"),
        ),
        (28, FINDING_28.with_name("sched-mamba-align-streaming-turn-off-grid.yaml")),
    )
    causes = {
        22: NO_PROGRESS_PAST_THRESHOLD,
        24: NO_PROGRESS_PAST_BUDGET,
        26: NO_PROGRESS_LOOKAHEAD,
        28: NO_PROGRESS_MAMBA,
    }
    for finding, path in cases:
        (scenario,) = load_file(path)
        (signature,) = signatures(run_scenario(scenario, vllm))
        assert signature == Signature("sanity", "-", causes[finding])
        entry = triaged(signature, vllm.version, known)
        assert entry is not None and entry.finding == finding, signature
    assert triaged(Signature("sanity", "-", NO_PROGRESS), vllm.version, known) is None


FINDING_23 = REPO / "scenarios/scheduler/sched-connector-hybrid-hit-past-lookahead-hashes.yaml"


def _known_as_23s_crash(path: Path, vllm: Vllm) -> Signature:
    """The one signature of ``path``'s raw run (no expectations): an IndexError crash in a
    ``find_longest_cache_hit`` frame, which an entry of #23 lists."""
    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    (scenario,) = load_file(path)
    (found,) = signatures(run_scenario(scenario, vllm))
    assert found.check == "crash" and found.subject == "IndexError", found
    assert found.detail.endswith(" find_longest_cache_hit"), found
    entry = triaged(found, vllm.version, known)
    assert entry is not None and entry.finding == 23, found
    return found


def test_finding_23s_crash_is_signed_with_its_frame_and_known_on_the_pinned_vllm(
    vllm: Vllm,
) -> None:
    """#23 (a per-group connector lookup past the block hashes, 0.34.0) crashes in
    MambaManager.find_longest_cache_hit; the crash's signature names that frame, which
    #23's entry lists, and no other entry matches it."""
    _known_as_23s_crash(FINDING_23, vllm)


FINDING_23_NO_CONNECTOR = (
    REPO / "scenarios/scheduler/sched-lookahead-hashes-hit-past-hashes-no-full-attention.yaml"
)


def test_finding_23s_path_without_a_connector_is_known_on_the_pinned_vllm(vllm: Vllm) -> None:
    """#23's cause without a connector (no full-attention group: the fixed-point lookup
    gives the sliding-window group the cap past the block hashes) crashes in another frame
    of ``find_longest_cache_hit``, SlidingWindowManager's, which an entry of #23 lists
    (seed 0's crash at line 1023 of the sixth stop); #23's first entry (MambaManager's
    frame) does not match it."""
    found = _known_as_23s_crash(FINDING_23_NO_CONNECTOR, vllm)
    (connector,) = signatures(run_scenario(load_file(FINDING_23)[0], vllm))
    assert found != connector  # another frame: its own entry, not the connector path's


FINDING_31 = REPO / "scenarios/scheduler/sched-connector-mamba-external-state-block-uncounted.yaml"
FINDING_32 = REPO / "scenarios/scheduler/sched-connector-hybrid-window-hit-lags-truncate.yaml"


@pytest.mark.parametrize(
    ("path", "finding", "kind", "function"),
    [
        (FINDING_31, 31, "ValueError", "get_new_blocks"),
        (FINDING_32, 32, "AssertionError", "truncate_computed_blocks"),
    ],
)
def test_the_eighth_stops_crashes_are_signed_with_their_frame_and_known(
    path: Path, finding: int, kind: str, function: str, vllm: Vllm
) -> None:
    """#31 (a connector-loaded Mamba state block left out of the admission count) and #32
    (a lagging sliding-window hit truncated for a connector) crash in vLLM's frames that
    their entries name on the pinned vLLM, so the explorer reports them as known, each as
    its own finding."""
    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    (scenario,) = load_file(path)
    (found,) = signatures(run_scenario(scenario, vllm))  # no expectations: the raw crash
    assert found.check == "crash" and found.subject == kind, found
    assert found.detail.endswith(f" {function}"), found
    entry = triaged(found, vllm.version, known)
    assert entry is not None and entry.finding == finding, found


ENTRY = '- signature: "sanity / -"\n  vllm: ">=0.28.0"\n  finding: 14\n  evidence: x\n'


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("signature: x\n", "k.yaml:1", "a list of entries"),
        ("- just text\n", "k.yaml:1: [0]", "a mapping"),
        (ENTRY.replace("  evidence: x\n", ""), "k.yaml:1: [0]", "missing field 'evidence'"),
        (ENTRY + "  reason: y\n", "k.yaml:5: [0].reason", "unknown field"),
        (ENTRY.replace('"sanity / -"', '"sanitee / -"'), "k.yaml:1: [0].signature", "not a check"),
        (ENTRY.replace('">=0.28.0"', '"0.28"'), "k.yaml:2: [0].vllm", "not a version specifier"),
        (ENTRY.replace("finding: 14", "finding: fourteen"), "k.yaml:3: [0].finding", "number"),
        (ENTRY.replace("evidence: x", 'evidence: ""'), "k.yaml:4: [0].evidence", "one line"),
        (ENTRY + ENTRY.replace("finding: 14", "finding: 0"), "k.yaml:7: [1].finding", "number"),
    ],
)
def test_a_bad_entry_is_one_error_with_file_line_and_field(
    text: str, where: str, says: str
) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_known_findings(text, "k.yaml")
    assert str(error.value.where) == where
    assert says in error.value.message


def test_the_committed_file_loads_and_a_good_entry_parses() -> None:
    entries = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    findings = [e.finding for e in entries]
    signatures = [e.signature for e in entries]
    # No signature twice; a finding may have one entry per check that meets it (#22 and
    # #24: capacity's stall where a request waits, the liveness family's where it runs),
    # and a crash one per frame: its signature names the function and line, which differ
    # between the managers that raise it and move between releases (#23: MambaManager's
    # and SlidingWindowManager's find_longest_cache_hit, on 0.33.0 and 0.34.0).
    assert 14 in findings and len(set(signatures)) == len(signatures), signatures
    # One entry per invariant that meets a finding (the cause after ": " apart): #26 is met
    # by the liveness family's progress rule and by the fairness family's skip rule.
    checks = [
        (e.finding, e.signature.split(" / ")[0], e.signature.split(" / ")[-1].split(": ")[0])
        for e in entries
        if e.signature[:8] != "crash / "
    ]
    assert len(set(checks)) == len(checks), checks
    # Each entry is a bug written up in docs/findings.md (its section "## N. ...").
    written_up = (REPO / "docs" / "findings.md").read_text(encoding="utf-8")
    assert all(f"\n## {n}. " in written_up for n in findings), findings
    (entry,) = parse_known_findings(ENTRY, "k.yaml")
    assert entry.holds(Signature("sanity", "-"), "0.34.0")
    assert not entry.holds(Signature("sanity", "-"), "0.27.1")
    assert entry.label() == "known (finding #14)"


def test_a_bad_file_of_known_findings_exits_2_before_vllm_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "known.yaml"
    bad.write_text(ENTRY.replace("finding: 14", "finding: -1"))
    assert main(["explore", "--known-findings", str(bad), "--out", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert f"{bad}:3: [0].finding" in out.out + out.err
    assert "loading" not in out.out + out.err
    both = ["explore", "--known-findings", str(bad), "--no-known-findings"]
    assert main(both) == 2
    assert "exclude each other" in "".join(capsys.readouterr())


def test_the_command_reports_finding_14_as_known_and_exits_0(
    vllm: Vllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The search itself is kvconform's, replaced here by what a search that found #14
    returns: its scenario's real result on the installed vLLM (the slow seed-0 test runs
    the real search). The command's judgement of it is what is tested."""
    from kvconform.explore import runner

    (scenario,) = load_file(FINDING_14)
    result = run_scenario(scenario, vllm)
    (signature,) = signatures(result)

    def found_14(vllm_: Vllm, *args: object, **kwargs: object) -> runner.ExploreRun:
        stats = runner.ExploreStats(seed=0, budget=1, vllm_version=vllm_.version)
        return runner.ExploreRun(stats, [(FINDING_14, signature, result)])

    monkeypatch.setattr(runner, "run_explore", found_14)
    monkeypatch.chdir(REPO)  # the default file, as make explore runs it
    assert main(["explore", "--budget", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{signature}: {FINDING_14} -- known (finding #14)" in out, out
    assert "only known findings; exit 0" in out
    assert main(["explore", "--budget", "1", "--out", str(tmp_path), "--no-known-findings"]) == 1
    out = capsys.readouterr().out
    assert "known (finding" not in out and "exit 1" in out, out


def _crash_entries_measured_on_a_release() -> list[tuple[str, str, str]]:
    """(signature, release, scenario) of each crash entry pinned to one release other than
    the pinned vLLM whose evidence names the scenario measured there."""
    import re

    found = []
    for entry in load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS):
        pinned = re.fullmatch(r"==(\d+\.\d+\.\d+)", str(entry.vllm))
        scenario = re.search(r"scenarios/\S+\.yaml", entry.evidence)
        if entry.signature.startswith("crash / ") and pinned and scenario:
            if "--vllm-release" in entry.evidence:
                found.append((entry.signature, pinned[1], scenario[0].rstrip(",;")))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signature", "release", "scenario"), _crash_entries_measured_on_a_release()
)
def test_a_crash_entry_pinned_to_a_release_names_the_frame_its_scenario_raises_there(
    signature: str, release: str, scenario: str, tmp_path: Path
) -> None:
    """A crash's signature names vLLM's file and line, which move between releases: an
    entry written for another release than the pinned one (#15, #21 and #23 on 0.33.0)
    must name the frame its scenario really raises at on that release, or the explorer
    reports the bug there as new."""
    import json

    from vllm_copy import run_kvconform

    done = run_kvconform(
        "run", REPO / scenario, "--vllm-release", release, "--report-dir", tmp_path,
        "--progress", "off", "--no-expectations", cwd=REPO,
    )  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    raised = {s["error"] for s in report["scenarios"] if s.get("error_kind") == "crash"}
    _, kind, frame = signature.split(" / ")
    path, function = frame.rsplit(" ", 1)
    assert any(f"raised {kind}" in e and f"at {path} in {function}" in e for e in raised), (
        signature,
        raised,
        done.stdout[-2000:],
    )


def test_26_skipped_beside_a_request_that_progresses_is_signed_with_its_cause(
    vllm: Vllm,
) -> None:
    """#26 where another running request still advances (seed 0's fairness finding of the
    seventh stop): the fairness family's skip failure names the cause, so it is known as
    #26, and a skip of no named cause stays new."""
    from kvconform.harness.checks.fairness import SKIPPED, SKIPPED_LOOKAHEAD

    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    path = FINDING_26.with_name("sched-mtp-prefill-lookahead-past-threshold-skipped.yaml")
    scenario = next(s for s in load_file(path) if s.id.endswith("[sync]"))
    found = signatures(run_scenario(scenario, vllm))
    assert Signature("sanity", "-", SKIPPED_LOOKAHEAD) in found, found
    entry = triaged(Signature("sanity", "-", SKIPPED_LOOKAHEAD), vllm.version, known)
    assert entry is not None and entry.finding == 26
    assert triaged(Signature("sanity", "-", SKIPPED), vllm.version, known) is None


def test_28_skipped_beside_a_request_that_progresses_is_signed_with_its_cause(
    vllm: Vllm,
) -> None:
    """#28's running form where another running request still advances: the fairness
    family's skip failure names the cause (and, once t finishes, the progress failure), so
    both are known as #28."""
    from kvconform.harness.checks.fairness import SKIPPED_MAMBA
    from kvconform.harness.checks.liveness import NO_PROGRESS_MAMBA

    known = load_known_findings(REPO / DEFAULT_KNOWN_FINDINGS)
    path = FINDING_28.with_name("sched-mamba-align-streaming-turn-off-grid-skipped.yaml")
    (scenario,) = load_file(path)
    found = set(signatures(run_scenario(scenario, vllm)))
    expected = {
        Signature("sanity", "-", SKIPPED_MAMBA),
        Signature("sanity", "-", NO_PROGRESS_MAMBA),
    }
    assert found == expected, found
    for signature in found:
        entry = triaged(signature, vllm.version, known)
        assert entry is not None and entry.finding == 28, signature
