"""The checks on recorded trajectories: each one fires on the violation it names, and only then.

These tests build trajectories by hand (no vLLM), so each assertion is about the
check's logic alone; tests/test_runner.py drives the real KVCacheManager.
"""

from __future__ import annotations

from kvconform.harness.checks import CHECKS
from kvconform.model.observations import FreeEvent, GroupInfo, Observation, Trajectory
from kvconform.model.results import ScenarioResult, Verdict


def trajectory(*observations: Observation, group_type: str = "full_attention", **kw) -> Trajectory:
    group = GroupInfo(
        0,
        group_type,
        16,
        group_type,
        group_type in ("sliding_window", "mamba"),
        floor_args=dict(block_size=16, max_model_len=1024),
    )
    run = Trajectory((group,), lookahead=4, lookahead_source="test", max_model_len=1024, **kw)
    run.observations.extend(observations)
    run.num_blocks = 100
    return run


def obs(
    step=0,
    *,
    computed=9,
    scheduled=4,
    lookahead=4,
    floor=2,
    live=2,
    predicted=2,
    pmax=None,
    warmup=None,
    ids=None,
    request="a",
) -> Observation:
    return Observation(
        step,
        10 + step,
        request,
        "spec 3",
        0,
        computed,
        scheduled,
        lookahead,
        floor,
        live,
        predicted,
        predicted if pmax is None else pmax,
        warmup,
        ids if ids is not None else list(range(1, (live or 0) + 1)),
    )


def test_floor_passes_at_the_floor_and_fails_one_below():
    assert list(CHECKS["floor"].find(trajectory(obs(live=2)))) == []
    (failure,) = CHECKS["floor"].find(trajectory(obs(live=1, predicted=2)))
    assert failure.check == "floor" and failure.live == 1 and failure.floor == 2
    # The message says who, how many, what the floor is made of, and which positions are lost.
    assert "the live KVCacheManager holds 1 block, below the floor of 2" in failure.message
    assert "cdiv(min(9 computed + 4 scheduled + 4 lookahead, 1024), 16)" in failure.message
    assert "the drafter's positions 16..16 have no block" in failure.message
    assert failure.spec_type == "FullAttentionSpec"


def test_floor_judges_every_party_present():
    failures = list(CHECKS["floor"].find(trajectory(obs(live=2, predicted=1, warmup=1))))
    assert sorted(f.message.split(" holds")[0].split(": ")[-1] for f in failures) == [
        "the recorded warmup",
        "the warmup predictor _reserved_block_count",
    ]


def test_agree_uses_the_running_maximum_after_rollback():
    # After rejected drafts the prediction shrinks but vLLM keeps the blocks: no alarm.
    assert list(CHECKS["agree"].find(trajectory(obs(live=3, predicted=2, pmax=3)))) == []
    (failure,) = CHECKS["agree"].find(trajectory(obs(live=3, predicted=2, pmax=2)))
    assert (
        "holds 3 blocks but the warmup predictor _reserved_block_count predicts 2"
        in failure.message
    )


def test_agree_without_predictor_compares_warmup_and_live():
    no_predictor = obs(live=2, predicted=None, pmax=None, warmup=1)
    no_predictor = no_predictor._replace(predicted_max=None)
    (failure,) = CHECKS["agree"].find(trajectory(no_predictor))
    assert (
        "the recorded warmup holds 1 block but the live KVCacheManager holds 2" in failure.message
    )


def test_lookahead_flags_a_mismatch_and_an_unknown_method():
    assert (
        list(
            CHECKS["lookahead"].find(
                trajectory(
                    method="dflash",
                    num_speculative_tokens=3,
                    vllm_lookahead=4,
                    expected_lookahead=4,
                )
            )
        )
        == []
    )
    (mismatch,) = CHECKS["lookahead"].find(
        trajectory(
            method="dflash", num_speculative_tokens=3, vllm_lookahead=3, expected_lookahead=4
        )
    )
    assert "is 3 for method 'dflash' with k=3, but the drafter needs k + 1 = 4" in mismatch.message
    (unknown,) = CHECKS["lookahead"].find(
        trajectory(
            method="brand_new", num_speculative_tokens=3, vllm_lookahead=0, expected_lookahead=None
        )
    )
    assert "has no entry in kvconform's method registry" in unknown.message
    assert "kvconform/model/methods.py" in unknown.message


