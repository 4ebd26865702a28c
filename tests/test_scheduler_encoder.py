"""Multimodal encoder inputs in scheduler mode: the loader's ``mm_inputs``, the encoder
budget kvconform gives vLLM's scheduler, and the ``sanity`` rules of the worker's encoder
cache, shown red against copies of vLLM with one line of its encoder scheduling changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_copy import REPO, run_kvconform, tree_with_patch, tree_with_replacement

from kvconform.errors import ExitStatus, ScenarioError
from kvconform.harness import runner
from kvconform.harness.loader import load_file
from kvconform.model.observations import (
    CHUNKS_DIFFER,
    ENCODER_BUDGET_EXCEEDED,
    ENCODER_OUTPUT_MISSING,
    ENCODER_STATS_DIFFER,
    MM_INPUT_SPLIT,
    REJECTION_DIFFERS,
)
from kvconform.model.results import Verdict
from kvconform.model.scenario import MmInput

SCENARIOS = REPO / "scenarios" / "scheduler"

TWO_IMAGES = """
kind: scheduler
model: {max_model_len: 512, num_blocks: 64}
scheduler: {mode: sync, max_num_batched_tokens: 128, max_num_encoder_input_tokens: 64}
requests:
  a:
    prompt_len: 160
    mm_inputs: [{offset: 8, length: 32}, {offset: 48, length: 48, id: cat}]
  b: {prompt_len: 80, mm_inputs: [{offset: 4, length: 48, id: cat}]}
