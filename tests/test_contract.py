"""The independent model of the KV-cache contract (kvconform/model/contract.py) and the
``ceiling`` check that holds the live side to it.

The pure tests build recordings by hand (no vLLM); the slow ones inject an
over-allocation into a copy of vLLM's tree and watch the check go red where no other
check does, and stay green on the pristine tree.
"""

from __future__ import annotations

import json

import pytest

from kvconform.errors import ExitStatus
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.checks.bookkeeping import STALE_ENTRY
from kvconform.harness.checks.ceiling import OVER_COLUMNS, OVER_REAL, REPLAY_LOOKAHEAD
from kvconform.harness.checks.conservation import NOT_CONSERVED, REFS_DIFFER, SHARED_WRITABLE
from kvconform.harness.runner import run_scenario
from kvconform.model.contract import allowance, reach, zeroing_groups
from kvconform.model.facts import Fact, PoolCensus, StepStats, StepZeroingList, ZeroingGroups
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import (
    NOT_ZEROED,
    FreeEvent,
    GroupInfo,
    Observation,
    Trajectory,
)
from kvconform.model.results import Verdict

NULL = 0


def group(group_type: str = "full_attention", *, span=None, **args) -> GroupInfo:
    return GroupInfo(
        0,
        group_type,
        16,
        group_type,
        GROUP_TYPES[group_type].holds_null,
        floor_args=dict(block_size=16, max_model_len=1024, **args),
        read_span=span,
    )


def run(info: GroupInfo, *observations: Observation, lookahead=0, **kw) -> Trajectory:
    trajectory = Trajectory(
        (info,), lookahead=lookahead, lookahead_source="test", max_model_len=1024, **kw
    )
    trajectory.observations.extend(observations)
    trajectory.num_blocks = 100
    return trajectory


def row(step, computed, scheduled, live, *, lookahead=0, ids=None, request="a") -> Observation:
    blocks = ids if ids is not None else list(range(1, live + 1))
    return Observation(
        step, 10 + step, request, "step", 0, computed, scheduled, lookahead, 0, live, None, None,
        None, blocks,
    )  # fmt: skip


def ceiling(trajectory: Trajectory) -> list:
    return list(CHECKS["ceiling"].find(trajectory))


def test_ceiling_is_a_default_check_reported_after_the_floor():
    assert "ceiling" in DEFAULT_CHECKS
    names = list(CHECKS)
    assert names.index("floor") < names.index("ceiling") < names.index("sanity")


def test_token_columns_are_exactly_the_largest_reach():
    # 30 computed + 4 scheduled + 4 lookahead = 38 positions: 3 columns of 16, no more.
    assert ceiling(run(group(), row(0, 30, 4, 3, lookahead=4))) == []
    (failure,) = ceiling(run(group(), row(0, 30, 4, 4, lookahead=4)))
    assert failure.check == "ceiling" and failure.party == "live"
    assert failure.detail["invariant"] == OVER_COLUMNS and failure.detail["allowed"] == 3
    assert "holds 4 blocks, more than the 3 it needs" in failure.message
    assert "exactly cdiv(38 largest reach, 16)" in failure.message


def test_the_lookahead_the_parties_were_told_counts_too():
    # The contract's lookahead is 0, vLLM reserved 4: the lookahead check owns that.
    assert ceiling(run(group(), row(0, 30, 2, 3), lookahead=4)) == []
    assert len(ceiling(run(group(), row(0, 30, 2, 3), lookahead=0))) == 1


def test_rejected_drafts_keep_their_columns_until_the_request_restarts():
    info = group()
    # Step 0 reaches 33 (3 columns); drafts rejected, step 1 reaches 20: still 3 is right.
    kept = run(info, row(0, 29, 4, 3), row(1, 19, 1, 3))
    assert ceiling(kept) == []
    # After a preemption the request starts again: 3 columns for a 20-token reach is one
    # too many.
    preempted = run(info, row(0, 29, 4, 3), row(1, 19, 1, 3))
    preempted.events.append(FreeEvent(1, 0, None, "a", "preempt", ([1, 2, 3],), 0, 3, ([],)))
    (failure,) = ceiling(preempted)
    assert failure.step == 1 and failure.detail["allowed"] == 2


def test_max_model_len_caps_the_reach():
    assert reach(1000, 20, 8, 1024) == 1024
    assert len(ceiling(run(group(), row(0, 1000, 20, 65, lookahead=8)))) == 1
    assert ceiling(run(group(), row(0, 1000, 20, 64, lookahead=8))) == []