def test_sanity_catches_a_block_in_two_tables():
    run = trajectory(obs(0, ids=[1, 2], request="a"), obs(0, ids=[2, 3], request="b"))
    (failure,) = CHECKS["sanity"].find(run)
    assert "block 2 is also in the table of live request a" in failure.message


def test_sanity_judges_a_steps_sharing_once_its_rows_are_applied():
    # One schedule(): b runs, so vLLM allocates for it first and its window frees block 2;
    # d, admitted after it, takes block 2. The scheduler oracle records d's row first
    # (kvconform explore --seed 1 on 0.34.0 reported the block as shared).
    handed = trajectory(
        obs(1, ids=[1, 2], request="b"),
        obs(2, ids=[2], request="d"),
        obs(2, ids=[0, 3], request="b"),
        group_type="sliding_window",
    )
    assert list(CHECKS["sanity"].find(handed)) == []
    kept = trajectory(
        obs(1, ids=[1, 2], request="b"),
        obs(2, ids=[2], request="d"),
        obs(2, ids=[1, 2, 3], request="b"),
        group_type="sliding_window",
    )
    (shared,) = CHECKS["sanity"].find(kept)
    assert shared.request == "d" and "block 2 is also in the table of live request b" in (
        shared.message
    )


def test_sanity_allows_reuse_after_a_free_and_sharing_with_prefix_caching():
    first, second = obs(0, ids=[1, 2], request="a"), obs(1, ids=[1, 2], request="b")
    run = trajectory(first, second)
    run.events.append(FreeEvent(1, 0, 10, "a", "finish", ([1, 2],), 10, 12, ([],)))
    assert list(CHECKS["sanity"].find(run)) == []
    shared = trajectory(first, second, exclusive_blocks=False)
    assert list(CHECKS["sanity"].find(shared)) == []


def test_sanity_checks_what_a_free_gives_back():
    run = trajectory(obs(0, ids=[1, 2]))
    run.events.append(FreeEvent(1, 0, 10, "a", "finish", ([1, 2],), 10, 11, ([2],)))
    messages = [f.message for f in CHECKS["sanity"].find(run)]
    assert any("still holds blocks in groups [0] after finish" in m for m in messages)
    assert any("held 2 distinct blocks but 1 went back to the pool" in m for m in messages)


def test_sanity_null_block_only_where_the_type_allows_it():
    (failure,) = CHECKS["sanity"].find(trajectory(obs(ids=[0, 5])))
    assert "null block (id 0)" in failure.message
    assert (
        list(CHECKS["sanity"].find(trajectory(obs(ids=[0, 5]), group_type="sliding_window"))) == []
    )


def test_sanity_follows_each_table_step_by_step():
    # The check reads only the columns a step appended; what it finds must not change.
    grows = trajectory(
        obs(0, ids=[1], request="a"),
        obs(1, ids=[1, 2], request="a"),
        obs(2, ids=[3, 2], request="b"),
    )
    (shared,) = CHECKS["sanity"].find(grows)
    assert shared.step == 2 and "block 2 is also in the table of live request a" in shared.message
    # A null block is reported at every step it stays in the table, and no longer once gone.
    stays = trajectory(obs(0, ids=[0, 5]), obs(1, ids=[0, 5, 6]), obs(2, ids=[7, 5, 6]))
    assert [f.step for f in CHECKS["sanity"].find(stays)] == [0, 1]
    # A table whose earlier columns change (a window slid) no longer owns the old blocks.
    slid = trajectory(
        obs(0, ids=[1, 2], request="a"),
        obs(1, ids=[0, 2, 3], request="a"),
        obs(2, ids=[1], request="b"),
        group_type="sliding_window",
    )
    assert list(CHECKS["sanity"].find(slid)) == []
    kept = trajectory(
        obs(0, ids=[1, 2], request="a"),
        obs(1, ids=[1, 2, 3], request="a"),
        obs(2, ids=[1], request="b"),
    )
    assert [f.step for f in CHECKS["sanity"].find(kept)] == [2]


