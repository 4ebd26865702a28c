"""The least prefix-cache hit (kvconform/model/prefix_hits.py) and the hits family of check
``sanity`` (kvconform/harness/checks/hits.py): bounds derived by hand from the rules of each
group type, the family on hand-built facts (no vLLM) and on a recorded scheduler run, and
going red on a hit-shortening bug injected into a copy of vLLM's coordinator (slow)."""

from __future__ import annotations

import json

import pytest

from kvconform.errors import ExitStatus
from kvconform.harness import runner
from kvconform.harness.checks import CHECKS, hits
from kvconform.model.facts import (
    Fact,
    HitGroup,
    HitSource,
    PoolCensus,
    PrefixLookup,
    SchedulerReset,
)
from kvconform.model.observations import HIT_LOST, FreeEvent, GroupInfo, Trajectory
from kvconform.model.prefix_hits import hit_rules, least_hit, shared_prefix
from kvconform.model.recording import Recording, dumps, loads
from kvconform.model.results import Verdict

FULL16 = HitGroup("dense", 16)


def lookup(
    groups=(FULL16,), *, prompt=120, hit=0, retention=None, drop=False, lookahead=0,
    reprefill=0, sources=(), no_bound="",
) -> PrefixLookup:  # fmt: skip
    return PrefixLookup(
        hit, prompt, tuple(groups), retention, drop, lookahead, reprefill, no_bound,
        tuple(sources), 0,
    )  # fmt: skip


def source(shared, prompt=200, scheduled=None, name="a", columns=()) -> HitSource:
    return HitSource(name, prompt, shared, prompt if scheduled is None else scheduled, columns)


def bound(look: PrefixLookup, src: HitSource) -> int:
    return least_hit(look, src).tokens


# -- the bound, derived by hand -------------------------------------------------------------


def test_full_attention_hits_every_full_block_of_the_shared_prefix() -> None:
    # a computed its 100-token prompt; b (120 tokens) begins with all of it: 6 full blocks
    # of 16 (96 tokens) are cached and shared, the 7th (96..111) is only partly a's.
    assert bound(lookup(prompt=120), source(100, prompt=100)) == 96


def test_the_last_prompt_token_is_never_a_hit() -> None:
    # A resend of a 64-token prompt: the hit stops below token 63 (its logits), so at the
    # last full block boundary under it, 48.
    assert bound(lookup(prompt=64), source(64, prompt=64)) == 48


def test_only_what_the_earlier_request_scheduled_is_cached() -> None:
    # a has scheduled 40 tokens of its 200-token prompt (chunked prefill): 2 full blocks.
    assert bound(lookup(prompt=120), source(100, scheduled=40)) == 32


def test_a_dropping_drafter_costs_one_block_and_its_reprefill_never_counts() -> None:
    # The EAGLE block drop: a 192-token shared prefix (12 blocks) hits 11 blocks, 176 tokens
    # (vLLM's 0.20.0 fix of #40860: one drop, not one per pass). k = 1 re-prefillable token
    # leaves 199 of a's 200 cached, above the shared 192.
    look = lookup(prompt=230, drop=True, reprefill=1)
    assert bound(look, source(192)) == 176
    # Without the drop the same prefix hits whole: the bound takes the lesser semantics.
    assert bound(lookup(prompt=230), source(192)) == 192


def test_lookahead_hashes_cover_the_tokens_a_drafter_reads_past_a_block() -> None:
    # With k = 3 the hash of a block covers up to 3 tokens after it: of a 100-token shared
    # prefix only blocks ending by token 97 are shared: 6 blocks, 96 tokens. Of a 98-token
    # prefix the same; of 99 tokens nothing more (96 + 16 + 3 > 99).
    look = lookup(prompt=150, lookahead=3, reprefill=3)
    assert bound(look, source(100)) == 96
    assert bound(look, source(95)) == 80  # 80 + 3 <= 95 < 96 + 3
    # A resend of 64 tokens: blocks end by 64 - 3 = 61: 3 blocks.
    assert bound(lookup(prompt=64, lookahead=3, reprefill=3), source(64, prompt=64)) == 48
    # A release without lookahead hashes drops the last block instead (vLLM before 0.33):
    # a 110-token resend of a 120-token prompt reaches 109 -> 96, less the drop, 80, below the
    # hashed reach (107 -> 96): the bound takes the lesser.
    assert bound(lookup(prompt=110, lookahead=3, reprefill=3), source(110, prompt=120)) == 96
    both = lookup(prompt=110, lookahead=3, reprefill=3, drop=True)
    assert bound(both, source(110, prompt=120)) == 80