def test_decode_context_parallel_columns_span_every_rank():
    info = group(dcp_world_size=2)
    assert allowance(info, 40, 0).columns == 2  # cdiv(40, 16 x 2)
    assert len(ceiling(run(info, row(0, 36, 4, 3)))) == 1


def test_cross_attention_holds_the_encoders_columns_only():
    info = group("cross_attention")
    fine = run(info, row(0, 0, 8, 4), row(1, 8, 500, 4), encoder_lens={"a": 50})
    assert ceiling(fine) == []
    over = run(info, row(0, 0, 8, 5), encoder_lens={"a": 50})
    (failure,) = ceiling(over)
    assert "cdiv(50 encoder tokens, 16)" in failure.message


def test_a_ring_is_one_block():
    assert ceiling(run(group("circular_buffer"), row(0, 0, 500, 1))) == []
    assert len(ceiling(run(group("circular_buffer"), row(0, 0, 500, 2)))) == 1


def test_mamba_state_is_one_block_plus_speculative_where_a_block_spans_the_model():
    whole = GroupInfo(
        0, "mamba", 1024, "mamba", True,
        floor_args=dict(block_size=1024, max_model_len=1024, num_speculative_blocks=2),
    )  # fmt: skip
    assert allowance(whole, 900, 0).exact and allowance(whole, 900, 0).columns == 3
    assert len(ceiling(run(whole, row(0, 0, 900, 4)))) == 1
    # A smaller block: the allocator sizes the table by tokens, an upper bound only.
    small = group("mamba", num_speculative_blocks=1)
    assert not allowance(small, 40, 0).exact and allowance(small, 40, 0).columns == 4


def test_a_window_holds_real_blocks_only_where_it_reads():
    info = group("sliding_window", span=("window", 32))
    # Decoding at 100 (window 32): positions 69..100 span at most 3 blocks; the older
    # columns must be null.
    ids = [NULL] * 4 + [5, 6, 7]
    assert ceiling(run(info, row(0, 100, 1, 7, ids=ids))) == []
    (failure,) = ceiling(run(info, row(0, 100, 1, 7, ids=[NULL] * 3 + [4, 5, 6, 7])))
    assert failure.detail["invariant"] == OVER_REAL and failure.detail["allowed"] == 3
    assert "holds 4 real blocks, more than the 3" in failure.message
    # Under async scheduling the previous step's token is in flight: one block more may
    # still be real.
    stepped = run(
        info, row(0, 99, 1, 7, ids=[NULL] * 4 + [5, 6, 7]),
        row(1, 100, 1, 7, ids=[NULL] * 3 + [4, 5, 6, 7]), steps_in_flight=1,
    )  # fmt: skip
    assert ceiling(stepped) == []


def test_a_chunk_holds_real_blocks_of_its_own_chunk():
    info = group("chunked_local", span=("chunk", 32))
    # At 100 with chunks of 32 the step reads 96..100: one block, plus the one it writes
    # into past a boundary at most.
    assert allowance(info, 101, 0, scheduled=1).real == 3
    assert len(ceiling(run(info, row(0, 100, 1, 7, ids=[NULL] * 3 + [4, 5, 6, 7])))) == 1


def test_mamba_align_holds_at_most_two_states_checkpoint_and_speculative():
    info = group("mamba", mamba_cache_mode="align", num_speculative_blocks=1,
                 num_prefill_checkpoint_blocks=1)  # fmt: skip
    assert allowance(info, 200, 0).real == 4
    over = run(info, row(0, 160, 40, 14, ids=[NULL] * 9 + [1, 2, 3, 4, 5]))
    (failure,) = ceiling(over)
    assert failure.detail["invariant"] == OVER_REAL


def test_mamba_align_keeps_the_states_of_the_steps_in_flight():
    # scenarios/scheduler/sched-mamba-align-state-in-flight.yaml, overlapped: prefill chunks
    # of 16 each end in a new column; vLLM frees the state a step read only once the step
    # after it is processed (remove_skipped_blocks on processed_computed_tokens), so with
    # the previous chunk in flight three states are real, one more than a synchronous step.
    info = group("mamba", mamba_cache_mode="align")
    steps = (row(0, 0, 16, 1, ids=[1]), row(1, 16, 16, 2, ids=[1, 2]),
             row(2, 32, 15, 3, ids=[1, 2, 3]))  # fmt: skip
    assert ceiling(run(info, *steps, steps_in_flight=1)) == []
    (failure,) = ceiling(run(info, *steps))
    assert failure.detail["invariant"] == OVER_REAL and failure.detail["allowed"] == 2
    # The steps in flight add the states in the columns their positions may span, no more:
    # one token one column, 16 tokens two (unaligned), 17 tokens two, 18 three.
    assert allowance(info, 47, 0, scheduled=15).real == 2
    assert [allowance(info, 47, 0, scheduled=15, in_flight=n).real for n in (1, 16, 17, 18)] == [
        3, 4, 4, 5,
    ]  # fmt: skip