def test_sanity_detects_leaked_blocks_at_the_end():
    run = trajectory(obs(ids=[1, 2]), all_finished=True, final_free_blocks=97)
    (failure,) = CHECKS["sanity"].find(run)
    assert "97 free blocks, not all 99" in failure.message


def test_every_group_type_has_a_floor_with_a_reason():
    from kvconform.model.group_types import GROUP_TYPES

    for group_type in GROUP_TYPES.values():
        rules = [
            group_type.floor,
            *(group_type.floor_by[1].values() if group_type.floor_by else ()),
        ]
        assert all(len(rule.reason) > 20 and rule.family for rule in rules), group_type.name


def test_a_group_floor_bound_once_is_the_floor_rule():
    """The driver evaluates floors through FloorRule.for_group; it must equal the rule."""
    from itertools import product

    from kvconform.model.floors import FloorInput

    fixed_inputs = [
        dict(block_size=16, max_model_len=1024),
        dict(block_size=16, max_model_len=100, dcp_world_size=4),
        dict(block_size=64, max_model_len=4096, mamba_cache_mode="align", num_speculative_blocks=3),
        dict(block_size=32, max_model_len=4096, mamba_cache_mode="none", num_speculative_blocks=2),
    ]
    from kvconform.model.group_types import GROUP_TYPES

    for group_type, fixed in product(GROUP_TYPES, fixed_inputs):
        group = GroupInfo(0, group_type, fixed["block_size"], group_type, False, floor_args=fixed)
        step_floor = group.step_floor()
        for computed, scheduled, lookahead, encoder in product(
            (0, 15, 16, 1000), (1, 4, 17), (0, 3, 8), (0, 1500)
        ):
            f = FloorInput(computed, scheduled, lookahead, encoder_len=encoder, **fixed)
            expected = GROUP_TYPES[group_type].floor_for(fixed).blocks(f)
            assert step_floor(computed, scheduled, lookahead, encoder) == expected, (group_type, f)
            assert group.floor_input(computed, scheduled, lookahead, encoder) == f


def test_lookahead_without_speculation_must_be_zero():
    assert list(CHECKS["lookahead"].find(trajectory(vllm_lookahead=0))) == []
    assert (
        list(CHECKS["lookahead"].find(trajectory(vllm_lookahead=None))) == []
    )  # release without it
    (failure,) = CHECKS["lookahead"].find(trajectory(vllm_lookahead=1))
    assert "is 1 without speculative decoding" in failure.message


def test_sanity_the_warmup_hands_out_only_pool_blocks_and_never_the_null_block():
    def warmup_obs(ids: list[int], request: str = "w") -> Observation:
        live_ids = [3, 4] if request == "w" else [5, 6]
        return obs(warmup=len(ids), request=request, ids=live_ids)._replace(warmup_block_ids=ids)

    assert (
        list(CHECKS["sanity"].find(trajectory(warmup_obs([1, 2]), warmup_obs([98, 99], "v")))) == []
    )
    (past,) = CHECKS["sanity"].find(trajectory(warmup_obs([99, 100])))
    assert "hands out block 100, which a pool of 100 blocks does not have" in past.message
    (null,) = CHECKS["sanity"].find(trajectory(warmup_obs([0, 1])))
    assert "hands out the null block (id 0)" in null.message


def test_sanity_a_growing_kv_cache_backs_every_block_the_warmup_hands_out():
    # 0.34's extensible KV cache: blocks 1 and 2 handed out at step 0 need 3 committed
    # (the null block included); with 2 committed, block 2 is unbacked memory.
    warmup = obs(warmup=2, request="w", ids=[3, 4])._replace(warmup_block_ids=[1, 2])
    assert list(CHECKS["sanity"].find(trajectory(warmup, warmup_committed_blocks={0: 3}))) == []
    (short,) = CHECKS["sanity"].find(trajectory(warmup, warmup_committed_blocks={0: 2}))
    assert "hands out block 2, which its extensible KV cache has not committed" in short.message
    assert "2 of 100 blocks backed" in short.message
    # Another step's commit says nothing about this one: no entry, no judgement.
    assert list(CHECKS["sanity"].find(trajectory(warmup, warmup_committed_blocks={1: 2}))) == []