"""


def test_mm_inputs_are_read_with_default_identifiers(scenario_from):
    scenario = scenario_from(TWO_IMAGES)
    a, b = scenario.requests.values()
    assert a.mm_inputs == (MmInput(8, 32, "a-0"), MmInput(48, 48, "cat"))
    assert b.mm_inputs == (MmInput(4, 48, "cat"),) and a.mm_inputs[1].end == 96
    limits = scenario.scheduler
    assert limits is not None
    assert (limits.max_num_encoder_input_tokens, limits.encoder_cache_size) == (64, None)
    assert not limits.disable_chunked_mm_input


def _request_line(inputs: str, extra: str = "") -> str:
    return (
        "kind: scheduler\nmodel: {max_model_len: 512}\n"
        "scheduler: {mode: sync, max_num_batched_tokens: 64, disable_chunked_mm_input: true}\n"
        "requests:\n"
        "  a: {prompt_len: 100, mm_inputs: [{offset: 0, length: 20, id: cat}]}\n"
        f"  b: {{prompt_len: 100, mm_inputs: {inputs}{extra}}}\n"
    )


@pytest.mark.parametrize(
    ("inputs", "extra", "field", "words"),
    [
        ("[{offset: 90, length: 20}]", "", "requests.b.mm_inputs[0].length",
         "must lie inside the prompt (prompt_len 100)"),
        ("[{offset: 10, length: 20}, {offset: 25, length: 5}]", "",
         "requests.b.mm_inputs[1].offset", "must be at least 30, where the input before ends"),
        ("[{offset: 10, length: 30, id: cat}]", "", "requests.b.mm_inputs[0].length",
         "id 'cat' is one item with 20 placeholders elsewhere, not 30"),
        ("[{offset: 0, length: 0}]", "", "requests.b.mm_inputs[0].length",
         "must be at least 1"),
        ("[{offset: 0, lenght: 8}]", "", "requests.b.mm_inputs[0].length", "is required"),
        ("[]", "", "requests.b.mm_inputs", "must be a non-empty list"),
        ("[8]", "", "requests.b.mm_inputs", "item 0 must be a mapping"),
        ("[{offset: 0, length: 80}]", "", "requests.b.mm_inputs[0].length",
         "must be at most scheduler.max_num_batched_tokens (64) with disable_chunked_mm_input"),
        ("[{offset: 0, length: 8}]", ", remote_prefill: true", "requests.b.mm_inputs",
         "cannot go with remote_prefill"),
    ],
)  # fmt: skip
def test_bad_mm_inputs_name_file_line_and_field(write_scenario, inputs, extra, field, words):
    text = _request_line(inputs, extra)
    if "remote_prefill" in extra:
        text = text.replace(", disable_chunked_mm_input: true", "")
    path = write_scenario(text)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (6, field), str(error)
    assert words in error.message, str(error)
    assert str(error).startswith(f"{path}:6: ")


def test_the_budget_cuts_a_chunk_before_the_image_that_does_not_fit(scenario_from, vllm):
    # Derived from Scheduler._try_schedule_encoder_inputs: a's first chunk (tokens 0..127)
    # overlaps its images of 32 and 48 embeddings; 32 + 48 > 64 (the stated budget), so the
    # chunk stops where the second begins (48). b, in the same step, gets the 80 tokens left
    # but its image (48, the same item "cat") no longer fits the 32 left: it stops at 4.
    scenario = scenario_from(TWO_IMAGES)
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    run = result.trajectory
    assert run is not None
    first = {o.request: o.scheduled for o in run.observations if o.step == 0}
    assert first == {"a": 48, "b": 4}
    assert "encoder budget 64 embeddings a step, encoder cache 128" in run.notes


def _single_mode_copy(name: str, tmp_path: Path, mode: str = "sync") -> Path:
    """The corpus scenario ``name`` with its matrix narrowed to one mode: one report entry."""
    text = (SCENARIOS / name).read_text(encoding="utf-8")
    lines = [
        f"  mode: [{mode}]" if line.startswith("  mode: [") else line for line in text.splitlines()
    ]
    path = tmp_path / "scenarios" / name
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _encoder_failures(pristine_tree, tmp_path, old, new, name, invariant) -> tuple[list, dict]:
    """``name`` against a copy of vLLM with ``old`` replaced by ``new`` in its scheduler, which
    must fail: its sanity failures of ``invariant``, and the whole entry."""
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "vllm-tree", "v1/core/sched/scheduler.py", old, new
    )
    out = tmp_path / "report"
    done = run_kvconform(
        "run", _single_mode_copy(name, tmp_path), "--vllm-src", tree, "--report-dir", out,
        "--progress", "off", "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = json.loads((out / "report.json").read_text())["scenarios"]
    failures = [
        f for f in entry["failures"] if (f.get("detail") or {}).get("invariant") == invariant
    ]
    return failures, entry


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("expect_chunks: [40, 0]", "must be a non-empty list of token counts"),
        ("expect_chunks: 40", "must be a non-empty list of token counts"),
        ("expect_chunks: [60, 50]", "the chunks add up to 110, but the prompt has 100 tokens"),
        ("expect_hit: 32, expect_chunks: [60, 20]",
         "add up to 80, but the prompt has 68 tokens to compute (prompt_len 100 less expect_hit"),
    ],
)  # fmt: skip
def test_bad_expect_chunks_name_the_field(write_scenario, line, words):
    path = write_scenario(
        "kind: scheduler\nmodel: {max_model_len: 512, enable_caching: true}\n"
        f"requests:\n  a: {{prompt_len: 100, {line}}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    assert info.value.where.field == "requests.a.expect_chunks", str(info.value)
    assert words in info.value.message and info.value.where.line == 4, str(info.value)


def test_chunks_other_than_stated_fail_sanity(scenario_from, vllm):
    # a's chunks stated as if the budget held both its images at once (128, then 32): vLLM
    # cuts at 48, where image cat begins, then computes the other 112 with it; sanity names
    # the chunks vLLM used.
    text = TWO_IMAGES.replace(
        "prompt_len: 160\n", "prompt_len: 160\n    expect_chunks: [128, 32]\n"
    )
    result = runner.run_scenario(scenario_from(text), vllm)
    assert result.verdict is Verdict.FAILED
    (failure,) = [f for f in result.failures if f.detail.get("invariant") == CHUNKS_DIFFER]
    assert failure.request == "a"
    assert "in chunks 48+112, but the scenario states 128+32" in failure.message


@pytest.mark.slow
def test_a_chunk_start_on_an_image_split_under_disable_chunked_mm_input_fails_sanity(
    pristine_tree_033, tmp_path
):
    # 0.34 rewrote this test of the scheduler; the rule as 0.33.0 writes it is put back.
    pristine_tree = pristine_tree_033
    # Issue #52306 (fixed by #52412, in 0.33): the rule's "num_computed_tokens <= start_pos"
    # was "<", so a chunk starting exactly on an item went through and split it. Here a's
    # second chunk starts on its image (32) and covers 32 of its 48 placeholders.
    failures, entry = _encoder_failures(
        pristine_tree,
        tmp_path,
        "                and num_computed_tokens <= start_pos\n",
        "                and num_computed_tokens < start_pos\n",
        "sched-encoder-whole-inputs.yaml",
        MM_INPUT_SPLIT,
    )
    assert failures, entry
    assert (failures[0]["request"], failures[0]["step"]) == ("a", 1), entry
    assert "the chunk 32..63 ends inside input 0" in failures[0]["message"], entry
    # The chunks a states, derived with the fixed rule, are not what the bug schedules.
    chunked = [
        f for f in entry["failures"] if (f.get("detail") or {}).get("invariant") == CHUNKS_DIFFER
    ]
    assert [f["request"] for f in chunked] == ["a"], entry
    assert "in chunks 32+32+32+24, but the scenario states 32+64+24" in chunked[0]["message"]


@pytest.mark.slow
def test_a_chunk_past_an_image_the_cache_cannot_take_fails_sanity(pristine_tree, tmp_path):
    # The cut before an encoder input that does not fit the cache is dropped: b's first chunk
    # runs into its image (placeholders 16..55) while a's image fills the encoder cache, so
    # the model runner would find no encoder output for them ("Encoder cache miss").
    failures, entry = _encoder_failures(
        pristine_tree,
        tmp_path,
        "                    num_new_tokens = min(\n"
        "                        num_new_tokens, start_pos - num_computed_tokens\n"
        "                    )\n",
        "                    pass\n",
        "sched-encoder-cache-full.yaml",
        ENCODER_OUTPUT_MISSING,
    )
    assert failures, entry
    assert (failures[0]["request"], failures[0]["step"]) == ("b", 0), entry
    assert "neither run in this step nor held" in failures[0]["message"], entry


@pytest.mark.slow
def test_an_encoder_manager_that_ignores_the_budget_fails_sanity(pristine_tree, tmp_path):
    # EncoderCacheManager.can_allocate no longer refuses an input past the step's budget: a's
    # first chunk is no longer cut and takes the step's 128 tokens (b waits), running the three
    # images they overlap, 32 + 48 + 40 = 120 embeddings on a budget of 64.
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/encoder_cache_manager.py",
        "        if num_embeds > encoder_compute_budget:\n",
        "        if False:\n",
    )
    out = tmp_path / "report"
    done = run_kvconform(
        "run", _single_mode_copy("sched-encoder-budget.yaml", tmp_path), "--vllm-src", tree,
        "--report-dir", out, "--progress", "off", "--no-expectations", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = json.loads((out / "report.json").read_text())["scenarios"]
    invariants = {(f.get("detail") or {}).get("invariant") for f in entry["failures"]}
    assert {ENCODER_BUDGET_EXCEEDED, CHUNKS_DIFFER} <= invariants, entry
    (over,) = [
        f
        for f in entry["failures"]
        if (f.get("detail") or {}).get("invariant") == ENCODER_BUDGET_EXCEEDED
    ]
    assert (
        over["step"] == 0
        and "a[0] 32, a[1] 48, a[2] 40: 120 embeddings, past the encoder budget of 64"
        in over["message"]
    )


PRIORITY_PREEMPTION = "sched-encoder-priority-preemption.yaml"
# Undoing the encoder-cache allocation of the inputs taken off the step with the preempted
# request: the fix the expectation of sched-encoder-priority-preemption* describes.
RESTORED_BUDGET = (
    "                                encoder_compute_budget += num_embeds_to_restore\n"
)
UNDONE_ALLOCATION = RESTORED_BUDGET + (
    "                                cache = self.encoder_cache_manager\n"
    "                                for i in preempted_encoder_inputs:\n"
    "                                    mm_hash = preempted_req.mm_features[i].identifier\n"
    "                                    cache.free_encoder_input(preempted_req, i)\n"
    "                                    if mm_hash in cache.freeable:\n"
    "                                        cache.num_free_slots += cache.freeable.pop(mm_hash)\n"
    "                                        del cache.cached[mm_hash]\n"
    "                                        del cache.num_embeds_by_hash[mm_hash]\n"
)


def test_a_preempted_requests_unrun_image_is_missing_when_it_resumes(tmp_path, vllm):
    # vLLM 0.33.0 as installed: a's second image is allocated, taken off step 2 with a, and
    # never scheduled again; a computes its placeholders at step 22.
    (scenario, *_) = load_file(_single_mode_copy(PRIORITY_PREEMPTION, tmp_path))
    result = runner.run_scenario(scenario, vllm)
    missing = [f for f in result.failures if f.detail.get("invariant") == ENCODER_OUTPUT_MISSING]
    assert [(f.request, f.step) for f in missing] == [("a", 22), ("a", 23)], result.headline()
    assert "overlap input 1 (a-1, placeholders 120..149)" in missing[0].message


@pytest.mark.slow
def test_undoing_the_preempted_inputs_allocation_passes(pristine_tree, tmp_path):
    tree = tree_with_replacement(
        pristine_tree,
        tmp_path / "vllm-tree",
        "v1/core/sched/scheduler.py",
        RESTORED_BUDGET,
        UNDONE_ALLOCATION,
    )
    done = run_kvconform(
        "run", _single_mode_copy(PRIORITY_PREEMPTION, tmp_path), "--vllm-src", tree,
        "--report-dir", tmp_path / "report", "--progress", "off", "--no-expectations",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == ExitStatus.CONFORM, done.stdout + done.stderr


SHARED_IMAGE = "sched-encoder-priority-preemption-shared-image.yaml"
WITHDRAWN_RUNS_FIX = REPO / "docs" / "reproducers" / "fixes" / "10-encoder-withdrawn-runs.patch"


def _exit_status(tree: Path, name: str, tmp_path: Path) -> int:
    tmp_path.mkdir(parents=True)
    done = run_kvconform(
        "run", _single_mode_copy(name, tmp_path), "--vllm-src", tree,
        "--report-dir", tmp_path / "report", "--progress", "off", "--no-expectations",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode in (ExitStatus.CONFORM, ExitStatus.NONCONFORMANCE), (
        done.stdout + done.stderr
    )
    return done.returncode


@pytest.mark.slow
def test_the_proposed_fix_covers_both_forms_where_undoing_freeable_entries_covers_one(
    pristine_tree, tmp_path
):
    # docs/findings.md #10: the fix proposed upstream (withdraw the unrun entry, or hand its run
    # to the request still using the image) against the first proposal (undo the allocation
    # only where the entry became freeable), on both scenarios.
    fixed = tree_with_patch(pristine_tree, tmp_path / "fixed", WITHDRAWN_RUNS_FIX)
    first = tree_with_replacement(
        pristine_tree,
        tmp_path / "first",
        "v1/core/sched/scheduler.py",
        RESTORED_BUDGET,
        UNDONE_ALLOCATION,
    )
    statuses = {
        (tree.name, name): _exit_status(tree, name, tmp_path / f"{tree.name}-{name}")
        for tree in (fixed, first)
        for name in (PRIORITY_PREEMPTION, SHARED_IMAGE)
    }
    assert statuses == {
        ("fixed", PRIORITY_PREEMPTION): ExitStatus.CONFORM,
        ("fixed", SHARED_IMAGE): ExitStatus.CONFORM,
        ("first", PRIORITY_PREEMPTION): ExitStatus.CONFORM,
        ("first", SHARED_IMAGE): ExitStatus.NONCONFORMANCE,  # b still references the entry
    }


# -- the step's encoder input stats (scheduler.log_iteration_details) --------------------


def test_log_iteration_details_needs_log_stats(write_scenario):
    path = write_scenario(
        "kind: scheduler\nmodel: {max_model_len: 512}\n"
        "scheduler: {mode: sync, log_iteration_details: true}\n"
        "requests:\n  a: {prompt_len: 40, mm_inputs: [{offset: 0, length: 8}]}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (3, "scheduler.log_iteration_details")
    assert "needs scheduler.log_stats: true" in error.message, str(error)


@pytest.mark.slow
def test_encoder_input_stats_that_keep_only_the_last_input_fail_sanity(pristine_tree, tmp_path):
    # _make_scheduled_encoder_input_stats assigning each input's embeddings instead of adding
    # them: step 1 runs a's image 1 (24) and b's image (32), 56 embeddings, and reports 32.
    failures, entry = _encoder_failures(
        pristine_tree,
        tmp_path,
        "                stats.output_tokens += mm_feature.mm_position.get_num_embeds()\n",
        "                stats.output_tokens = mm_feature.mm_position.get_num_embeds()\n",
        "sched-encoder-input-stats.yaml",
        ENCODER_STATS_DIFFER,
    )
    assert [f["step"] for f in failures] == [1], entry
    assert (
        "report 2 inputs, 32 embeddings, but it schedules 2 inputs, 56 embeddings (a-1, b-0)"
        in failures[0]["message"]
    ), failures


# -- an identifier reused with another length (expect_rejected) ---------------------------


def _reused(b_fields: str) -> str:
    return (
        "kind: scheduler\nmodel: {max_model_len: 512}\nscheduler: {mode: sync}\nrequests:\n"
        "  a: {prompt_len: 64, mm_inputs: [{offset: 0, length: 32, id: cat}]}\n"
        f"  b: {{prompt_len: 80, arrival: 2, {b_fields}}}\n"
    )


def test_an_identifier_reused_with_another_length_is_read_with_expect_rejected(scenario_from):
    scenario = scenario_from(
        _reused("mm_inputs: [{offset: 16, length: 40, id: cat}], expect_rejected: true")
    )
    b = scenario.requests["b"]
    assert b.expect_rejected and b.mm_inputs == (MmInput(16, 40, "cat"),)
    assert not scenario.requests["a"].expect_rejected


@pytest.mark.parametrize(
    ("b_fields", "field", "words"),
    [
        ("mm_inputs: [{offset: 16, length: 32, id: cat}], expect_rejected: true",
         "requests.b.expect_rejected", "needs an mm_inputs id that an earlier input has"),
        ("expect_rejected: true", "requests.b.expect_rejected",
         "needs an mm_inputs id that an earlier input has"),
        ("mm_inputs: [{offset: 16, length: 40, id: cat}], expect_rejected: true, stop_at: 2",
         "requests.b.expect_rejected", "cannot go with stop_at"),
        ("mm_inputs: [{offset: 16, length: 40, id: cat}], expect_rejected: 1",
         "requests.b.expect_rejected", "true or false"),
        ("mm_inputs: [{offset: 16, length: 40, id: cat}]", "requests.b.mm_inputs[0].length",
         "state expect_rejected: true"),
    ],
)  # fmt: skip
def test_bad_expect_rejected_names_the_field(write_scenario, b_fields, field, words):
    path = write_scenario(_reused(b_fields))
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (6, field), str(error)
    assert words in error.message, str(error)


@pytest.mark.slow
def test_a_reused_identifier_computed_with_the_cached_output_fails_sanity(pristine_tree, tmp_path):
    # Without the length check (as before 0.31.0), b takes a's cached output of 32 embeddings
    # for its 40 placeholders, runs and finishes at max_tokens instead of with an error.
    failures, entry = _encoder_failures(
        pristine_tree,
        tmp_path,
        "        if cached_num_encoder_embeds == requested_num_encoder_embeds:\n",
        "        if True:\n",
        "sched-encoder-id-reused.yaml",
        REJECTION_DIFFERS,
    )
    assert [f["request"] for f in failures] == ["b"], entry
    assert "not with an error (FINISHED_ERROR)" in failures[0]["message"], failures
