"""What a scenario says is what runs, and a verdict blames whoever decided.

* A setting the scenario leaves out takes vLLM's own default for the release
  (prefix caching, the retention interval, full-sequence admission), and
  report.json says so per scenario (``settings``, ``non_default``).
* Exit 2 is for a problem in the file: it does not parse, is not UTF-8, or a step
  is impossible by the floor's own arithmetic. A refusal where the floor fits the
  pool is vLLM's: a ``capacity`` failure, exit 1 (shown on vLLM's own allocator
  with an over-allocating bug injected).
* The exit precedence table of docs/cli.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from vllm_copy import REPO, run_kvconform, tree_with_replacement

from kvconform.errors import ExitStatus, ScenarioError
from kvconform.fronts.cli import main
from kvconform.harness.loader import load_paths
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict

EXACT_POOL = """
name: circular-exact
model:
  block_size: 16
  max_model_len: 256
  num_blocks: 5
  groups: [full_attention, circular_buffer]
requests: {a: {prompt_len: 16}, b: {prompt_len: 16}}
steps:
  - {a: {prefill: 16}}
  - {b: {prefill: 16}}
  - {a: finish, b: finish}
"""


def test_left_out_settings_take_vllms_defaults_and_the_report_says_so(
    vllm, write_scenario, tmp_path
):
    write_scenario(
        "model: {groups: [full_attention]}\nrequests: {a: {prompt_len: 20}}\n"
        "steps: [{a: {prefill: 20}}, {a: finish}]\n",
        "plain.yaml",
    )
    write_scenario(
        "model: {enable_caching: false, groups: [full_attention]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}, {a: finish}]\n",
        "uncached.yaml",
    )
    out = tmp_path / "report"
    assert main(["run", str(tmp_path), "--report-dir", str(out), "--progress", "off"]) == 0
    report = {s["id"]: s for s in json.loads((out / "report.json").read_text())["scenarios"]}
    defaults = vllm.default_settings()
    plain, uncached = report["plain"], report["uncached"]
    # A decoder-only model: vLLM serves it with prefix caching on.
    assert plain["settings"]["enable_caching"] == {
        "value": True,
        "vllm_default": True,
        "source": "vLLM default",
    }
    assert (
        plain["settings"]["prefix_cache_retention_interval"]["value"]
        == defaults["prefix_cache_retention_interval"]
    )
    assert plain["non_default"] == []
    assert uncached["settings"]["enable_caching"]["source"] == "scenario"
    assert uncached["non_default"] == ["enable_caching"]


def test_vllms_defaults_follow_the_model_as_vllm_derives_them(vllm, scenario_from):
    from kvconform.oracles.resolve import resolve_settings

    # Encoder-decoder models: vLLM turns prefix caching off by default.
    cross = scenario_from(
        "model: {max_encoder_len: 32, groups: [full_attention, cross_attention]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    resolved, record = resolve_settings(cross, vllm)
    assert resolved.model.enable_caching is False and record.values["enable_caching"] is False
    # Mamba's cache mode follows prefix caching (align when on), unless stated.
    hybrid = scenario_from(
        "model: {block_size: 16, groups: [full_attention, {type: mamba}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    resolved, _ = resolve_settings(hybrid, vllm)
    assert resolved.model.enable_caching is True
    assert resolved.model.groups[1].options["mamba_cache_mode"] == "align"
    # A stated "none" is vLLM's configuration with prefix caching off.
    none = scenario_from(
        "model: {block_size: 16, groups: [full_attention, {type: mamba, mamba_cache_mode: none}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )
    resolved, record = resolve_settings(none, vllm)
    assert resolved.model.enable_caching is False and "enable_caching" in record.stated


def test_a_stated_mode_that_contradicts_stated_caching_is_refused_at_load(scenario_from):
    with pytest.raises(ScenarioError, match="derives it from prefix caching") as info:
        scenario_from(
            "model:\n  enable_caching: false\n"
            "  groups: [{type: mamba, mamba_cache_mode: align}]\n"
            "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
        )
    assert info.value.where.field == "model.groups[0].mamba_cache_mode"


def test_a_step_the_floor_cannot_fit_is_the_scenarios_error(vllm, scenario_from):
    # 3 usable blocks; a and b need 2 each: b is impossible by the floor's arithmetic.
    scenario = scenario_from(EXACT_POOL.replace("num_blocks: 5", "num_blocks: 4"))
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.INPUT
    assert "by the floor's own arithmetic prefill 16 of request 'b' needs" in (result.error or "")
    assert exit_status([result]) == ExitStatus.BAD_INPUT


def _failed_entry(tree, scenarios, tmp_path, select: str | None = None) -> dict:
    """``kvconform run SCENARIOS --vllm-src TREE`` (``-k SELECT``: one id of a matrix),
    which must exit 1: its one report entry."""
    out = tmp_path / "report"
    chosen = ("-k", select) if select is not None else ()
    done = run_kvconform(
        "run", scenarios, *chosen, "--vllm-src", tree, "--report-dir", out, "--progress", "off",
        "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = json.loads((out / "report.json").read_text())["scenarios"]
    return entry


@pytest.mark.slow
def test_an_allocator_that_asks_more_than_the_floor_is_a_failure_not_bad_input(
    pristine_tree, tmp_path
):
    # vLLM's CircularBufferManager made to ask two ring blocks for a new request: the
    # exact pool (4 usable: 2 for a, 2 for b) refuses b, although the floor fits it.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "return 0 if self.req_to_blocks.get(request_id) else 1",
        "return 0 if self.req_to_blocks.get(request_id) else 2",
    )
    scenario = tmp_path / "scenarios" / "circular-exact.yaml"
    scenario.parent.mkdir()
    scenario.write_text(EXACT_POOL.lstrip(), encoding="utf-8")
    entry = _failed_entry(tree, scenario.parent, tmp_path)
    assert entry["verdict"] == "failed"
    (failure,) = entry["failures"]
    assert failure["check"] == "capacity" and failure["request"] == "b"
    assert "KVCacheManager.allocate_slots refuses it" in failure["message"]
    assert "needs 2 blocks" in failure["message"], failure["message"]


# The hybrid scenarios whose b is admitted into an exact pool: under a vLLM that holds
# more than it should, their refusal was reported as bad input (issue 37).
EXACT_POOL_HYBRIDS = (
    "hybrid-full-attention-partial-block-hit-exact-pool",
    "kv-events-partial-block-copy-on-write",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        # SingleTypeKVCacheManager.allocate_new_blocks rounds the block count down.
        (
            "v1/core/single_type_kv_cache_manager.py",
            "num_required_blocks = cdiv(num_tokens, self.block_size)\n"
            "        num_new_blocks = num_required_blocks - len(req_blocks)",
            "num_required_blocks = num_tokens // self.block_size\n"
            "        num_new_blocks = num_required_blocks - len(req_blocks)",
        ),
        # CircularBufferManager takes two ring blocks where it needs one.
        (
            "v1/core/single_type_kv_cache_manager.py",
            "return 0 if self.req_to_blocks.get(request_id) else 1",
            "return 0 if self.req_to_blocks.get(request_id) else 2",
        ),
    ],
    ids=["blocks-rounded-down", "two-ring-blocks"],
)
def test_a_broken_allocator_fails_the_corpus_with_exit_1_and_no_input_error(
    pristine_tree, tmp_path, module, old, new
):
    tree = tree_with_replacement(pristine_tree, tmp_path / "vllm-tree", module, old, new)
    out = tmp_path / "report"
    done = run_kvconform(
        "run", REPO / "scenarios", "--vllm-src", tree, "--report-dir", out, "--progress", "off",
        "-q", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout[-3000:] + done.stderr
    report = json.loads((out / "report.json").read_text())
    verdicts = {s["id"]: s for s in report["scenarios"]}
    inputs = [s["id"] for s in report["scenarios"] if s.get("error_kind") == "input"]
    assert inputs == [] and report["input_errors"] == [], inputs
    assert any(s["verdict"] == "failed" for s in verdicts.values())
    if "num_tokens // self.block_size" in new:
        for name in EXACT_POOL_HYBRIDS:
            entry = verdicts[name]
            assert entry["verdict"] == "failed", entry
            capacity = [f for f in entry["failures"] if f["check"] == "capacity"]
            assert capacity and "by the scenario's own arithmetic" in capacity[0]["message"]


def test_a_failure_beside_bad_input_exits_1_and_bad_input_alone_2(vllm, tmp_path, capsys):
    # vLLM raising on a valid scenario (a sink group's manager, 0.33 and 0.34) is a
    # failure; beside a file that does not load, the run still exits 1 (docs/cli.md).
    (tmp_path / "sink.yaml").write_text(
        "model: {groups: [{type: sink_full_attention, sink_len: 16}]}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n",
        encoding="utf-8",
    )
    (tmp_path / "bad.yaml").write_text(
        "requests: {a: {prompt_len: 5}}\nsteps: [{a: fly}]\n", encoding="utf-8"
    )
    out = tmp_path / "report"
    argv = ["run", str(tmp_path), "--report-dir", str(out), "--progress", "off", "--no-expectations"]
    assert main(argv) == ExitStatus.NONCONFORMANCE
    report = json.loads((out / "report.json").read_text())
    assert report["exit_status"] == 1 and len(report["input_errors"]) == 1
    assert "bad.yaml:2" in capsys.readouterr().out
    # Under git bisect run: bad (1), not abort (128).
    assert main(["check", str(tmp_path), "--no-expectations", "--progress", "off"]) == 1
    (tmp_path / "sink.yaml").unlink()
    assert main(argv) == ExitStatus.BAD_INPUT
    assert main(["check", str(tmp_path), "--no-expectations", "--progress", "off"]) == 128


def test_a_file_that_is_not_utf8_is_one_input_error_and_the_rest_runs(tmp_path, capsys):
    (tmp_path / "good.yaml").write_text(
        "model: {groups: [full_attention]}\nrequests: {a: {prompt_len: 20}}\n"
        "steps: [{a: {prefill: 20}}, {a: finish}]\n",
        encoding="utf-8",
    )
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\nmodel: {groups: [full_attention]}\n")
    loaded = load_paths([tmp_path])
    assert [s.id for s in loaded.scenarios] == ["good"]
    (error,) = loaded.errors
    assert error.where.file.endswith("latin1.yaml") and error.where.line == 1
    assert "not UTF-8: byte 0xe9 at offset 9" in error.message
    out = tmp_path / "report"
    status = main(["run", str(tmp_path), "--report-dir", str(out), "--progress", "off"])
    assert status == ExitStatus.BAD_INPUT
    report = json.loads((out / "report.json").read_text())
    assert [s["verdict"] for s in report["scenarios"]] == ["passed"]
    assert "latin1.yaml" in capsys.readouterr().out


def _result(verdict: Verdict, kind: ErrorKind | None = None) -> ScenarioResult:
    return ScenarioResult("x", "x.yaml", verdict, error_kind=kind)


@pytest.mark.parametrize(
    ("verdicts", "input_errors", "expected"),
    [
        # docs/cli.md, "Exit status": the first row that applies wins. A failure is 1
        # whatever input errors came with it; 2 only where nothing failed.
        ([Verdict.FAILED, (Verdict.ERROR, ErrorKind.UNSUPPORTED)], 1, ExitStatus.NONCONFORMANCE),
        ([(Verdict.ERROR, ErrorKind.INPUT), Verdict.FAILED], 0, ExitStatus.NONCONFORMANCE),
        ([(Verdict.ERROR, ErrorKind.CRASH), (Verdict.ERROR, ErrorKind.INPUT)], 2, ExitStatus.NONCONFORMANCE),
        ([(Verdict.ERROR, ErrorKind.INPUT), Verdict.PASSED], 0, ExitStatus.BAD_INPUT),
        ([Verdict.UNSUPPORTED, Verdict.UNSUPPORTED], 1, ExitStatus.BAD_INPUT),
        ([(Verdict.ERROR, ErrorKind.UNSUPPORTED), Verdict.PASSED], 1, ExitStatus.BAD_INPUT),
        ([Verdict.FAILED, (Verdict.ERROR, ErrorKind.UNSUPPORTED)], 0, ExitStatus.NONCONFORMANCE),
        ([(Verdict.ERROR, ErrorKind.CRASH), Verdict.PASSED], 0, ExitStatus.NONCONFORMANCE),
        ([(Verdict.ERROR, ErrorKind.UNSUPPORTED), Verdict.PASSED], 0, ExitStatus.NOT_EXERCISED),
        ([Verdict.UNSUPPORTED, Verdict.UNSUPPORTED], 0, ExitStatus.NOT_EXERCISED),
        ([Verdict.UNSUPPORTED, Verdict.PASSED, Verdict.SKIPPED], 0, ExitStatus.CONFORM),
        ([Verdict.XFAILED, Verdict.XPASSED], 0, ExitStatus.CONFORM),
    ],
)
def test_exit_precedence(verdicts, input_errors, expected):
    results = [_result(*v) if isinstance(v, tuple) else _result(v) for v in verdicts]
    assert exit_status(results, input_errors) == expected


def test_exit_precedence_is_documented():
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text[text.index("### Precedence") :]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    statuses = [int(row.rstrip(" |").rsplit("|", 1)[1]) for row in rows]
    assert statuses == [1, 2, 3, 0], "docs/cli.md's precedence table is out of order"


def test_coverage_counts_scenarios_per_setting_and_marks_non_defaults():
    from kvconform.harness.coverage import count_settings, render_text
    from kvconform.model.coverage import Coverage
    from kvconform.model.settings import SettingsRecord

    coverage = Coverage()
    defaults = {"enable_caching": True, "prefix_cache_retention_interval": 0}
    for caching in (True, True, False):
        values = {"enable_caching": caching, "prefix_cache_retention_interval": 0}
        count_settings(coverage, SettingsRecord(values, defaults))
    assert dict(coverage.settings["enable_caching"]) == {"true": 2, "false (vLLM: true)": 1}
    assert dict(coverage.settings["prefix_cache_retention_interval"]) == {"0": 3}
    assert "false (vLLM: true): 1" in render_text(coverage)
    assert coverage.to_json()["settings"]["enable_caching"]["true"] == 2


@pytest.mark.slow
def test_a_mamba_align_call_over_its_physical_cap_is_a_failure_not_bad_input(
    pristine_tree, tmp_path
):
    # vLLM 0.30.0's MambaManager: no physical_block_cap, so a running request's checkpoint
    # chunk asks for every new column of its table, most of which align mode leaves null.
    # kvconform's pool arithmetic counts columns; bounded by the cap
    # (model.floors.aligned_state_call_blocks) the refusal is vLLM's, not the scenario's.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "num_new_blocks = min(num_new_blocks, physical_block_cap)",
        "pass",
    )
    scenario = REPO / "scenarios" / "specs" / "mamba-admission-checkpoint-refused.yaml"
    entry = _failed_entry(tree, scenario, tmp_path)
    checks = {f["check"] for f in entry["failures"]}
    assert entry["verdict"] == "failed" and "capacity" in checks, entry
    capacity = next(f for f in entry["failures"] if f["check"] == "capacity")
    assert capacity["request"] == "a" and "refuses it" in capacity["message"]


EXACT_FULL_POOL = """
name: full-exact
model:
  block_size: 16
  max_model_len: 256
  num_blocks: 3
  groups: [full_attention]