def test_per_group_block_sizes_align_hits_to_their_least_common_multiple() -> None:
    # Full attention in blocks of 32 beside a 64-token window in blocks of 16: hits align to
    # 32. 192 shared tokens: 192 without the drop, 160 with it; sparse retention (0) keeps
    # the window at a's replay boundaries, 192 (resend 199 -> 192) and, with the drop,
    # 160 and 160 (one unit below 192 and below 200 -> 192): the bound is 160.
    groups = (HitGroup("dense", 32), HitGroup("window", 16, 64))
    look = lookup(groups, prompt=230, retention=0, drop=True, reprefill=1)
    assert bound(look, source(192)) == 160
    assert least_hit(look, source(192)).columns == ((0, 5), (6, 11))


def test_sparse_retention_guarantees_a_window_only_at_replay_boundaries() -> None:
    window = (FULL16, HitGroup("window", 16, 32))
    # b shares 100 of a's 200 tokens: a kept its window at 192 only (its resend), above
    # b's reach: no bound. Dense retention (None) keeps every boundary: 96.
    assert bound(lookup(window, prompt=150, retention=0), source(100)) == 0
    assert bound(lookup(window, prompt=150, retention=None), source(100)) == 96
    # A positive interval also keeps every multiple of it: 64 below 96.
    assert bound(lookup(window, prompt=150, retention=64), source(100)) == 64
    # A resend of a's prompt reaches a's replay boundary: 192.
    assert bound(lookup(window, prompt=200, retention=0), source(200)) == 192
    # Full attention alone ignores retention: 96.
    assert bound(lookup(prompt=150, retention=0), source(100)) == 96


def test_types_without_a_rule_and_connectors_have_no_bound(scenario_from) -> None:
    model = scenario_from(
        """
        name: m
        kind: scheduler
        model:
          block_size: 16
          max_model_len: 256
          num_blocks: 64
          enable_caching: true
          groups: [full_attention, {type: mamba, mamba_cache_mode: align}]
        scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}
        requests: {a: {prompt_len: 40}}
        """
    ).model
    groups, why = hit_rules(model, connector=False)
    assert groups[0] == HitGroup("dense", 16) and groups[1].rule == ""
    assert "mamba" in why
    plain = scenario_from(
        """
        name: p
        kind: scheduler
        model: {block_size: 16, max_model_len: 256, num_blocks: 64, enable_caching: true}
        scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}
        requests: {a: {prompt_len: 40}}
        """
    ).model
    assert hit_rules(plain, connector=False)[1] == ""
    assert "connector" in hit_rules(plain, connector=True)[1]


def test_shared_prefixes_follow_prefix_from_chains(scenario_from) -> None:
    requests = scenario_from(
        """
        name: chain
        kind: scheduler
        model: {block_size: 16, max_model_len: 256, num_blocks: 64, enable_caching: true}
        scheduler: {max_num_seqs: 3, max_num_batched_tokens: 64}
        requests:
          a: {prompt_len: 100}
          b: {prompt_len: 80, prefix_from: a, prefix_len: 30}
          c: {prompt_len: 90, prefix_from: b, prefix_len: 50}
        """
    ).requests
    # c copies b's first 50 tokens, of which b's first 30 are a's.
    assert shared_prefix(requests, "a", "c") == 30
    assert shared_prefix(requests, "b", "c") == 50
    assert shared_prefix(requests, "a", "b") == 30


# -- the family on hand-built facts -----------------------------------------------------------


def census(step: int, *tables: tuple[int, ...], pool: int = 32) -> Fact:
    held = {f"r{i}": (table,) for i, table in enumerate(tables)}
    return Fact(step, None, "-", "schedule", PoolCensus(0, pool, held, (), {}, frozenset()))


def trajectory(*facts: Fact, events=()) -> Trajectory:
    group = GroupInfo(0, "full_attention", 16, "full_attention", False)
    run = Trajectory((group,), lookahead=0, lookahead_source="test", max_model_len=256)
    run.facts += list(facts)
    run.events += list(events)
    run.request_lines = {"a": 10, "b": 11}
    return run


A_COLUMNS = ((1, 2, 3, 4, 5, 6, 7),)
B_LOOKUP = lookup(prompt=120, hit=32, sources=[source(100, prompt=100, columns=A_COLUMNS)])


def test_a_hit_below_the_bound_fails_naming_the_cached_blocks() -> None:
    run = trajectory(
        census(0, (1, 2, 3, 4, 5, 6, 7)),
        census(1, (8, 9, 10)),
        Fact(1, 11, "b", "schedule", B_LOOKUP),
    )
    (failure,) = [f for _, f in hits.judge(run)]
    assert failure.detail["invariant"] == HIT_LOST and failure.request == "b"
    assert "hit of 32 tokens" in failure.message and "below the 96" in failure.message
    assert "group 0 columns 0-5: blocks [1, 2, 3, 4, 5, 6]" in failure.message
    # The family runs inside check sanity (whose conservation family also reads the
    # hand-built census, which holds no real pool).
    found = list(CHECKS["sanity"].find(run))
    assert [f.detail["invariant"] for f in found].count(HIT_LOST) == 1