def test_a_bounded_replay_may_hold_the_whole_hit():
    # b's hit is 112 tokens; the scheduler counts 48 computed and replays the window (64).
    info = group("sliding_window", span=("window", 64))
    trajectory = run(info, row(8, 48, 32, 7, ids=[NULL] * 3 + [4, 5, 6, 7], request="b"))
    # Without the replay recorded, 7 columns for a reach of 80 are 2 too many.
    assert len(ceiling(trajectory)) == 1
    trajectory.read_bounds[0] = 48
    assert ceiling(trajectory) == []
    trajectory.observations[0] = row(8, 48, 32, 8, ids=[NULL] * 3 + [4, 5, 6, 7, 8], request="b")
    assert len(ceiling(trajectory)) == 1


def test_the_lookahead_past_a_replayed_hit_is_a_cause_of_its_own():
    # b adopts a 32-token hit; the bounded replay (window 8) leaves 24 computed and the
    # chunk (4) ends inside the replayed range: the step writes through 24 + 4 + 1 = 29,
    # two columns. vLLM counts the lookahead from the hit's end (32 + 1: three columns),
    # docs/findings.md #33; the failure names that cause, and its signature carries it.
    info = group("sliding_window", span=("window", 8))
    trajectory = run(info, row(12, 24, 4, 3, lookahead=1, request="b"), lookahead=1)
    trajectory.read_bounds[0] = 24
    (failure,) = ceiling(trajectory)
    assert failure.detail == {"invariant": OVER_COLUMNS, "allowed": 2, "cause": REPLAY_LOOKAHEAD}
    assert "counted from the hit's end" in failure.message
    assert CHECKS["ceiling"].signature(None, failure) == (  # type: ignore[arg-type]
        f"{OVER_COLUMNS}: {REPLAY_LOOKAHEAD}",
        failure.spec_type or "-",
    )
    # A column more than the hit and its lookahead give is another over-allocation.
    trajectory.observations[0] = row(12, 24, 4, 4, lookahead=1, request="b")
    (failure,) = ceiling(trajectory)
    assert "cause" not in failure.detail
    # So is one at a step that adopted no replayed hit.
    trajectory.read_bounds.clear()
    trajectory.observations[0] = row(12, 24, 4, 3, lookahead=1, request="b")
    (failure,) = ceiling(trajectory)
    assert failure.detail == {"invariant": OVER_COLUMNS, "allowed": 2}
    assert CHECKS["ceiling"].signature(None, failure)[0] == OVER_COLUMNS  # type: ignore[arg-type]


def test_unmodelled_types_and_other_parties_are_not_judged():
    unmodelled = [name for name, entry in GROUP_TYPES.items() if entry.no_ceiling]
    assert len(unmodelled) == 4
    for name in unmodelled:
        assert allowance(group(name), 10, 0) is None
    # The predictor and the warmup size a dummy batch: only the live side is held.
    predicted_only = Observation(0, 1, "a", "s", 0, 0, 10, 0, 1, None, 9, 9, 9, None)
    assert ceiling(run(group(), predicted_only)) == []


def test_every_modelled_type_states_its_reason():
    for name, group_type in GROUP_TYPES.items():
        args = {"mamba_cache_mode": "align"} if group_type.floor_by else {}
        found = allowance(group(name, span=("window", 8) if group_type.reads else None, **args),
                          40, 40, scheduled=8)  # fmt: skip
        if group_type.no_ceiling or group_type.own_pool:
            assert found is None
            continue
        assert found is not None and found.reason and found.formula, name
        assert found.real is None or found.real_reason, name