requests: {a: {prompt_len: 16}, b: {prompt_len: 16}}
steps:
  - {a: {prefill: 16}}
  - {b: {prefill: 16}}
  - {a: finish, b: finish}
"""


@pytest.mark.slow
def test_an_allocator_that_rounds_block_counts_up_is_a_failure_not_bad_input(
    pristine_tree, tmp_path
):
    # The other over-allocating mutant: SingleTypeKVCacheManager rounds a block-aligned
    # token count up one block too many. The exact pool (2 usable: 1 for a, 1 for b) then
    # refuses b, although by the floor b needs 1 block and a holds 1 more than its floor.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "        num_required_blocks = cdiv(num_tokens, self.block_size)\n"
        "        if apply_admission_cap",
        "        num_required_blocks = num_tokens // self.block_size + 1\n"
        "        if apply_admission_cap",
    )
    scenario = tmp_path / "scenarios" / "full-exact.yaml"
    scenario.parent.mkdir()
    scenario.write_text(EXACT_FULL_POOL.lstrip(), encoding="utf-8")
    entry = _failed_entry(tree, scenario.parent, tmp_path)
    assert entry["verdict"] == "failed", entry
    assert any(f["check"] == "capacity" and f["request"] == "b" for f in entry["failures"]), entry


ZEROING = REPO / "scenarios" / "admission" / "connector-async-load-blocks-not-zeroed.yaml"


SCHEDULER_ZEROING = REPO / "scenarios" / "scheduler" / "sched-remote-prefill-hybrid-zeroing.yaml"


def _sanity_failures(
    pristine_tree, tmp_path, module, old, new, scenario, mentioning, select=None
) -> tuple[list, dict]:
    """``scenario`` against a copy of vLLM with ``old`` replaced by ``new`` in ``module``,
    which must fail: its sanity failures whose message says ``mentioning``, and the whole
    entry."""
    tree = tree_with_replacement(pristine_tree, tmp_path / "vllm-tree", module, old, new)
    entry = _failed_entry(tree, scenario, tmp_path, select)
    failures = [
        f for f in entry["failures"] if f["check"] == "sanity" and mentioning in f["message"]
    ]
    return failures, entry


@pytest.mark.slow
def test_a_new_block_left_off_the_zeroing_list_fails_sanity(pristine_tree, tmp_path):
    # With Mamba layers vLLM zeroes new attention blocks before the step (#35219); an
    # allocator that stops listing them leaves stale bytes for the model to read.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/single_type_kv_cache_manager.py",
        "            if self._record_new_block_ids:\n"
        "                self.new_block_ids.extend(b.block_id for b in new_blocks)",
        "            if not self._record_new_block_ids:\n"
        "                self.new_block_ids.extend(b.block_id for b in new_blocks)",
        ZEROING,
        "zero",
    )
    assert failures and failures[0]["request"] == "a", entry
    assert "not handed to the worker to zero" in failures[0]["message"]


@pytest.mark.slow
def test_a_loaded_block_on_the_zeroing_list_fails_sanity(pristine_tree, tmp_path):
    # A one-token asynchronous load no longer goes through allocate_new_computed_blocks
    # (which honours skip_zeroing_group_ids): its block is listed and would be zeroed
    # after the connector wrote it.
    (failure,), entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/kv_cache_manager.py",
        "            or num_external_computed_tokens > 0\n",
        "            or num_external_computed_tokens > 1\n",
        ZEROING,
        "zero",
    )
    assert failure["request"] == "b" and "valid before the step" in failure["message"], entry


@pytest.mark.slow
def test_a_scheduler_that_zeroes_loading_blocks_fails_sanity(pristine_tree, tmp_path):
    # Scheduler.schedule no longer passes the loaded groups as skip_zeroing_group_ids: the
    # blocks a's asynchronous load writes go on the step's zeroing list.
    (failure,), entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "                        if load_kv_async and self.connector is not None\n",
        "                        if load_kv_async and self.connector is None\n",
        SCHEDULER_ZEROING,
        "zero",
    )
    assert failure["request"] == "a" and "valid before the step" in failure["message"], entry


@pytest.mark.slow
def test_a_scheduler_that_zeroes_held_blocks_again_fails_sanity(pristine_tree, tmp_path):
    # The step's list also names the running requests' attention blocks: KV they computed
    # (or loaded) at earlier steps would be wiped.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "        return new_block_ids_to_zero or None\n",
        "        return (new_block_ids_to_zero + [\n"
        "            b for r in self.running\n"
        "            for b in self.kv_cache_manager.get_block_ids(r.request_id)[0]\n"
        "        ]) or None\n",
        SCHEDULER_ZEROING,
        "zero",
    )
    assert any("held with their KV at the last step" in f["message"] for f in failures), entry


# A hybrid model whose prompt ends inside a Mamba block, with prefix caching: the state at
# its end is cached on the block the next step overwrites, then copied out of the way.
PARTIAL_TAIL = (
    REPO / "scenarios" / "hybrid" / "hybrid-full-attention-partial-block-hit-exact-pool.yaml"
)
COW_HANDOFF = (
    "                            self._pending_boundary_state_offloads.append(\n"
    "                                (\n"
    "                                    request_id,\n"
    "                                    self.kv_cache_group_id,\n"
    "                                    cow_block,\n"
)


def _handoff_failures(pristine_tree, tmp_path, old, new) -> tuple[list, dict]:
    return _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/single_type_kv_cache_manager.py",
        old,
        new,
        PARTIAL_TAIL,
        "connector",
    )


@pytest.mark.slow
def test_a_copied_boundary_state_not_handed_over_fails_sanity(pristine_tree, tmp_path):
    # The copy-on-write of a's partial tail keeps the state of its 96-token prompt in a new
    # block; a manager that forgets the producer's tail never offers that block to a P/D
    # connector, which then cannot offload the prefix a computed.
    failures, entry = _handoff_failures(
        pristine_tree,
        tmp_path,
        "                        if producer_tail is not None:\n",
        "                        if producer_tail is None:\n",
    )
    assert failures and failures[0]["request"] == "a", entry
    assert "does not hand it to the KV connector" in failures[0]["message"]


@pytest.mark.slow
def test_handing_over_the_overwritten_copy_source_fails_sanity(pristine_tree, tmp_path):
    # Offering the copy's source instead: the next forward overwrites that block, so the
    # connector would offload another state than the one of 96 tokens it is told.
    failures, entry = _handoff_failures(
        pristine_tree, tmp_path, COW_HANDOFF, COW_HANDOFF.replace("cow_block,", "source_block,")
    )
    messages = " ".join(f["message"] for f in failures)
    assert "no longer holds it" in messages and "does not hand it" in messages, entry


@pytest.mark.slow
def test_a_manager_default_unlike_its_coordinators_fails_sanity(pristine_tree, tmp_path):
    # The coordinator forwards apply_admission_cap=False ("no cap") unless told; a manager
    # whose own default is True caps the count of every caller that leaves it out
    # (HiSparseSourceManager's call of its base class).
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "        apply_admission_cap: bool = False,\n        prefill_end: int = 0,\n    ) -> int:\n"
        '        """Get the number of blocks needed',
        "        apply_admission_cap: bool = True,\n        prefill_end: int = 0,\n    ) -> int:\n"
        '        """Get the number of blocks needed',
    )
    entry = _failed_entry(
        tree,
        REPO / "scenarios" / "specs" / "sliding-window-skipped-evictable-hit-not-counted.yaml",
        tmp_path,
    )
    (failure,) = [f for f in entry["failures"] if "defaults to True" in f["message"]]
    assert failure["check"] == "sanity", entry
    assert (
        "SlidingWindowManager.get_num_blocks_to_allocate(apply_admission_cap)" in failure["message"]
    )


