"""Proof of sensitivity: a bug injected into a copy of vLLM turns exactly the right scenarios red.

Each test copies the installed vLLM's Python tree (``.py`` files plus their
bytecode, so the copy imports as fast as the original; compiled extensions stay
in the installed package, which ``--vllm-src`` appends to ``vllm.__path__``),
replaces one precise piece of text, and runs the corpus in a subprocess with
``kvconform run --vllm-src COPY``. The assertions read ``report.json``.

Which scenarios must fail is *derived* here, from each scenario's own numbers
and kvconform's contract (the floor table and the lookahead table), by a small
model of the block counts each party holds: a token-indexed group (every floor
rule counts token columns) and a Mamba group
outside "align" mode hold ``cdiv(min(computed + scheduled + lookahead,
max_model_len), block)`` (plus the speculative state blocks), with the
lookahead dropped on the party the bug breaks; blocks are never returned on
rollback, so the running maximum counts. Every other group type ignores the
lookahead and cannot be affected. The same model, without a bug, must reproduce
the unmodified run exactly: that is what makes its predictions under a bug
worth trusting, and what keeps this file from being a list of ids copied from
the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from vllm_copy import installed_vllm_dir, tree_with_replacement

from kvconform.harness.expectations import Expectation, load_expectations
from kvconform.harness.loader import load_paths
from kvconform.model.floors import cdiv
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import expected_lookahead
from kvconform.model.scenario import Action, Scenario
from kvconform.oracles.vllm import Vllm

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
# Trajectory folders only: warmup scenarios replay vLLM's real warmup, which the
# model below does not describe.
FOLDERS = [SCENARIOS / name for name in ("specs", "methods", "hybrid", "regressions")]
TOKEN_INDEXED = frozenset(n for n, t in GROUP_TYPES.items() if t.floor.counts_token_columns)
# Group types whose KVCacheManager vLLM 0.33.0 cannot build (docs/findings.md, finding 1):
# their scenarios crash before any block count exists, with or without a bug.
CRASHING_TYPES = frozenset({"sink_full_attention"})

pytestmark = pytest.mark.slow  # five subprocesses, each importing vLLM


# -- the bugs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bug:
    """One injected bug: a text replacement in one vLLM module, and what it breaks."""

    name: str
    module: str  # path inside the vllm package
    old: str
    new: str
    live_drops_lookahead: bool = False
    predictor_drops_lookahead: bool = False
    # The lookahead VllmConfig.num_lookahead_tokens reports under the bug, by
    # (canonical method, k, sample_from_anchor); None: unchanged.
    vllm_lookahead: Callable[[str, int, bool], int | None] | None = None


BUGS = {
    "predictor-without-lookahead": Bug(
        "predictor-without-lookahead",
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = min(num_tokens, max_model_len)",
        predictor_drops_lookahead=True,
    ),
    "allocator-ignores-lookahead": Bug(
        "allocator-ignores-lookahead",
        "v1/core/kv_cache_manager.py",
        "num_tokens_main_model + num_lookahead_tokens, self.max_model_len",
        "num_tokens_main_model, self.max_model_len",
        live_drops_lookahead=True,
    ),
    "dflash-lookahead-without-plus-one": Bug(
        "dflash-lookahead-without-plus-one",
        "config/vllm.py",
        "if speculative_config.use_dflash() or dspark_fill_in:",
        "if dspark_fill_in:",
        # DFlash then falls through to the EAGLE branch (use_eagle() includes it).
        vllm_lookahead=lambda method, k, anchor: k if method == "dflash" else None,
    ),
}


# -- the model ---------------------------------------------------------------------------


@dataclass
class Prediction:
    verdict: str
    checks: set[str] = field(default_factory=set)


def failing_checks(scenario: Scenario, vllm: Vllm, bug: Bug | None) -> set[str]:
    """The checks the scenario fails under ``bug`` (None: unmodified vLLM)."""
    spec, model = scenario.speculative, scenario.model
    checks: set[str] = set()
    if spec is None:
        lookahead, contract, k = 0, 0, 0
    else:
        method, k = vllm.canonical_method(spec.method), spec.num_speculative_tokens
        table = expected_lookahead(method, k, spec.sample_from_anchor)
        assert table is not None, f"{scenario.id}: method {method} not in kvconform's table"
        broken = bug.vllm_lookahead if bug else None
        reported = broken(method, k, spec.sample_from_anchor) if broken else None
        reported = table if reported is None else reported
        if reported != table:
            checks.add("lookahead")
        override = spec.num_lookahead_tokens
        lookahead = reported if override is None else override
        # The floor is the contract: what the drafter writes by kvconform's table.
        contract = table if override is None else override
    live_la = 0 if bug and bug.live_drops_lookahead else lookahead
    pred_la = 0 if bug and bug.predictor_drops_lookahead else lookahead
    limit = model.max_model_len
    for group in model.groups:
        mode = group.options.get("mamba_cache_mode")
        if group.type in TOKEN_INDEXED:
            extra = 0
        elif group.type == "mamba" and mode != "align":
            nsb = group.options.get("num_speculative_blocks")
            extra = k if nsb is None else int(str(nsb))
        else:
            continue  # cross-attention, circular buffer, Mamba align: no lookahead anywhere
        options = {n: v for n, v in group.options.items() if v is not None}
        sharded = vllm.dcp_sharded(vllm.build_spec(group.type, group.block_size, options))
        live_block = group.block_size * (model.dcp_world_size if sharded else 1)
        live_max: dict[str, int] = {}
        pred_max: dict[str, int] = {}
        for step in scenario.steps:
            for call in step.calls:
                if call.action is Action.PREEMPT:
                    live_max.pop(call.request, None)
                    pred_max.pop(call.request, None)
                if not call.allocates:
                    continue
                n = call.computed + call.scheduled
                live = cdiv(min(n + live_la, limit), live_block) + extra
                pred = cdiv(min(n + pred_la, limit), group.block_size) + extra
                held = live_max[call.request] = max(live_max.get(call.request, 0), live)
                most = pred_max[call.request] = max(pred_max.get(call.request, 0), pred)
                if group.type in TOKEN_INDEXED:
                    floor = cdiv(min(n + contract, limit), live_block)
                else:
                    floor = 1 + extra
                if held != most:
                    checks.add("agree")
                if held < floor or pred < floor:
                    checks.add("floor")
    return checks


def predict(
    scenario: Scenario,
    vllm: Vllm,
    bug: Bug | None,
    expectations: list[Expectation],
    release: str,
) -> Prediction:
    entry = next((e for e in expectations if e.applies(scenario.id, release)), None)
    if any(g.type in CRASHING_TYPES for g in scenario.model.groups):
        assert entry is not None, f"{scenario.id} crashes vLLM and has no expectation"
        return Prediction("xfailed")
    checks = failing_checks(scenario, vllm, bug)
    if not checks:
        if entry is not None and set(entry.checks) == {"sanity"}:
            # A divergence the scenario states by hand (a hit, what the KV-cache events
            # announce), which a model of holdings does not compute: the expectation says
            # what vLLM does there.
            return Prediction("xfailed", {"sanity"})
        return Prediction("xpassed" if entry else "passed")
    if entry is not None and (not entry.checks or checks <= set(entry.checks)):
        return Prediction("xfailed", checks)
    return Prediction("failed", checks)


# -- copies of vLLM and runs ------------------------------------------------------------


def tree_with(bug: Bug, pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine tree with the bug's replacement made exactly once."""
    return tree_with_replacement(pristine, tmp_path / "vllm-tree", bug.module, bug.old, bug.new)


