"""``kvconform fuzz`` against the installed vLLM, in this process.

* The CI fuzz run: a fixed seed and a small budget (``--kvconform-fuzz-examples``,
  ``--kvconform-fuzz-seed``; the nightly job raises both) finds nothing on the
  installed vLLM, never runs a pool dry, and reaches the ``max_model_len`` edge and
  pool pressure in a good share of its examples.
* The whole path from a failing example to a reproducer, shown with a check made
  to fail on purpose: shrunk to a couple of steps, written with its header,
  reproduced by ``kvconform run`` (exit 1), passing once the check is fixed (exit 0),
  and the same seed writing the same reproducer.
The same path on real injected vLLM bugs is in ``test_fuzz_injected.py``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvconform.fronts.cli import main
from kvconform.fuzz.findings import Signature
from kvconform.fuzz.runner import run_fuzz
from kvconform.fuzz.space import build_space
from kvconform.harness import checks
from kvconform.harness.expectations import load_expectations
from kvconform.harness.loader import load_file
from kvconform.harness.runner import run_scenario
from kvconform.model.group_types import group_type_for_class
from kvconform.model.observations import Trajectory
from kvconform.model.results import Failure, Verdict
from kvconform.oracles.vllm import Vllm

REPO = Path(__file__).resolve().parents[1]
EXPECTATIONS = load_expectations(REPO / "scenarios" / "expectations.yaml")


def test_fuzz_run_finds_nothing_on_the_installed_vllm(
    vllm: Vllm, fuzz_budget, tmp_path: Path
) -> None:
    stats = run_fuzz(
        vllm,
        fuzz_budget.examples,
        fuzz_budget.seed,
        tmp_path,
        expectations=EXPECTATIONS,
    )
    found = [f"{f.signature}: {f.path}" for f in stats.findings]
    assert not found, "the fuzzer found divergences:\n" + "\n".join(found)
    assert stats.examples == fuzz_budget.examples
    # The pool is sized from an upper bound of the trajectory's demand: never dry.
    assert stats.rejected == 0
    # Edges and pressure are reached often enough to matter.
    assert stats.reached_edge >= 0.15 * stats.examples
    assert stats.cap_decided >= 0.04 * stats.examples
    assert stats.under_pressure >= 0.25 * stats.examples
    summary = json.loads((tmp_path / "fuzz-summary.json").read_text())
    assert summary["examples"] == fuzz_budget.examples and summary["findings"] == []


def test_space_offers_every_buildable_type_and_method(vllm: Vllm) -> None:
    space = build_space(vllm, EXPECTATIONS)
    offered = set(space.group_types) | set(space.excluded)
    for name in ("full_attention", "sliding_window", "mamba", "mla", "cross_attention"):
        assert name in space.group_types
    # Every spec class this vLLM defines and kvconform can name is drawn or said why not.
    for class_name in vllm.offered_spec_classes():
        group_type = group_type_for_class(class_name)
        if group_type is not None:
            assert group_type.name in offered
    declared = set(vllm.declared_methods())
    assert {name for names in space.methods.values() for name in names} == declared
    assert space.lookahead("dflash", 3, True) == 4 and space.lookahead("eagle", 3, True) == 3
    if "dspark" in space.methods:
        assert space.lookahead("dspark", 3, False) == space.lookahead("dspark", 3, True) + 1
    modes = space.offered_choices[("mamba", "mamba_cache_mode")]
    assert set(modes) == set(vllm.literal_values("vllm.config.cache.MambaCacheMode") or ())
    # Each fuzz-probe entry of the expectations file keeps its type out, none is stale.
    for entry in EXPECTATIONS:
        if entry.pattern.startswith("fuzz-probe-") and entry.applies(entry.pattern, vllm.version):
            type_name = entry.pattern.removeprefix("fuzz-probe-")
            assert type_name in space.excluded, f"{entry.pattern} unused"
            assert type_name not in space.group_types


def _picky(run: Trajectory) -> Iterator[Failure]:
    """A check that fails on purpose: a spec step with a rejected draft past 48 tokens (never in a probe)."""
    for obs in run.observations:
        if obs.group == 0 and obs.computed >= 48 and "accepted)" in obs.label:
            accepted = int(obs.label.split("(")[1].split()[0])
            if accepted < obs.scheduled - 1:
                yield Failure(
                    "sanity",
                    f"injected: {obs.label} at {obs.computed} computed tokens",
                    step=obs.step,
                    request=obs.request,
                    group=0,
                    spec_type="FullAttentionSpec",
                )


@pytest.fixture
def picky_check(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    original = checks.CHECKS["sanity"]
    picky = dataclasses.replace(
        original, find=lambda trajectory: [*original.find(trajectory), *_picky(trajectory)]
    )
    monkeypatch.setattr(checks, "CHECKS", {**checks.CHECKS, "sanity": picky})
    return monkeypatch


def test_a_finding_is_shrunk_written_and_reproduced(
    vllm: Vllm, tmp_path: Path, picky_check: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    command = "kvconform fuzz --examples 300 --seed 5"
    options = dict(max_findings=1, command=command, expectations=EXPECTATIONS)
    stats = run_fuzz(vllm, 300, 5, tmp_path / "a", **options)
    assert [f.signature for f in stats.findings] == [Signature("sanity", "FullAttentionSpec")]
    finding = stats.findings[0]
    assert finding.path is not None and finding.path.exists()
    text = finding.path.read_text()
    # Shrunk: a prefill past 48 tokens and one spec step with a rejection.
    assert finding.steps <= 2, text
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert f"# found by: {command}" in header
    assert any(line.startswith("# seed 5, round 1") for line in header)
    assert any(f"# reproduce: kvconform run {finding.path}" in line for line in header)
    assert any("injected:" in line for line in header)

    (scenario,) = load_file(finding.path)
    assert run_scenario(scenario, vllm).verdict is Verdict.FAILED
    assert main(["run", str(finding.path), "--report-dir", str(tmp_path / "r1")]) == 1

    # The same seed makes the same run and writes the same reproducer.
    again = run_fuzz(vllm, 300, 5, tmp_path / "b", **options)
    assert again.findings[0].text == finding.text
    assert again.findings[0].examples_before == finding.examples_before
    assert again.findings[0].shrink_runs == finding.shrink_runs

    picky_check.undo()  # the "bug" fixed: the reproducer conforms
    assert main(["run", str(finding.path), "--report-dir", str(tmp_path / "r2")]) == 0
    capsys.readouterr()


def test_fuzz_command_line(vllm: Vllm, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "fuzz"
    status = main(["fuzz", "--examples", "40", "--seed", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "fuzzing vLLM" in printed and "40 examples" in printed and "no findings" in printed
    assert json.loads((out / "fuzz-summary.json").read_text())["seed"] == 3
    assert main(["fuzz", "--examples", "0"]) == 2
    assert "--examples must be at least 1" in capsys.readouterr().out


def test_pool_running_dry_is_rejected_not_reported(
    vllm: Vllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Size pools from half the demand bound: many examples now run their pool dry.
    from kvconform.fuzz import pool

    bound = pool.GroupDemand.columns
    monkeypatch.setattr(pool.GroupDemand, "columns", lambda self, t, e: bound(self, t, e) // 2)
    stats = run_fuzz(vllm, 60, 1, tmp_path, expectations=EXPECTATIONS)
    assert stats.rejected_pool > 0
    assert stats.findings == []


def test_engine_flags_a_dry_pool(vllm: Vllm, scenario_from) -> None:
    scenario = scenario_from(
        """
        model: {block_size: 16, max_model_len: 256, num_blocks: 3}
        requests: {a: {prompt_len: 100}}
        steps: [{a: {prefill: 100}}]
        """
    )
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.ERROR and result.pool_exhausted