def _windowed(*observations: Observation, span: tuple[str, int]) -> Trajectory:
    group = GroupInfo(
        0,
        "sliding_window" if span[0] == "window" else "chunked_local",
        16,
        "windowed",
        True,
        floor_args=dict(block_size=16, max_model_len=1024),
        read_span=span,
    )
    run = Trajectory((group,), lookahead=0, lookahead_source="test", max_model_len=1024)
    run.observations.extend(observations)
    run.num_blocks = 100
    return run


def test_sanity_a_windowed_step_reads_only_real_blocks():
    # Window 32, blocks of 16: the token at 40 attends to 9..40, columns 0..2.
    reads_freed = obs(computed=40, scheduled=1, lookahead=0, floor=3, live=3, ids=[0, 7, 8])
    (failure,) = CHECKS["sanity"].find(_windowed(reads_freed, span=("window", 32)))
    assert "column 0" in failure.message and "attends to positions 9..40" in failure.message
    assert failure.detail["invariant"] == "frees a block the attention still reads"
    # At 48 the window starts at 17: column 0 is outside it and may be null.
    slid = obs(computed=48, scheduled=1, lookahead=0, floor=4, live=4, ids=[0, 7, 8, 9])
    assert list(CHECKS["sanity"].find(_windowed(slid, span=("window", 32)))) == []


def test_sanity_a_bounded_replay_reads_nothing_below_its_replay_start():
    # Window 64, blocks of 16: the token at 48 would attend to 0..48 (columns 0..3), but a
    # replayed hit has no window KV below Request.replay_start = 48, and vLLM reads none.
    replayed = obs(computed=48, scheduled=32, lookahead=0, floor=5, live=5, ids=[0, 0, 0, 7, 8])
    (failure,) = CHECKS["sanity"].find(_windowed(replayed, span=("window", 64)))
    assert "column 0" in failure.message  # without the bound: the whole window
    bounded = _windowed(replayed, span=("window", 64))
    bounded.read_bounds[0] = 48
    assert list(CHECKS["sanity"].find(bounded)) == []
    # The bound lowers nothing: column 3 (positions 48..63) is read and must be real.
    reads_freed = obs(computed=48, scheduled=32, lookahead=0, floor=5, live=5, ids=[0, 0, 0, 0, 8])
    bounded = _windowed(reads_freed, span=("window", 64))
    bounded.read_bounds[0] = 48
    (failure,) = CHECKS["sanity"].find(bounded)
    assert "column 3" in failure.message and "attends to positions 48..48" in failure.message


def test_sanity_a_chunked_local_step_reads_its_own_chunk():
    # Chunks of 32: the token at 40 reads 32..40 (column 2); columns 0 and 1 may be null,
    # column 2 may not, nor the column the step writes.
    ok = obs(computed=40, scheduled=1, lookahead=0, floor=3, live=3, ids=[0, 0, 8])
    assert list(CHECKS["sanity"].find(_windowed(ok, span=("chunk", 32)))) == []
    freed = obs(computed=47, scheduled=2, lookahead=0, floor=4, live=4, ids=[0, 0, 8, 0])
    (failure,) = CHECKS["sanity"].find(_windowed(freed, span=("chunk", 32)))
    assert "column 3" in failure.message


def test_sanity_a_call_the_scenario_says_is_refused_must_be():
    from kvconform.model.observations import RefusedCall

    run = trajectory()
    run.refusals.append(RefusedCall(3, 12, "b", "prefill 31 (refused)", False, 1))
    assert list(CHECKS["sanity"].find(run)) == []
    run.refusals.append(RefusedCall(4, 13, "b", "decode (refused)", True, 0))
    (failure,) = CHECKS["sanity"].find(run)
    assert failure.step == 4 and failure.request == "b"
    assert "granted a call the scenario says the pool cannot hold" in failure.message