@pytest.mark.slow
def test_a_scheduler_that_skips_zeroing_a_synchronous_load_fails_sanity(pristine_tree, tmp_path):
    # Only an asynchronous load writes its blocks before the step; the DecodeBenchConnector
    # loads a's prompt synchronously, after the worker zeroes the step's new blocks, so a
    # scheduler that passes skip_zeroing_group_ids for it leaves stale bytes under the load.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "                        if load_kv_async and self.connector is not None\n",
        "                        if load_kv_async or self.connector is not None\n",
        REPO / "scenarios" / "scheduler" / "sched-sync-load-hybrid-zeroing.yaml",
        "zero",
    )
    assert {f["request"] for f in failures} == {"a", "b"}, entry
    assert all("not on the step's zeroing list" in f["message"] for f in failures)


HISPARSE_LONGER = REPO / "scenarios" / "hybrid" / "hisparse-host-hit-longer-than-device.yaml"
HISPARSE_CONNECTOR = (
    REPO / "scenarios" / "hybrid" / "hisparse-host-hit-beside-connector-tokens.yaml"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "scenario"),
    [
        # The source's longer host hit kept whole: r's table keeps a's host blocks past the
        # 32 tokens every group agrees on, and r computes into a's published pages.
        (
            "                for group_id in self.retained_hit_group_ids:\n",
            "                for group_id in ():\n",
            HISPARSE_LONGER,
        ),
        # The trim forgets the connector's tokens: 16 local tokens keep one host block where
        # the local and external hits cover two.
        (
            "reused = num_new_computed_tokens + num_external_computed_tokens",
            "reused = num_new_computed_tokens",
            HISPARSE_CONNECTOR,
        ),
    ],
)
def test_a_retained_hit_trimmed_otherwise_fails_sanity(pristine_tree, tmp_path, old, new, scenario):
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "vllm-tree", "v1/core/kv_cache_manager.py", old, new
    )
    entry = _failed_entry(tree, scenario, tmp_path)
    (failure,) = [
        f for f in entry["failures"] if "retained" in f["message"] or "keeps a hit" in f["message"]
    ]
    assert failure["check"] == "sanity" and failure["request"] == "r", entry
    assert "so its table should start with those and hold no more" in failure["message"]