def test_a_lost_hit_in_a_one_token_window_names_its_cause_in_the_signature() -> None:
    # A sliding window of one token needs no block before a hit, so the bound asks for a
    # resend's hit (32 of a 33-token prompt) with no column named; vLLM keeps none of such
    # a group's blocks and finds nothing (docs/findings.md #29). The failure names the
    # cause and sanity's signature splits by it, so that the triaged finding excuses no
    # other lost hit; the same loss in a window of two tokens keeps the plain signature.
    from kvconform.fuzz.findings import signatures
    from kvconform.model.results import ScenarioResult

    def lost(window: int) -> list[str]:
        look = lookup(
            (HitGroup("window", 16, window),), prompt=33, retention=0,
            sources=[source(33, prompt=33, columns=((1, 2, 3),))],
        )  # fmt: skip
        run = trajectory(
            census(0, (1, 2, 3)), census(1, (4, 5, 6)), Fact(1, 11, "b", "schedule", look)
        )
        (failure,) = [f for _, f in hits.judge(run)]
        assert "below the 32" in failure.message
        result = ScenarioResult("s", "s.yaml", Verdict.FAILED, failures=[failure])
        return [str(s) for s in signatures(result)]

    assert lost(1) == [f"sanity / - / {HIT_LOST}: a sliding window of one token"]
    assert lost(2) == [f"sanity / - / {HIT_LOST}"]


def test_a_hit_at_the_bound_passes() -> None:
    run = trajectory(
        census(0, (1, 2, 3, 4, 5, 6, 7)),
        Fact(1, 11, "b", "schedule", B_LOOKUP._replace(hit=96)),
    )
    assert list(hits.judge(run)) == []


def test_no_bound_where_a_cached_block_may_have_been_evicted() -> None:
    lost = Fact(1, 11, "b", "schedule", B_LOOKUP)
    # Every one of the pool's 7 blocks (8 with the null block) has been held: the next one
    # handed out may have been a's.
    assert list(hits.judge(trajectory(census(0, (1, 2, 3, 4, 5, 6, 7), pool=8), lost))) == []
    # A preemption, or a reset of the prefix cache, before the lookup.
    preempt = FreeEvent(0, 1, 10, "a", "preempt", ([1],), 0, 0, ([],))
    assert list(hits.judge(trajectory(census(0, (1, 2)), lost, events=[preempt]))) == []
    reset = Fact(1, None, "-", "reset_prefix_cache", SchedulerReset(True, True, 1, False, False))
    assert list(hits.judge(trajectory(census(0, (1, 2)), reset, lost))) == []
    # A stated reason for no bound.
    unbounded = Fact(1, 11, "b", "schedule", B_LOOKUP._replace(no_bound="a mamba group"))
    assert list(hits.judge(trajectory(census(0, (1, 2)), unbounded))) == []


# -- a recorded scheduler run -----------------------------------------------------------------

# Full attention beside two sliding windows (three attention groups), an EAGLE drafter that
# drops the last matched block (lookahead hashes off), vLLM's default sparse retention. b
# shares 192 tokens of a's prompt, c resends it.
THREE_GROUPS = """
name: three-groups
kind: scheduler
model:
  block_size: 16
  max_model_len: 512
  num_blocks: 200
  enable_caching: true
  groups:
    - full_attention
    - {type: sliding_window, sliding_window: 32}
    - {type: sliding_window, sliding_window: 64}
speculative: {method: eagle, num_speculative_tokens: 1, disable_lookahead_block_hashes: true}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 512}
requests:
  a: {prompt_len: 200, max_tokens: 4}
  b: {prompt_len: 230, prefix_from: a, prefix_len: 192, arrival: 8}
  c: {prompt_len: 200, prefix_from: a, prefix_len: 200, arrival: 16}
"""