def test_sanity_the_warmup_makes_the_passes_the_scenario_derives():
    from kvconform.model.kind_specs import WarmupPass

    sampled, greedy = WarmupPass(4, "random"), WarmupPass(4, "greedy")
    made = [sampled, greedy]
    assert list(CHECKS["sanity"].find(trajectory(warmup_passes=made))) == []  # nothing expected
    expected = (sampled, WarmupPass(4, "greedy", vllm=">=0.33.0"))  # the gate is not compared
    at = "s.yaml:9: warmup.expect_passes"
    ok = trajectory(warmup_passes=made, expected_warmup_passes=expected)
    assert list(CHECKS["sanity"].find(ok)) == []
    (fewer,) = CHECKS["sanity"].find(
        trajectory(
            warmup_passes=[WarmupPass(3, "random")],
            expected_warmup_passes=expected,
            expected_warmup_passes_at=at,
        )
    )
    assert fewer.check == "sanity" and fewer.party == "warmup"
    assert fewer.message == (
        "warmup_kernels made 1 pass (3 requests, random), but s.yaml:9: warmup.expect_passes "
        "derives 2 passes (4 requests, random; 4 requests, greedy)"
    )
    (not_greedy,) = CHECKS["sanity"].find(
        trajectory(warmup_passes=[sampled, sampled], expected_warmup_passes=expected)
    )
    assert "(4 requests, random; 4 requests, random)" in not_greedy.message


def test_sanity_the_warmup_never_hands_one_block_to_two_tables():
    from kvconform.model.observations import FreeEvent

    def warmup_obs(ids: list[int], request: str, group: int = 0) -> Observation:
        return obs(warmup=len(ids), request=request, ids=[])._replace(
            warmup_block_ids=ids, group=group
        )

    apart = trajectory(warmup_obs([1, 2], "a"), warmup_obs([3], "b"), warmup_obs([1, 2, 4], "a"))
    assert list(CHECKS["sanity"].find(apart)) == []
    (shared,) = CHECKS["sanity"].find(trajectory(warmup_obs([1, 2], "a"), warmup_obs([2, 3], "b")))
    assert shared.party == "warmup" and shared.request == "b"
    assert "the recorded warmup hands out block 2, which request a holds in group 0" in (
        shared.message
    )
    # Once a finishes, its blocks may go to the next request (the greedy pass reuses them).
    freed = trajectory(warmup_obs([1, 2], "a"), warmup_obs([1, 2], "b"))
    freed.events.append(FreeEvent(1, 1, None, "a", "finish", ([1, 2],), 97, 99, ([],)))
    assert [f for f in CHECKS["sanity"].find(freed) if f.party == "warmup"] == []
    # Engine mode's GPU warmup rows have no live replay (and no finish events): not judged.
    engine_rows = [o._replace(live=None) for o in (warmup_obs([1], "a"), warmup_obs([1], "b"))]
    assert [f for f in CHECKS["sanity"].find(trajectory(*engine_rows)) if f.party == "warmup"] == []


def test_lookahead_holds_an_async_kv_load_to_exactly_its_tokens_blocks():
    def loading(live: int) -> Trajectory:
        # 64 loaded tokens, nothing scheduled, lookahead 0: cdiv(64, 16) = 4 blocks.
        row = obs(computed=64, scheduled=0, lookahead=0, floor=4, live=live, predicted=None)
        run = trajectory(
            row, method="eagle", num_speculative_tokens=3, vllm_lookahead=3, expected_lookahead=3
        )
        run.async_loads.add(0)
        return run

    assert list(CHECKS["lookahead"].find(loading(4))) == []
    (extra,) = CHECKS["lookahead"].find(loading(5))
    assert extra.check == "lookahead" and extra.live == 5 and extra.floor == 4
    assert "holds 5 blocks while the request's KV loads asynchronously" in extra.message
    assert "1 block more, lookahead slots reserved during the load" in extra.message
    (fewer,) = CHECKS["lookahead"].find(loading(3))
    assert "fewer than the connector writes into" in fewer.message
    # Blamed on the live side that held the blocks, by its invariant (not on the config).
    result = ScenarioResult("s", "s.yaml", Verdict.FAILED, kind="scheduler")
    result.trajectory = loading(5)
    assert CHECKS["lookahead"].blame(result, extra)[:2] == (
        "scheduler",
        "async KV load holds exactly its tokens' blocks",
    )
    # The same holding on an ordinary row is the floor check's business, not this rule's.
    plain = loading(5)
    plain.async_loads.clear()
    assert list(CHECKS["lookahead"].find(plain)) == []