# The injected over-allocation: vLLM's base allocate_new_blocks takes one block more
# than the tokens need on every growth; and SlidingWindowManager keeps one block of
# the window's past real (its skipped tokens one block short).
OVER_ALLOCATE = (
    "v1/core/single_type_kv_cache_manager.py",
    "        num_new_blocks = num_required_blocks - len(req_blocks)\n"
    "        if num_new_blocks <= 0:\n"
    "            return cow_blocks\n",
    "        num_new_blocks = num_required_blocks + 1 - len(req_blocks)\n"
    "        if num_new_blocks <= 0:\n"
    "            return cow_blocks\n",
)
WINDOW_KEPT = (
    "v1/core/single_type_kv_cache_manager.py",
    "            num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens,",
    "            num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens"
    " - self.block_size,",
)


def _run(tree, tmp_path, scenario: str, *extra: str):
    from vllm_copy import REPO, run_kvconform

    out = tmp_path / "report"
    tmp_path.mkdir(parents=True, exist_ok=True)
    done = run_kvconform(
        "run", REPO / scenario, "--vllm-src", tree, "--report-dir", out,
        "--progress", "off", "--no-expectations", *extra, cwd=tmp_path,
    )  # fmt: skip
    return done, json.loads((out / "report.json").read_text())["scenarios"]


@pytest.mark.slow
def test_ceiling_catches_an_allocator_that_takes_a_block_too_many(pristine_tree, tmp_path):
    from vllm_copy import tree_with_replacement

    scenario = "scenarios/scheduler/sched-no-speculation.yaml"
    done, entries = _run(pristine_tree, tmp_path / "pristine", scenario)
    assert done.returncode == ExitStatus.CONFORM, done.stdout + done.stderr
    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *OVER_ALLOCATE)
    done, entries = _run(tree, tmp_path, scenario)
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    for entry in entries:
        over = [f for f in entry["failures"] if f["check"] == "ceiling"]
        assert over, entry["id"]
        assert over[0]["step"] == 0 and over[0]["detail"]["invariant"] == OVER_COLUMNS
        assert "holds 4 blocks, more than the 3 it needs" in over[0]["message"]


@pytest.mark.slow
def test_ceiling_alone_catches_a_window_that_keeps_a_block(pristine_tree, tmp_path):
    from vllm_copy import tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *WINDOW_KEPT)
    scenario = "scenarios/scheduler/sched-no-speculation.yaml"
    done, entries = _run(tree, tmp_path, scenario, "-k", "sync")
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = [e for e in entries if e["id"].endswith("[sync]")]
    # No other check sees it: the column count is right, only a block stays real.
    assert {f["check"] for f in entry["failures"]} == {"ceiling"}, entry
    assert all(f["detail"]["invariant"] == OVER_REAL for f in entry["failures"])
    assert "holds 4 real blocks, more than the 3" in entry["failures"][0]["message"]


def _groups(*types: str) -> tuple[GroupInfo, ...]:
    return tuple(
        GroupInfo(i, t, 16, t, GROUP_TYPES[t].holds_null, floor_args=dict(block_size=16))
        for i, t in enumerate(types)
    )


def test_zeroing_groups_are_derived_from_the_specs():
    # Attention alone: nothing reads stale bytes of another layout.
    assert zeroing_groups(_groups("full_attention", "sliding_window")) == ()
    # A Mamba state shares the pool: every attention group zeroes, the state and a ring not.
    assert zeroing_groups(_groups("full_attention", "mamba", "circular_buffer", "mla")) == (0, 3)


def _zeroing(groups, zeroed, release_zeroes=True) -> list:
    trajectory = Trajectory(groups, lookahead=0, lookahead_source="test")
    trajectory.facts.append(
        Fact(0, None, "-", "manager built", ZeroingGroups(zeroed, release_zeroes))
    )
    return [f for f in CHECKS["sanity"].find(trajectory)]


def test_a_group_that_must_zero_and_does_not_fails_once():
    groups = _groups("full_attention", "mamba", "sliding_window")
    assert _zeroing(groups, (0, 2)) == []
    (failure,) = _zeroing(groups, (0,))
    assert failure.detail["invariant"] == NOT_ZEROED
    assert "group 2 (sliding_window): its new blocks are never handed to the worker" in (
        failure.message
    )
    assert "(vLLM zeroes groups [0])" in failure.message
    # vLLM zeroing nothing at all, where a Mamba state shares the pool: both groups fail.
    assert len(_zeroing(groups, ())) == 2
    # A release without the mechanism (before #35219) is not judged.
    assert _zeroing(groups, (), release_zeroes=False) == []
    # Zeroing more than the specs need costs time, not correctness: no failure.
    assert _zeroing(_groups("full_attention"), (0,)) == []