@pytest.mark.slow
def test_an_eviction_without_its_removed_event_fails_sanity(pristine_tree, tmp_path):
    # A router counting vLLM's KV events would keep routing to an evicted block: the pool
    # no longer caches it, the events still say it does.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/block_pool.py",
        "        self._emit_block_removed_events(evicted_hashes)\n        return True\n",
        "        return True\n",
    )
    entry = _failed_entry(
        tree,
        REPO / "scenarios" / "specs" / "kv-events-prefix-computed-twice-evicted.yaml",
        tmp_path,
    )
    failures = [f for f in entry["failures"] if "KV-cache events" in f["message"]]
    assert failures and all(f["check"] == "sanity" for f in failures), entry
    # Evicted blocks stay announced: the events count more copies than the pool holds.
    pairs = re.findall(r"announced (\d+), cached (\d+)", failures[0]["message"])
    assert pairs and all(int(said) > int(held) for said, held in pairs), failures[0]


SCHEDULER_STOPS = REPO / "scenarios" / "scheduler" / "sched-stop-tokens.yaml"
SCHEDULER_STATS = REPO / "scenarios" / "scheduler" / "sched-scheduler-stats.yaml"


@pytest.mark.slow
def test_a_scheduler_that_ignores_stop_tokens_fails_sanity(pristine_tree, tmp_path):
    # check_stop no longer honours SamplingParams.stop_token_ids: a samples its stop token
    # as output 4 and runs on to max_tokens, holding its blocks; b stops on EOS as before.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/utils.py",
        "    if last_token_id in (sampling_params.stop_token_ids or ()):",
        "    if False:",
        f"{SCHEDULER_STOPS}::sched-stop-tokens[sync]",
        "stop token",
    )
    assert failures and {f["request"] for f in failures} == {"a"}, entry
    assert "as output 4 (stop_at)" in failures[0]["message"], failures[0]
    assert "not stopped" in failures[0]["message"] or "unfinished" in failures[0]["message"]