def mamba_align_trajectory(
    *observations: Observation, caching: bool = True, checkpoint: int = 1
) -> Trajectory:
    """A Mamba "align" group with two speculative state blocks and one checkpoint column."""
    group = GroupInfo(
        0,
        "mamba",
        16,
        "mamba align",
        True,
        floor_args=dict(
            block_size=16,
            max_model_len=1024,
            mamba_cache_mode="align",
            num_speculative_blocks=2,
            num_prefill_checkpoint_blocks=checkpoint,
        ),
    )
    run = Trajectory((group,), lookahead=0, lookahead_source="test", max_model_len=1024)
    run.observations.extend(observations)
    run.num_blocks = 100
    run.exclusive_blocks = not caching
    return run


def test_sanity_mamba_align_state_columns_must_be_real_blocks():
    # The last 1 + 2 columns are the running state and two speculative states.
    assert list(CHECKS["sanity"].find(mamba_align_trajectory(obs(ids=[0, 0, 3, 4, 5])))) == []
    (failure,) = CHECKS["sanity"].find(mamba_align_trajectory(obs(ids=[0, 3, 0, 4, 5])))
    assert failure.detail == {"invariant": "mamba align null state"}
    assert "column 2 of the last 3" in failure.message
    (short,) = CHECKS["sanity"].find(mamba_align_trajectory(obs(ids=[4, 5])))
    assert short.detail == {"invariant": "mamba align null state"}


def test_sanity_mamba_align_state_blocks_are_never_shared_even_with_prefix_caching():
    # b reads a's cached state 3 (shared, fine) but writes into a's state block 5.
    reads = mamba_align_trajectory(obs(ids=[0, 3, 4, 5, 6]), obs(ids=[0, 3, 7, 8, 9], request="b"))
    assert list(CHECKS["sanity"].find(reads)) == []
    writes = mamba_align_trajectory(
        obs(ids=[0, 3, 4, 5, 6]), obs(1, ids=[0, 0, 7, 8, 5], request="b")
    )
    (failure,) = CHECKS["sanity"].find(writes)
    assert failure.request == "b"
    assert "state block 5" in failure.message and "live request a" in failure.message
    # Once a has finished, its blocks may go to b.
    freed = mamba_align_trajectory(
        obs(ids=[0, 3, 4, 5, 6]), obs(1, ids=[0, 0, 7, 8, 5], request="b")
    )
    freed.events.append(FreeEvent(1, 1, 11, "a", "finish", ([3, 4, 5, 6],), 90, 94, ([],)))
    assert list(CHECKS["sanity"].find(freed)) == []


def test_sanity_mamba_align_state_freed_and_taken_in_one_step_is_not_shared():
    # Within one schedule() vLLM allocates for running a (nulling column 1, block 3) before
    # it admits b, which may take block 3; the scheduler oracle records b's row first.
    handed = mamba_align_trajectory(
        obs(ids=[0, 3, 4, 5, 6]),
        obs(1, ids=[9, 10, 3], request="b"),
        obs(1, ids=[0, 0, 4, 5, 6, 7]),
    )
    assert list(CHECKS["sanity"].find(handed)) == []
    # a still holding block 3 after the step: shared, whatever the order of the rows.
    kept = mamba_align_trajectory(
        obs(ids=[0, 3, 4, 5, 6]),
        obs(1, ids=[9, 10, 3], request="b"),
        obs(1, ids=[0, 3, 4, 5, 6]),
    )
    (failure,) = CHECKS["sanity"].find(kept)
    assert failure.detail == {"invariant": "mamba align shared state"}
    assert failure.request == "b" and "state block 3" in failure.message