# vLLM stops recording its full-attention groups' new blocks for zeroing: in a model
# with Mamba layers, the attention kernel then reads what a freed state block held.
NO_ATTENTION_ZEROING = (
    "v1/core/single_type_kv_cache_manager.py",
    "            and not isinstance(kv_cache_spec, CircularBufferSpec)",
    "            and not isinstance(kv_cache_spec, (CircularBufferSpec, FullAttentionSpec))",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario",
    [
        "scenarios/hybrid/hybrid-jamba-mamba-none-attention.yaml",
        "scenarios/scheduler/sched-sync-load-hybrid-zeroing.yaml",
    ],
)
def test_zeroing_groups_derived_catch_a_group_vllm_stops_zeroing(pristine_tree, tmp_path, scenario):
    from vllm_copy import tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *NO_ATTENTION_ZEROING)
    done, entries = _run(tree, tmp_path, scenario, "-k", "not async and not overlapped")
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    for entry in entries:
        # The lists vLLM hands over are right for the groups it records: only the
        # derivation from the specs sees the group it left out.
        (failure,) = entry["failures"]
        assert failure["detail"]["invariant"] == NOT_ZEROED, entry
        assert "group 0 (full_attention): its new blocks are never handed" in failure["message"]


def _census(free, tables, refs=None, deferred=(), hashed=frozenset(), pool=10) -> list:
    held = [b for table in tables.values() for ids in table for b in ids if b != NULL]
    counted = dict.fromkeys(set(held) | set(deferred), 0)
    for block in held + list(deferred):
        counted[block] += 1
    census = PoolCensus(free, pool, tables, tuple(deferred), refs or counted, hashed)
    trajectory = Trajectory((), lookahead=0, lookahead_source="test")
    trajectory.facts.append(Fact(3, 7, "-", "end of step", census))
    return [f for f in CHECKS["sanity"].find(trajectory)]


def test_conservation_free_and_held_make_the_pool():
    tables = {"a": ((1, 2, 3),), "b": ((4, NULL, 5),)}
    assert _census(4, tables) == []  # 4 free + 5 held + the null block = 10
    # Deferred blocks (popped at an in-flight finish) are still taken.
    assert _census(3, tables, deferred=(6,)) == []
    (leak,) = _census(3, tables)
    assert leak.detail["invariant"] == NOT_CONSERVED and leak.step == 3
    assert (
        "3 are free and 5 held" in leak.message
        and "1 block(s) neither free nor held" in leak.message
    )
    (twice,) = _census(6, tables)
    assert "2 more than the pool has" in twice.message


def test_conservation_reference_counts_are_the_live_holders():
    tables = {"a": ((1, 2),), "b": ((1, 3),)}
    hashed = frozenset({1})
    assert _census(6, tables, hashed=hashed) == []
    (failure,) = _census(6, tables, refs={1: 1, 2: 1, 3: 1}, hashed=hashed)
    assert failure.detail["invariant"] == REFS_DIFFER
    assert "block 1: ref_cnt 1, 2 holder(s)" in failure.message


def test_conservation_only_cached_blocks_are_shared():
    tables = {"a": ((1, 2),), "b": ((1, 2),)}
    assert _census(7, tables, hashed=frozenset({1, 2})) == []
    (failure,) = _census(7, tables, hashed=frozenset({1}))
    assert failure.detail["invariant"] == SHARED_WRITABLE
    assert "block 2: a, b" in failure.message


# vLLM's BlockPool.free_blocks returns a block to the free queue while another request
# A Mamba "align" group in blocks of 16 beside full attention in blocks of 8: the hash block
# is 8, so b's first chunk (8 tokens, the budget) ends inside a Mamba block and vLLM keeps
# its state in a copy-on-write block. With a kv_consumer connector (a's remote prefill) and
# the AsyncScheduler, vLLM defers the return of both ends of the copy until the step that
# runs it is processed (Scheduler._free_cow_retained_blocks).
COW_DEFERRED = """
name: cow-deferred
kind: scheduler
model:
  block_size: 8
  max_model_len: 79
  enable_caching: true
  num_blocks: 34
  groups:
    - {type: mamba, block_size: 16}
    - full_attention
scheduler: {mode: async, max_num_seqs: 4, max_num_batched_tokens: 9}
requests:
  a: {prompt_len: 72, max_tokens: 24, arrival: 7, remote_prefill: true}
  b: {prompt_len: 16, max_tokens: 19}
"""