@pytest.mark.slow
def test_a_kv_cache_usage_that_counts_the_null_block_fails_sanity(pristine_tree, tmp_path):
    # BlockPool.get_usage divides by the whole pool, the null block included: every step's
    # SchedulerStats.kv_cache_usage is below what the requests' holdings give.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/block_pool.py",
        "        total_gpu_blocks = self.num_gpu_blocks - 1",
        "        total_gpu_blocks = self.num_gpu_blocks",
        f"{SCHEDULER_STATS}::sched-scheduler-stats[overlapped]",
        "kv_cache_usage",
    )
    assert failures, entry
    assert "of the pool's 25 blocks" in failures[0]["message"], failures[0]


@pytest.mark.slow
def test_prefix_cache_stats_that_miss_a_resumption_fail_sanity(pristine_tree, tmp_path):
    # record_prefix_cache_stats counts a resumed (preempted) request's lookup as a new
    # request's: d's resumption lands in requests/queries/hits, not preempted_*.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/kv_cache_manager.py",
        "            preempted=request.num_preemptions > 0,",
        "            preempted=False,",
        f"{SCHEDULER_STATS}::sched-scheduler-stats[sync]",
        "prefix_cache_stats",
    )
    assert len(failures) == 1, entry
    assert "d (resumed" in failures[0]["message"], failures[0]


@pytest.mark.slow
def test_prefix_cache_stats_that_miss_a_reset_fail_sanity(pristine_tree, tmp_path):
    # KVCacheManager.reset_prefix_cache no longer marks its stats reset: the hit-rate
    # metric keeps the window of the cache the reset emptied.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/kv_cache_manager.py",
        "            self.prefix_cache_stats.reset = True\n",
        "            pass\n",
        REPO / "scenarios" / "scheduler" / "sched-remote-prefill-connector-reset.yaml",
        "reset",
    )
    assert len(failures) == 1, entry
    assert "prefix_cache_stats.reset is False, but a reset_prefix_cache" in (
        failures[0]["message"]
    ), failures[0]
    assert len(entry["failures"]) == 1, entry  # nothing else notices


SCHEDULER_SESSION = REPO / "scenarios" / "scheduler" / "sched-streaming-session.yaml"


@pytest.mark.slow
def test_a_session_that_keeps_its_last_sampled_token_fails_sanity(pristine_tree, tmp_path):
    # _update_request_as_session keeps the turn's last sampled token, which was never
    # computed: each next turn's sequence is one token longer than the turns leave.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "        keep_end = session.num_tokens - 1\n",
        "        keep_end = session.num_tokens\n",
        SCHEDULER_SESSION,
        "streaming session",
    )
    assert [f["request"] for f in failures] == ["s", "s"], entry
    assert "holds a sequence of 65 tokens, not 64" in failures[0]["message"], failures[0]


SCHEDULER_PAUSE = REPO / "scenarios" / "scheduler" / "sched-pause-new-requests.yaml"


@pytest.mark.slow
def test_a_pause_that_admits_new_requests_fails_sanity(pristine_tree, tmp_path):
    # PAUSED_NEW no longer keeps the waiting queue closed: b, arriving during the pause, is
    # admitted at once.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "                if not request_queue and self._pause_state == PauseState.UNPAUSED:\n",
        "                if not request_queue:\n",
        f"{SCHEDULER_PAUSE}::sched-pause-new-requests[sync]",
        "paused",
    )
    assert [(f["request"], f["step"]) for f in failures] == [("b", 3)], entry