def test_sanity_mamba_align_holds_at_most_its_states_checkpoint_and_one_copy():
    # 2 states + 2 speculative + 1 checkpoint + 1 copy-on-write tail = 6 real blocks.
    assert list(CHECKS["sanity"].find(mamba_align_trajectory(obs(ids=[1, 2, 0, 3, 4, 5, 6])))) == []
    (failure,) = CHECKS["sanity"].find(mamba_align_trajectory(obs(ids=[1, 2, 7, 3, 4, 5, 6])))
    assert failure.detail == {"invariant": "mamba align state blocks held"}
    assert "holds 7 real blocks" in failure.message


def test_sanity_mamba_align_running_table_only_appends_or_nulls_columns():
    # a's state moves on: column 1 is nulled and the table grows (what vLLM does).
    grows = mamba_align_trajectory(obs(ids=[0, 3, 4, 5]), obs(1, ids=[0, 0, 4, 5, 6]))
    assert list(CHECKS["sanity"].find(grows)) == []
    # A running request's column 1 switching to another real block (an in-place
    # copy-on-write): the worker, which only appends, still uses block 3 there.
    swapped = mamba_align_trajectory(obs(ids=[0, 3, 4, 5]), obs(1, ids=[0, 9, 4, 5, 6]))
    (failure,) = CHECKS["sanity"].find(swapped)
    assert failure.detail == {"invariant": "mamba align rewritten table"}
    assert "column 1 changed from block 3 to block 9" in failure.message
    shrinks = mamba_align_trajectory(obs(ids=[0, 3, 4, 5, 6]), obs(1, ids=[0, 3, 4, 5]))
    (short,) = CHECKS["sanity"].find(shrinks)
    assert "shrank from 5 to 4 columns" in short.message
    # After a preemption the request starts a new table.
    preempted = mamba_align_trajectory(obs(ids=[0, 3, 4, 5]), obs(1, ids=[0, 9, 4, 5, 6]))
    preempted.events.append(FreeEvent(1, 1, 11, "a", "preempt", ([3, 4, 5],), 90, 93, ([],)))
    assert list(CHECKS["sanity"].find(preempted)) == []


def two_group_trajectory(*observations: Observation, caching: bool = True) -> Trajectory:
    """Full attention and a sliding window of 32 sharing one pool."""
    groups = (
        GroupInfo(0, "full_attention", 16, "full", False, floor_args=dict(block_size=16)),
        GroupInfo(
            1, "sliding_window", 16, "window", True,
            floor_args=dict(block_size=16, sliding_window=32),
        ),
    )  # fmt: skip
    run = Trajectory(groups, lookahead=0, lookahead_source="test", max_model_len=1024)
    run.observations.extend(observations)
    run.num_blocks = 100
    run.exclusive_blocks = not caching
    return run


def group_obs(step, group, ids, request="b") -> Observation:
    return Observation(step, 10 + step, request, "prefill 80", group, 0, 80, 0, 5, len(ids),
                       None, None, None, ids)  # fmt: skip