# Two Mamba groups: a step's copies, one per group, go back to the pool as one deferred entry.
COW_DEFERRED_TWO = COW_DEFERRED.replace(
    "    - full_attention\n", "    - full_attention\n    - {type: mamba, block_size: 16}\n"
).replace("b: {prompt_len: 16, max_tokens: 19}", "b: {prompt_len: 60, max_tokens: 19, arrival: 4}")


@pytest.mark.parametrize("text", [COW_DEFERRED, COW_DEFERRED_TWO], ids=["one-copy", "two-groups"])
def test_conservation_holds_a_block_copy_until_its_step_is_processed(scenario_from, vllm, text):
    """The pool census counts both ends of a copy-on-write copy as held back while vLLM
    defers their return (a census without them found a block "neither free nor held" and
    a reference count above the live holders; one entry per copy instead of per step, a
    block "both free and held" once vLLM returned a step's copies together); once the step
    is processed they are free."""
    assert text.count("type: mamba") == (1 if text is COW_DEFERRED else 2)
    result = run_scenario(scenario_from(text), vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    censuses = [f.what for f in result.trajectory.facts if isinstance(f.what, PoolCensus)]
    held_back = [c for c in censuses if c.deferred]
    assert held_back, "no census held a copy's blocks back"
    first = held_back[0]
    sources, copies = first.deferred[0::2], first.deferred[1::2]
    tabled = {b for table in first.tables.values() for ids in table for b in ids}
    assert set(sources) <= tabled and not set(copies) & tabled  # sources stay in b's tables
    assert all(first.refs[source] == 2 for source in sources)  # b's table and the retention
    assert not censuses[-1].deferred


# still holds it (a shared prefix block of two requests, freed by one).
FREES_SHARED = (
    "v1/core/block_pool.py",
    "            block.ref_cnt -= 1\n            if block.ref_cnt == 0:",
    "            block.ref_cnt -= 1\n            if block.ref_cnt <= 1:",
)


@pytest.mark.slow
def test_conservation_catches_a_shared_block_freed_at_its_step(pristine_tree, tmp_path):
    from vllm_copy import tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *FREES_SHARED)
    scenario = "scenarios/admission/prefix-hit-shares-blocks-full-pool.yaml"
    done, (entry,) = _run(tree, tmp_path, scenario)
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (census,) = [f for f in entry["failures"] if f["detail"]["invariant"] == NOT_CONSERVED]
    # Named at the step the pool went wrong, not only after the run as the leak is.
    assert census["step"] == 2 and "more than the pool has" in census["message"], entry


def _bookkeeping(*censuses: tuple[frozenset, dict]) -> list:
    trajectory = Trajectory((), lookahead=0, lookahead_source="test")
    for step, (live, held) in enumerate(censuses):
        census = PoolCensus(9, 10, {}, (), {}, frozenset(), live, held)
        trajectory.facts.append(Fact(step, None, "-", "end of step", census))
    return [f for f in CHECKS["sanity"].find(trajectory)]


def test_bookkeeping_holds_live_requests_only_and_says_so_once():
    ids = "group 0 FullAttentionManager.num_cached_block"
    assert _bookkeeping((frozenset({"a", "b"}), {ids: frozenset({"a", "b"})})) == []
    stale = (frozenset({"b"}), {ids: frozenset({"a", "b"})})
    (failure,) = _bookkeeping(stale, stale)  # the same entry, twice: reported once
    assert failure.detail["invariant"] == STALE_ENTRY and failure.step == 0
    assert f"{ids} still holds ended request(s) a" in failure.message


def test_bookkeeping_judges_the_schedulers_own_maps():
    ids = "Scheduler._pending_encoder_input_ids"
    both = frozenset({"a", "b"})
    assert _bookkeeping((both, {ids: both})) == []
    (failure,) = _bookkeeping((both, {}), (frozenset({"b"}), {ids: both}))
    assert failure.detail["invariant"] == STALE_ENTRY and failure.step == 1
    assert f"{ids} still holds ended request(s) a" in failure.message