@pytest.mark.slow
def test_a_session_released_while_it_waits_for_input_fails_sanity(pristine_tree, tmp_path):
    # _handle_stopped_request finishes a session whose next chunk has not arrived instead
    # of keeping it (WAITING_FOR_STREAMING_REQ): turn 2's end releases its blocks.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "        if not request.resumable:\n            return True\n\n        # Drop",
        "        if not request.resumable or not request.streaming_queue:\n"
        "            return True\n\n        # Drop",
        SCHEDULER_SESSION,
        "before its input stream closes",
    )
    assert failures and failures[0]["request"] == "s", entry
    assert "released in turn 2" in failures[0]["message"], failures[0]


@pytest.mark.slow
def test_an_abort_of_all_that_keeps_waiting_requests_fails_sanity(pristine_tree, tmp_path):
    # finish_requests(None) aborts only the running requests: b, waiting for the pool,
    # stays in the scheduler through the engine's pause with mode abort.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "            request_ids = self.requests.keys()\n",
        "            request_ids = [r.request_id for r in self.running]\n",
        REPO / "scenarios" / "scheduler" / "sched-pause-abort.yaml",
        "aborted every request",
    )
    assert [(f["request"], f["step"]) for f in failures] == [("b", 4)], entry


@pytest.mark.slow
def test_connector_stats_without_the_loaded_tokens_fail_sanity(pristine_tree, tmp_path):
    # The scheduler records a connector lookup's hits as 0: a's and c's remote loads are
    # missing from connector_prefix_cache_stats.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "                        connector_prefix_cache_hits = num_external_computed_tokens\n",
        "                        connector_prefix_cache_hits = 0\n",
        REPO / "scenarios" / "scheduler" / "sched-remote-prefill-stats.yaml",
        "connector_prefix_cache_stats",
    )
    assert [f["step"] for f in failures] == [0, 5], entry
    assert "(c (loading 38, local hit 32))" in failures[1]["message"], failures[1]


# Evict, reset, prefix-cache stats and a hit's re-announcement, all in one scenario.
BETWEEN_STEPS = REPO / "scenarios" / "specs" / "prefix-cache-evict-reset-stats.yaml"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "old", "new", "mentioning"),
    [
        # evict_blocks forgets the cache: the reported-invalid block keeps its hash and b
        # would hit KV the connector said is invalid.
        (
            "v1/core/block_pool.py",
            "            self._maybe_evict_cached_block(block)\n\n    def reset_prefix_cache",
            "            pass\n\n    def reset_prefix_cache",
            "leaves block(s)",
        ),
        # reset_prefix_cache resets while a request holds blocks.
        (
            "v1/core/block_pool.py",
            "        if num_used_blocks != 1:  # The null block is always marked as used",
            "        if False:",
            "reset_prefix_cache answers True",
        ),
        # A preempted request's lookup counted as a new request's.
        (
            "v1/core/kv_cache_manager.py",
            "            preempted=request.num_preemptions > 0,",
            "            preempted=False,",
            "prefix-cache stats",
        ),
        # A full-report request's lookup re-announces one block fewer than it reuses.
        (
            "v1/core/kv_cache_coordinator.py",
            "                    len(group_blocks),\n",
            "                    len(group_blocks) - 1,\n",
            "announces []",
        ),
    ],
    ids=["evict", "reset", "stats", "reannounce"],
)
def test_what_the_engine_does_between_steps_is_judged(
    pristine_tree, tmp_path, module, old, new, mentioning
):
    failures, entry = _sanity_failures(
        pristine_tree, tmp_path, module, old, new, BETWEEN_STEPS, mentioning
    )
    assert failures, entry


@pytest.mark.slow
def test_a_request_skipping_the_prefix_cache_counted_in_the_stats_fails_sanity(
    pristine_tree, tmp_path
):
    # record_prefix_cache_stats made to count a request that skips reading the prefix
    # cache: b's and d's lookups, which never happened, show up in the stats.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/kv_cache_manager.py",
        "        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):\n",
        "        if not self.log_stats:\n",
        REPO / "scenarios" / "admission" / "skip-reading-prefix-cache-hybrid-connector.yaml",
        "prefix-cache stats",
    )
    assert failures and failures[0]["step"] == 2, entry


NULL_COLUMNS = (
    REPO / "scenarios" / "hybrid" / "kv-events-full-report-sliding-window-null-columns.yaml"
)


@pytest.mark.slow
def test_a_full_report_that_names_null_columns_fails_and_its_fix_passes(pristine_tree, tmp_path):
    # vLLM as released re-announces the sliding-window group's null hit columns under
    # b's hashes (scenarios/expectations.yaml): the rule holds the re-announcement to
    # the blocks b reuses.
    released = tmp_path / "released"
    released.mkdir()
    entry = _failed_entry(pristine_tree, NULL_COLUMNS, released)
    (failure,) = [f for f in entry["failures"] if f["check"] == "sanity"]
    assert failure["request"] == "b" and "announces" in failure["message"], entry
    # A vLLM that announces only the hit's blocks the group caches passes: the null
    # columns are no blocks to announce, so the rule does not ask for them.
    fixed = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/block_pool.py",
        "            cached_hashes.append(maybe_convert_block_hash(block_hashes[i]))\n",
        "            if self.get_cached_block(block_hashes[i], [kv_cache_group_id]) is None:\n"
        "                continue\n"
        "            cached_hashes.append(maybe_convert_block_hash(block_hashes[i]))\n",
    )
    out = tmp_path / "report"
    done = run_kvconform(
        "run", NULL_COLUMNS, "--vllm-src", fixed, "--report-dir", out, "--progress", "off",
        "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.CONFORM, done.stdout + done.stderr


@pytest.mark.slow
def test_a_second_lookup_after_a_load_left_out_of_the_stats_fails_sanity(pristine_tree, tmp_path):
    # record_prefix_cache_stats made to skip a request the connector has served
    # (NixlConnector clears do_remote_prefill in update_state_after_alloc, before the
    # record): the lookups of step 0's loads go uncounted, and so do a's and b's second
    # lookups in step 1, after loads that left them nothing computed. Sanity names those.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "                if did_prefix_cache_lookup:\n"
        "                    self.kv_cache_manager.record_prefix_cache_stats(",
        "                if did_prefix_cache_lookup and (request.kv_transfer_params or {}).get(\n"
        '                    "do_remote_prefill", True\n'
        "                ):\n"
        "                    self.kv_cache_manager.record_prefix_cache_stats(",
        REPO / "scenarios" / "scheduler" / "sched-remote-prefill-stats-lookup-again.yaml",
        "prefix_cache_stats {'requests': 0",
    )
    local = {f["step"]: f["message"] for f in failures if "connector_prefix" not in f["message"]}
    assert sorted(local) == [0, 1], entry
    assert (
        "a (looked up again after its KV load, 1 tokens, hit 0), "
        "b (looked up again after its KV load, 40 tokens, hit 0)" in local[1]
    ), local[1]