def run_corpus(tree: Path, report_dir: Path) -> tuple[int, dict[str, Any], str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", *map(str, FOLDERS)]
        + ["--vllm-src", str(tree), "--report-dir", str(report_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = proc.stdout + proc.stderr
    report_file = report_dir / "report.json"
    assert report_file.exists(), output
    report = json.loads(report_file.read_text())
    assert report["vllm"]["source"] == "src", output
    assert Path(report["vllm"]["path"]) == tree / "vllm", "the run did not use the copy"
    return proc.returncode, report, output


def corpus() -> list[Scenario]:
    loaded = load_paths(FOLDERS)
    assert not loaded.errors, loaded.errors
    return [s for s in loaded.scenarios if s.kind == "trajectory"]


def _states_admissions(scenario: Scenario) -> bool:
    """Whether the scenario states what an admission must do (a refused call, a hit)."""
    return any(
        call.refused or call.options.expect_hit is not None
        for step in scenario.steps
        for call in step.calls
    )


def compare(report: dict[str, Any], vllm: Vllm, bug: Bug | None) -> dict[str, Prediction]:
    """Assert every scenario's verdict and failing checks are the model's; return the model."""
    expectations = load_expectations(SCENARIOS / "expectations.yaml")
    release = report["vllm"]["version"]  # the tree the corpus ran on, not the installed one
    predicted = {s.id: predict(s, vllm, bug, expectations, release) for s in corpus()}
    observed = {entry["id"]: entry for entry in report["scenarios"]}
    assert set(predicted) <= set(observed)
    states_admissions = {s.id for s in corpus() if _states_admissions(s)}
    wrong = []
    for scenario_id, expected in predicted.items():
        entry = observed[scenario_id]
        checks = {f["check"] for f in entry["failures"]}
        if bug is not None and scenario_id in states_admissions and expected.checks:
            # The model predicts holdings, not admissions: a bug that changes the
            # allocator's demand may also admit a call the scenario states is refused (or
            # change a stated hit), which `sanity` reports on top of the predicted checks.
            checks = checks - ({"sanity"} - expected.checks)
        if entry["verdict"] != expected.verdict or (expected.checks and checks != expected.checks):
            wrong.append(
                f"{scenario_id}: expected {expected.verdict} {sorted(expected.checks)}, "
                f"got {entry['verdict']} {sorted(checks)} {entry['error'] or ''}"
            )
    assert not wrong, "\n".join(wrong)
    return predicted


# -- the tests ---------------------------------------------------------------------------


def test_unmodified_copy_conforms_and_the_model_reproduces_it(vllm, pristine_tree_033, tmp_path):
    # The model is of vLLM 0.33.0 (its DCP divergence, the bugs' texts): run on that tree.
    pristine_tree = pristine_tree_033
    status, report, output = run_corpus(pristine_tree, tmp_path / "report")
    assert status == 0, output
    predicted = compare(report, vllm, None)
    # The model is not vacuous: it predicts the known DCP divergence by itself.
    assert any(p.checks == {"agree"} for p in predicted.values())


@pytest.mark.parametrize("name", list(BUGS))
def test_injected_bug_fails_exactly_the_scenarios_it_should(name, vllm, pristine_tree_033, tmp_path):
    pristine_tree = pristine_tree_033
    bug = BUGS[name]
    status, report, output = run_corpus(tree_with(bug, pristine_tree, tmp_path), tmp_path / "r")
    assert status == 1, output
    predicted = compare(report, vllm, bug)
    failing = [scenario_id for scenario_id, p in predicted.items() if p.verdict == "failed"]
    passing = [scenario_id for scenario_id, p in predicted.items() if p.verdict == "passed"]
    # A bug the corpus catches in a handful of scenarios only would be a weak corpus;
    # one that turns everything red would mean the model proves nothing.
    assert len(failing) >= 5 and len(passing) >= 5, (failing, passing)


def test_py_only_tree_resolves_compiled_modules_from_the_installed_vllm(pristine_tree):
    """``--vllm-src`` puts the copy first and still finds compiled extensions."""
    compiled = sorted(installed_vllm_dir().glob("*.so"))
    assert compiled, "the installed vLLM has no compiled extension to look for"
    module = "vllm." + compiled[0].name.split(".")[0]
    assert not list((pristine_tree / "vllm").glob("*.so"))
    probe = (
        "import importlib.util\n"
        "from kvconform.oracles.vllm import load\n"
        f"load(src={str(pristine_tree)!r})\n"
        "import vllm\n"
        "print(vllm.__file__)\n"
        f"print(importlib.util.find_spec({module!r}).origin)\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    package_file, origin = proc.stdout.split()[-2:]
    assert Path(package_file).parent == pristine_tree / "vllm"
    assert Path(origin) == compiled[0]