def test_the_scheduler_scan_finds_request_state_by_its_contents():
    # Plain objects in the shape of vLLM's (no vLLM needed): what the scan reads of a
    # scheduler, its parts and a connector's scheduler side, whatever the names.
    from collections import deque
    from types import SimpleNamespace

    from kvconform.oracles.vllm.scheduling import Scheduling

    class Request:  # hashable by identity, as vLLM's Request
        def __init__(self, request_id: str) -> None:
            self.request_id = request_id

    a, b = Request("a"), Request("b")
    encoder = SimpleNamespace(cached={"hash": {"a"}}, num_free_slots=3, freed=["hash"])
    connector = SimpleNamespace(
        connector_scheduler=SimpleNamespace(_reqs_need_send={"b": 1.0}, _other={"x": 1})
    )
    scheduler = SimpleNamespace(
        requests={"a": a, "b": b},
        running=[a],
        waiting=deque([b]),
        _inflight_prefills={a},
        finished_req_ids=set(),
        _kv_fetch_counts={"queued": 0},
        kv_cache_manager=SimpleNamespace(req_to_blocks={"a": []}),
        encoder_cache_manager=encoder,
        connector=connector,
    )
    found = Scheduling.scheduler_request_state(None, scheduler, {"a", "b"})
    assert found == {
        "Scheduler.requests": {"a", "b"},
        "Scheduler.running": {"a"},
        "Scheduler.waiting": {"b"},
        "Scheduler._inflight_prefills": {"a"},
        "SimpleNamespace.cached": {"a"},
        "SimpleNamespace._reqs_need_send": {"b"},
    }


def test_finished_ids_may_stay_one_step_and_no_longer():
    finished = "Scheduler.finished_req_ids"
    both, b = frozenset({"a", "b"}), frozenset({"b"})
    # a ended since the previous census: vLLM hands it on at the next schedule().
    assert _bookkeeping((both, {}), (b, {finished: frozenset({"a"})})) == []
    # Still there a census later: a list that only grows.
    (failure,) = _bookkeeping(
        (both, {}), (b, {finished: frozenset({"a"})}), (b, {finished: frozenset({"a"})})
    )
    assert failure.step == 2 and f"{finished} still holds ended request(s) a" in failure.message
    # Any other structure gets no such step.
    (failure,) = _bookkeeping((both, {}), (b, {"Scheduler.requests": frozenset({"a"})}))
    assert failure.step == 1


def _stats_reset(resets, reset) -> list[str]:
    """The sanity failures of one output's stats: no admission, ``resets`` since the last
    output, and ``reset`` the flags the output reports (per kind)."""
    zeros = dict.fromkeys(
        ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
         "preempted_hits"), 0,
    )  # fmt: skip
    stats = StepStats(
        True, 0.0, 0, 9, True, (), (), {kind: zeros for kind in reset}, (), None,
        tuple(resets), reset,
    )  # fmt: skip
    trajectory = Trajectory((), lookahead=0, lookahead_source="test")
    trajectory.facts.append(Fact(0, None, "-", "output", stats))
    return [f.message for f in CHECKS["sanity"].find(trajectory)]


def test_stats_say_reset_after_a_reset_that_succeeded_and_only_then():
    local, both = "prefix_cache_stats", "connector_prefix_cache_stats"
    assert _stats_reset([], {local: False}) == []
    assert _stats_reset([(True, False)], {local: True, both: False}) == []
    assert _stats_reset([(True, True)], {local: True, both: True}) == []
    (missed,) = _stats_reset([(True, False)], {local: False})
    assert "prefix_cache_stats.reset is False, but a reset_prefix_cache" in missed
    (stale,) = _stats_reset([(False, False)], {local: True})
    assert "prefix_cache_stats.reset is True, but no reset_prefix_cache" in stale
    # A call without reset_connector leaves the connector's cache (and its flag) alone.
    (connector,) = _stats_reset([(True, False)], {local: True, both: True})
    assert "output: connector_prefix_cache_stats.reset is True, but no" in connector
    # A refused call that reset the connector's too: which of the two refused is unknown.
    assert _stats_reset([(False, True)], {local: True, both: False}) == []


# vLLM's pop_blocks_for_free forgets one of the request's entries (num_cached_block):
# nothing else notices, since request ids are not reused.
KEEPS_CACHED_COUNT = (
    "v1/core/single_type_kv_cache_manager.py",
    "        self.num_cached_block.pop(request_id, None)\n"
    "        self._partial_hit_reqs.pop(request_id, None)\n",
    "        self._partial_hit_reqs.pop(request_id, None)\n",
)


@pytest.mark.slow
def test_bookkeeping_alone_catches_an_entry_never_dropped(pristine_tree, tmp_path):
    from vllm_copy import tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *KEEPS_CACHED_COUNT)
    scenario = "scenarios/scheduler/sched-no-speculation.yaml"
    done, entries = _run(tree, tmp_path, scenario, "-k", "sync")
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = [e for e in entries if e["id"].endswith("[sync]")]
    assert {f["detail"]["invariant"] for f in entry["failures"]} == {STALE_ENTRY}, entry
    first = entry["failures"][0]["message"]
    assert "FullAttentionManager.num_cached_block still holds ended request(s) c" in first