def test_the_family_judges_a_recorded_run_and_a_lost_hit_in_it(scenario_from, vllm) -> None:
    scenario = scenario_from(THREE_GROUPS)
    result = runner.run_scenario(scenario, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    recorded = Recording(scenario.id, "three-groups.yaml", "scheduler", result.trajectory)
    run = loads(dumps(recorded)).trajectory  # judged as `kvconform judge` reads it
    assert run is not None
    found = {f.request: f.what for f in run.facts if isinstance(f.what, PrefixLookup)}
    # b: 12 shared blocks less the drop, at a's replay boundaries (176); c: a's resend
    # boundary (199 -> 192) less the drop, 176. vLLM 0.34.0 gives both.
    assert (found["b"].hit, found["c"].hit) == (176, 176)
    assert [least_hit(found["b"], s).tokens for s in found["b"].sources] == [176]
    assert list(hits.judge(run)) == []
    # The same recording with b's hit shortened by one block, as a lost hit would be.
    run.facts = [
        f._replace(what=f.what._replace(hit=160))
        if isinstance(f.what, PrefixLookup) and f.request == "b"
        else f
        for f in run.facts
    ]
    (failure,) = [f for _, f in hits.judge(run)]
    assert failure.request == "b" and "below the 176" in failure.message
    assert "group 2 columns 7-11" in failure.message  # the 64-token window and the peek


# -- a hit-shortening bug injected into vLLM 0.34.0 (slow) ------------------------------------

# The adapted revert of #40860 (realbugs/patches/eagle-multigroup-hit-spiral-to-zero.patch,
# written for 0.33.0): every pass of the hybrid coordinator's fixed-point loop drops the
# EAGLE block again and looks no further than the candidate, so with three attention groups
# the hit shrinks by a block per pass.
SPIRAL = (
    "v1/core/kv_cache_coordinator.py",
    "drop_eagle_block = use_eagle and idx not in eagle_verified\n",
    "drop_eagle_block = use_eagle\n",
)
NO_MARGIN = "if drop_eagle_block and not isinstance(spec, MambaSpec):"


@pytest.mark.slow
def test_the_family_catches_a_hit_that_spirals_down(pristine_tree, tmp_path) -> None:
    from vllm_copy import REPO, run_kvconform, tree_with_replacement

    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *SPIRAL)
    module = tree / "vllm" / SPIRAL[0]
    text = module.read_text(encoding="utf-8")
    assert text.count(NO_MARGIN) == 1
    module.write_text(text.replace(NO_MARGIN, "if False:"), encoding="utf-8")
    scenario = tmp_path / "three-groups.yaml"
    scenario.write_text(THREE_GROUPS, encoding="utf-8")
    out = tmp_path / "report"
    done = run_kvconform(
        "run", scenario, "--vllm-src", tree, "--report-dir", out, "--progress", "off",
        "--no-expectations", cwd=REPO,
    )  # fmt: skip
    assert done.returncode == ExitStatus.NONCONFORMANCE, done.stdout + done.stderr
    (entry,) = json.loads((out / "report.json").read_text())["scenarios"]
    lost = [f for f in entry["failures"] if f.get("detail", {}).get("invariant") == HIT_LOST]
    assert {f["request"] for f in lost} == {"b", "c"}, entry["failures"]


def test_the_injected_texts_are_in_the_installed_vllm() -> None:
    """The slow test's edits must still find their text (a vLLM upgrade fails here first)."""
    from vllm_copy import installed_vllm_dir

    text = (installed_vllm_dir() / SPIRAL[0]).read_text(encoding="utf-8")
    assert text.count(SPIRAL[1]) == 1 and text.count(NO_MARGIN) == 1


RETAINED = """
name: retained
kind: scheduler
model:
  block_size: 16
  max_model_len: 512
  num_blocks: 200
  enable_caching: true
  {retention}
  groups: [full_attention, {{type: sliding_window, sliding_window: 32}}]
scheduler: {{max_num_seqs: 4, max_num_batched_tokens: 512}}
requests:
  a: {{prompt_len: 200, max_tokens: 4}}
  b: {{prompt_len: 150, prefix_from: a, prefix_len: 100, arrival: 8}}
"""


@pytest.mark.parametrize(
    ("retention", "expected"),
    [
        ("", 0),
        ("prefix_cache_retention_interval: 64", 64),
        ("prefix_cache_retention_interval: 32", 96),
    ],
)
def test_a_scheduler_scenarios_retention_interval_reaches_vllm(
    scenario_from, vllm, retention, expected
) -> None:
    # b shares 100 of a's tokens (6 full blocks, 96). Under vLLM's default sparse retention
    # (0) the window is kept only at a's replay boundary (192): no hit; every 64 tokens: 64;
    # every 32: 96. The bound derives each, and vLLM 0.34.0 gives it.
    result = runner.run_scenario(scenario_from(RETAINED.format(retention=retention)), vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    assert result.trajectory is not None
    (b,) = [f.what for f in result.trajectory.facts if isinstance(f.what, PrefixLookup)][1:]
    assert b.hit == expected
    assert max(least_hit(b, s).tokens for s in b.sources) == expected