def test_sanity_one_block_is_in_one_groups_table_at_a_time():
    # Issue #33775: full attention's new block 8 is the window's cache-hit block too.
    bug = two_group_trajectory(group_obs(0, 0, [1, 2, 3, 4, 8]), group_obs(0, 1, [0, 0, 0, 8, 7]))
    (failure,) = CHECKS["sanity"].find(bug)
    assert failure.detail == {"invariant": "puts one block in two groups' tables", "block": 8}
    assert failure.group == 0 and "request b's group 1" in failure.message
    # The same with the second group's table held by another live request, caching or not.
    for caching in (True, False):
        other = two_group_trajectory(
            group_obs(0, 1, [0, 0, 0, 8], "a"), group_obs(1, 0, [1, 2, 8]), caching=caching
        )
        assert "puts one block in two groups' tables" in {
            (f.detail or {}).get("invariant") for f in CHECKS["sanity"].find(other)
        }
    fixed = two_group_trajectory(group_obs(0, 0, [1, 2, 3, 4, 7]), group_obs(0, 1, [0, 0, 0, 8, 6]))
    assert list(CHECKS["sanity"].find(fixed)) == []
    # One call frees a window block and hands it to full attention: no overlap once
    # both rows of the call are applied.
    moved = two_group_trajectory(
        group_obs(0, 0, [1, 2]), group_obs(0, 1, [5, 6]),
        group_obs(1, 0, [1, 2, 5]), group_obs(1, 1, [0, 6, 7]),
    )  # fmt: skip
    assert list(CHECKS["sanity"].find(moved)) == []
    # One step: b's window frees block 3 (b runs, so vLLM allocates for it first) and d,
    # admitted after it, takes it for full attention; the scheduler oracle records the
    # admission's rows first (kvconform explore --seed 1 on 0.34.0 reported it as shared).
    handed = two_group_trajectory(
        group_obs(1, 0, [1, 2]), group_obs(1, 1, [3, 4]),
        group_obs(2, 0, [3], "d"), group_obs(2, 1, [5], "d"),
        group_obs(2, 0, [1, 2]), group_obs(2, 1, [0, 4]),
    )  # fmt: skip
    assert list(CHECKS["sanity"].find(handed)) == []
    # Still shared at the step's end: caught.
    kept = two_group_trajectory(
        group_obs(1, 0, [1, 2]), group_obs(1, 1, [3, 4]),
        group_obs(2, 0, [3], "d"), group_obs(2, 1, [5], "d"),
        group_obs(2, 0, [1, 2]), group_obs(2, 1, [3, 4]),
    )  # fmt: skip
    assert [f.detail for f in CHECKS["sanity"].find(kept)] == [
        {"invariant": "puts one block in two groups' tables", "block": 3}
    ]
    # A finished request's blocks may go to another group.
    freed = two_group_trajectory(group_obs(0, 1, [0, 8], "a"), group_obs(1, 0, [1, 8]))
    freed.events.append(FreeEvent(1, 0, 10, "a", "finish", ([], [8]), 90, 91, ([], [])))
    assert list(CHECKS["sanity"].find(freed)) == []


def test_sanity_a_mamba_align_chunk_starting_mid_block_stops_at_the_boundary():
    # PR #51113: a chunk from 8 to 28 (blocks of 16) leaves column 0 holding the state
    # after 8 tokens, which vLLM caches as the state after 16.
    crossing = mamba_align_trajectory(
        obs(1, computed=8, scheduled=20, ids=[5, 6, 7, 8]), checkpoint=0
    )
    crossing.prefill_rows = {0}
    (failure,) = CHECKS["sanity"].find(crossing)
    assert failure.detail == {"invariant": "mamba align state in the wrong column", "column": 0}
    assert "from position 8 to 28" in failure.message and "state after 16" in failure.message
    # Stopping at the boundary, starting on one, or nulling the column is fine.
    for computed, scheduled, ids in (
        (8, 8, [5, 6, 7]),
        (16, 20, [5, 6, 7, 8]),
        (8, 20, [0, 6, 7, 8]),
    ):
        fine = mamba_align_trajectory(
            obs(1, computed=computed, scheduled=scheduled, ids=ids), checkpoint=0
        )
        fine.prefill_rows = {0}
        assert list(CHECKS["sanity"].find(fine)) == [], (computed, scheduled, ids)
    # A prefix-cache hit of 16 tokens within the chunk: it computes from 16.
    hit = mamba_align_trajectory(
        obs(1, computed=0, scheduled=28, ids=[5, 6, 7, 8])._replace(cached=16), checkpoint=0
    )
    hit.prefill_rows = {0}
    assert list(CHECKS["sanity"].find(hit)) == []
    # Only prefill chunks: a verification step's drafts live in speculative columns.
    drafts = mamba_align_trajectory(
        obs(1, computed=15, scheduled=3, ids=[5, 6, 7, 8]), checkpoint=0
    )
    assert list(CHECKS["sanity"].find(drafts)) == []
    # With a prefill checkpoint column the worker exports the boundary state mid-chunk.
    exported = mamba_align_trajectory(obs(1, computed=8, scheduled=20, ids=[5, 6, 7, 8]))
    exported.prefill_rows = {0}
    assert list(CHECKS["sanity"].find(exported)) == []