# vLLM's Scheduler._free_request forgets a finished request's pending encoder inputs
# (``_pending_encoder_input_ids``): the worker is told nothing wrong, and the dict grows
# by one entry per multimodal request served.
KEEPS_PENDING_ENCODER_INPUTS = (
    "v1/core/sched/scheduler.py",
    "        self._pending_encoder_input_ids.pop(request.request_id, None)\n"
    "        request_id = request.request_id\n",
    "        request_id = request.request_id\n",
)


@pytest.mark.slow
def test_bookkeeping_alone_catches_a_scheduler_map_never_dropped(pristine_tree, tmp_path):
    from vllm_copy import tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *KEEPS_PENDING_ENCODER_INPUTS)
    scenario = "scenarios/scheduler/sched-encoder-budget.yaml"
    done, entries = _run(tree, tmp_path, scenario)
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    for entry in entries:
        assert {f["detail"]["invariant"] for f in entry["failures"]} == {STALE_ENTRY}, entry
        assert (
            "Scheduler._pending_encoder_input_ids still holds ended request(s)"
            in (entry["failures"][0]["message"])
        )


# Full attention (32), Mamba "align" (128) and MLA (64): the hash block is 32, so b's hit on
# a's 64-token prompt is 32 tokens, inside MLA's first block. vLLM gives b a private copy of
# that block (a copy-on-write destination, new, on the zeroing list) and the worker copies
# a's block into it after zeroing the list, before the forward pass.
COW_ZEROED = """
name: cow-zeroed
kind: scheduler
model:
  block_size: 32
  max_model_len: 672
  enable_caching: true
  num_blocks: 265
  groups:
    - full_attention
    - {type: mamba, block_size: 128}
    - {type: mla, block_size: 64}
scheduler: {mode: sync, max_num_seqs: 3, max_num_batched_tokens: 76}
requests:
  a: {prompt_len: 64, max_tokens: 6}
  b: {prompt_len: 343, max_tokens: 13, arrival: 17, prefix_from: a, prefix_len: 64}
"""


def test_zeroing_a_copy_destination_is_not_zeroing_valid_kv(scenario_from, vllm):
    """A partial hit's copy-on-write block is zeroed, then filled by the copy: the zeroing
    family does not hold it as a block of valid KV wiped (it did, a false alarm, before the
    recording named the step's copies)."""
    result = run_scenario(scenario_from(COW_ZEROED), vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    lists = [f.what for f in result.trajectory.facts if isinstance(f.what, StepZeroingList)]
    copied = [z for z in lists if z.copied]
    assert copied, "no step copied a block"
    assert any(z.copied & z.listed for z in copied)  # zeroed and copied in one step


# Two Mamba groups in blocks of 32 beside MLA in 8, overlapped, a remote prefill (so vLLM
# defers frees), log_stats: a step's copies are still held back when its stats are made.
COW_USAGE = """
name: cow-usage
kind: scheduler
model:
  block_size: 8
  max_model_len: 23
  enable_caching: true
  num_blocks: 25
  groups:
    - {type: mamba, block_size: 32}
    - {type: mamba, block_size: 32}
    - mla
speculative: {method: suffix, num_speculative_tokens: 4}
scheduler: {mode: overlapped, max_num_seqs: 4, max_num_batched_tokens: 6, log_stats: true}
requests:
  a: {prompt_len: 21, max_tokens: 18, mm_inputs: [{offset: 1, length: 7, id: a-0}], stop_at: 2}
  b: {prompt_len: 14, max_tokens: 19, remote_prefill: 1}
  c: {prompt_len: 8, max_tokens: 3, stop_at: 2}
"""


def test_kv_cache_usage_counts_the_block_copies_held_back(scenario_from, vllm):
    """vLLM's kv_cache_usage counts the blocks it holds back for a step's copies (they are
    not free); the stats rule counts them too (it reported 13 of 24 blocks where vLLM's 15
    were in use, before)."""
    result = run_scenario(scenario_from(COW_USAGE), vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    censuses = [f.what for f in result.trajectory.facts if isinstance(f.what, PoolCensus)]
    assert any(c.deferred for c in censuses), "no step held a copy back"