WHOLE_PROMPT_LOAD = (
    REPO / "scenarios" / "scheduler" / "sched-remote-prefill-sliding-window-last-token.yaml"
)


@pytest.mark.slow
def test_a_whole_prompt_load_that_nulls_the_recomputed_tokens_window_fails_and_its_fix_passes(
    pristine_tree, tmp_path
):
    # vLLM as released (docs/findings.md #14) lays a's sliding-window columns out for the
    # loaded 47 tokens, then recomputes position 46, whose window reaches position 15 in
    # the null column 0 (scenarios/expectations.yaml).
    released = tmp_path / "released"
    released.mkdir()
    entry = _failed_entry(pristine_tree, WHOLE_PROMPT_LOAD, released)
    (failure,) = [f for f in entry["failures"] if f["check"] == "sanity"]
    assert failure["request"] == "a" and "attends to positions 15..46" in failure["message"]
    # The proposed fix: a sliding-window group makes the connector stop one token short,
    # as Mamba does, so the table is laid out for the token the decoder computes.
    fixed = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py",
        "            1 if self._has_mamba or self._bounded_replay else 0,\n",
        "            1\n"
        "            if self._has_mamba\n"
        "            or self._bounded_replay\n"
        "            or any(\n"
        "                isinstance(g.kv_cache_spec, SlidingWindowSpec)\n"
        "                for g in self.kv_cache_config.kv_cache_groups\n"
        "            )\n"
        "            else 0,\n",
    )
    out = tmp_path / "report"
    done = run_kvconform(
        "run", WHOLE_PROMPT_LOAD, "--vllm-src", fixed, "--report-dir", out, "--progress", "off",
        "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.CONFORM, done.stdout + done.stderr


SHORT_WINDOW_HIT = REPO / "scenarios" / "hybrid" / "sliding-window-eagle-short-hit-realigned.yaml"


@pytest.mark.slow
def test_a_short_window_hit_aligned_before_the_eagle_drop_fails_and_its_fix_passes(
    pristine_tree, tmp_path
):
    # vLLM as released aligns a run shorter than the window before EAGLE's drop
    # (scenarios/expectations.yaml): b's hit is 0, the scenario derives 32.
    released = tmp_path / "released"
    released.mkdir()
    entry = _failed_entry(pristine_tree, SHORT_WINDOW_HIT, released)
    (failure,) = [f for f in entry["failures"] if f["check"] == "sanity"]
    assert "hit of 0 tokens" in failure["message"], entry
    # Aligning the run as it stands after the drop, as the match_found path does: 32.
    fixed = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/single_type_kv_cache_manager.py",
        "                del computed[num_contiguous_blocks:]\n"
        "            while (\n"
        "                block_size != alignment_tokens  # Faster for common case.\n"
        "                and len(computed_blocks[0]) * block_size % alignment_tokens != 0\n",
        "                del computed[num_contiguous_blocks:]\n"
        "            dropped = 1 if drop_eagle_block and computed_blocks[0] else 0\n"
        "            while (\n"
        "                block_size != alignment_tokens  # Faster for common case.\n"
        "                and (len(computed_blocks[0]) - dropped) * block_size\n"
        "                % alignment_tokens != 0\n",
    )
    out = tmp_path / "report"
    done = run_kvconform(
        "run", SHORT_WINDOW_HIT, "--vllm-src", fixed, "--report-dir", out, "--progress", "off",
        "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.CONFORM, done.stdout + done.stderr


@pytest.mark.slow
def test_a_shared_prefix_junction_left_unpinned_fails_sanity(pristine_tree, tmp_path):
    # Sparse retention keeps a sliding window's blocks at a shared-prefix junction only
    # because cache_blocks pins request.shared_prefix_boundary: without it, a third request
    # sharing the prefix finds no window blocks there and hits nothing.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/single_type_kv_cache_manager.py",
        "            reachable_boundaries.append(request.shared_prefix_boundary)\n",
        "            pass\n",
        REPO / "scenarios" / "specs" / "sliding-window-sparse-retention-shared-junction.yaml",
        "prefix-cache hit",
    )
    assert failures and failures[0]["request"] == "c", entry


@pytest.mark.slow
def test_an_in_flight_finish_that_loses_a_block_fails_sanity(pristine_tree, tmp_path):
    # pop_blocks_for_free leaves a block out: the scheduler never returns it to the pool.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/single_type_kv_cache_manager.py",
        "        return trim_null_head(req_blocks)\n",
        "        return trim_null_head(req_blocks)[1:]\n",
        REPO / "scenarios" / "admission" / "in-flight-finish-defers-free.yaml",
        "pop_blocks_for_free gives blocks",
    )
    assert failures and failures[0]["request"] == "a", entry


@pytest.mark.slow
def test_a_partial_tail_kept_from_the_connector_at_finish_fails_sanity(pristine_tree, tmp_path):
    # finalize_partial_tail_offloads stops handing over the finishing producer's partial
    # tail: the prefix its prefill computed can no longer be offloaded.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/single_type_kv_cache_manager.py",
        "        return self.kv_cache_group_id, source_block, boundary_tokens\n",
        "        return None\n",
        REPO / "scenarios" / "hybrid" / "hybrid-mamba-partial-tail-handed-over-at-finish.yaml",
        "partial-tail Mamba state",
    )
    assert failures and failures[0]["request"] == "a", entry


SCHEDULER_STOP_PREEMPTED = REPO / "scenarios" / "scheduler" / "sched-stop-while-preempted.yaml"


@pytest.mark.slow
def test_a_stale_output_that_cannot_stop_a_preempted_request_fails_sanity(pristine_tree, tmp_path):
    # check_stop skipped for a preempted request's in-flight (stale) output: c's stop token,
    # output 21 of its step-8 output, is delivered but does not finish it; c resumes and
    # runs on to max_tokens.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "            stopped = check_stop(request, self.max_model_len)",
        "            stopped = not is_stale and check_stop(request, self.max_model_len)",
        f"{SCHEDULER_STOP_PREEMPTED}::sched-stop-while-preempted",
        "stop token",
    )
    assert failures and {f["request"] for f in failures} == {"c"}, entry
    assert "as output 21 (stop_at)" in failures[0]["message"], failures[0]


SCHEDULER_RECOMPUTE = REPO / "scenarios" / "scheduler" / "sched-remote-load-recompute.yaml"


SCHEDULER_REMOTE_REPLAY = (
    REPO / "scenarios" / "scheduler" / "sched-remote-prefill-bounded-replay.yaml"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "scenario", "says"),
    [
        # Under kv_load_failure_policy recompute vLLM truncates a's computed tokens at the
        # first block the load left unwritten (index 2: 32 tokens). Truncating one block
        # later counts the unwritten block as computed: the model would read KV never
        # delivered.
        (
            "                request.num_computed_tokens = idx * self.block_size",
            "                request.num_computed_tokens = (idx + 1) * self.block_size",
            SCHEDULER_RECOMPUTE,
            "with 48 tokens computed, but the scenario states 32",
        ),
        # A load of the request's own blocks carries the bounded-replay window; replaying
        # it anyway rewinds a to 127 - 64 = 63 and recomputes KV it has.
        (
            "            window_loaded=not load_failed\n",
            "            window_loaded=False\n",
            SCHEDULER_REMOTE_REPLAY,
            "with 63 tokens computed, but the scenario states 127",
        ),
    ],
    ids=["recompute-keeps-unwritten-block", "replays-a-loaded-window"],
)
def test_a_load_scheduled_with_other_computed_tokens_fails_sanity(
    pristine_tree, tmp_path, old, new, scenario, says
):
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        old,
        new,
        scenario,
        "expect_loaded",
    )
    assert failures and {f["request"] for f in failures} == {"a"}, entry
    assert says in failures[0]["message"], failures[0]


SCHEDULER_OVERLAPPED_LOADS = (
    REPO / "scenarios" / "scheduler" / "sched-remote-prefill-overlapped.yaml"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "mentioning", "says"),
    [
        # Every free returns its blocks at once, a step that may write them in flight or not.
        (
            "        return not self.defer_block_free or (",
            "        return True or (",
            "in flight",
            "while step 2, which scheduled it, was in flight",
        ),
        # Deferred blocks never go back to the pool.
        (
            "            fence, _ = self.deferred_frees[0]\n"
            "            if fence > self.processed_step_seq:",
            "            fence, _ = self.deferred_frees[0]\n            if True:",
            "went back",
            "held 3 distinct blocks but 0 went back to the pool",
        ),
    ],
    ids=["never-deferred", "never-drained"],
)
def test_blocks_returned_while_a_step_may_write_them_fail_sanity(
    pristine_tree, tmp_path, old, new, mentioning, says
):
    # c finishes in step 1's output while step 2, which scheduled it, is in flight: its 3
    # blocks must go back with step 2's output, not before (Scheduler.defer_block_free) and
    # not never.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        old,
        new,
        SCHEDULER_OVERLAPPED_LOADS,
        mentioning,
    )
    assert failures and {f["request"] for f in failures} == {"c"}, entry
    assert says in failures[0]["message"], failures[0]


PRIORITY_PREEMPT_SCHEDULED = (
    REPO / "scenarios" / "scheduler" / "sched-priority-preempt-scheduled.yaml"
)


@pytest.mark.slow
def test_a_priority_victim_left_in_its_step_fails(pristine_tree, tmp_path):
    # Scheduler.schedule no longer takes a request it preempts for priority out of the step
    # it was already scheduled in: b stays scheduled with its tokens while its blocks went
    # back to the pool. vLLM's own closing assertion in schedule (no more scheduled requests
    # than running ones) stops that step, so the scenario goes red as a crash there.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/sched/scheduler.py",
        "                        if preempted_req in scheduled_running_reqs:\n",
        "                        if False:\n",
    )
    entry = _failed_entry(tree, PRIORITY_PREEMPT_SCHEDULED, tmp_path)
    assert (entry["verdict"], entry["error_kind"]) == ("error", "crash"), entry
    assert "AssertionError" in entry["error"] and "scheduler.py" in entry["error"], entry


SCHEDULER_KV_EVENTS = REPO / "scenarios" / "scheduler" / "sched-kv-cache-events.yaml"


@pytest.mark.slow
def test_a_scheduler_that_drops_its_kv_cache_events_fails_sanity(pristine_tree, tmp_path):
    # update_from_output drains the manager's events every step; a scheduler that publishes
    # them only beside a KV connector's leaves a router with an empty prefix cache.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/core/sched/scheduler.py",
        "        # publish collected KV cache events\n        if events:",
        "        # publish collected KV cache events\n        if events and self.connector is not None:",
        SCHEDULER_KV_EVENTS,
        "KV-cache events",
        select="sync and not async",
    )
    assert failures and failures[0]["request"] == "-", entry
    assert "announced 0, cached 1" in failures[0]["message"], failures[0]["message"]


SCHEDULER_SPEC_METRICS = REPO / "scenarios" / "scheduler" / "sched-spec-decode-metrics.yaml"


@pytest.mark.slow
def test_spec_decode_metrics_that_count_drafts_as_accepted_fail_sanity(pristine_tree, tmp_path):
    # The per-request metrics a client reads: a detailed record of proposals where the
    # accepted counts belong says every draft was accepted.
    failures, entry = _sanity_failures(
        pristine_tree,
        tmp_path,
        "v1/metrics/stats.py",
        "self.per_step_accepted.append(num_accepted)",
        "self.per_step_accepted.append(num_draft_tokens)",
        SCHEDULER_SPEC_METRICS,
        "spec-decode metrics",
        select="sync",
    )
    # None of a, b, c accepts every draft every time: each of their records reads wrong.
    assert {"a", "b", "c"} <= {f["request"] for f in failures}, entry
