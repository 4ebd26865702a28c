"""Root-cause groups: records blamed on the right party with the right shape of miss.

The unit tests build records by hand (the grouping reads only what a
:class:`Failure` carries). The last test injects two different bugs at once into
a copy of vLLM's tree -- the warmup predictor ``_reserved_block_count`` and the
live ``KVCacheManager.allocate_slots`` both forgetting the lookahead -- and
asserts that the run's many failing records fall into exactly two groups, one
per party, in the console, ``summary.md`` and ``report.json``.
"""

from __future__ import annotations

import json
import re

import pytest
from vllm_copy import REPO, run_kvconform, tree_with_replacement

from kvconform.harness.root_causes import blame, find_root_causes
from kvconform.model.observations import GroupInfo, Observation, Trajectory
from kvconform.model.results import Failure, ScenarioResult, Verdict
from kvconform.model.root_causes import (
    PARTIES,
    RootCause,
    describe_shortfalls,
    rank_by_data_flow,
    upstream_of,
)


def failed(scenario_id: str, *failures: Failure, kind: str = "trajectory") -> ScenarioResult:
    run = Trajectory(
        groups=(GroupInfo(0, "full_attention", 16, "full_attention", False),),
        lookahead=3,
        lookahead_source="vllm",
        method="eagle",
    )
    result = ScenarioResult(scenario_id, "scenarios/x.yaml", Verdict.FAILED, kind)
    result.failures, result.trajectory = list(failures), run
    return result


def floor_record(party: str, held: int, floor: int = 5, **numbers: object) -> Failure:
    values: dict[str, object] = {
        "live": floor,
        "predicted": floor,
        "lookahead": 3,
        "floor_without_lookahead": 4,
        **numbers,
    }
    values[party] = held
    values = {"step": 1, "request": "a", "group": 0, **values}
    return Failure("floor", "m", floor=floor, party=party, **values)  # type: ignore[arg-type]


def test_the_shape_of_a_shortfall_comes_from_the_records_numbers():
    result = failed("s")
    forgot = blame(result, floor_record("predicted", 4))
    assert forgot.party == "predicted" and forgot.short is not None
    assert forgot.miss.startswith("is short the whole lookahead")
    at_cap = floor_record("live", 4, floor_without_lookahead=3, capped=True)
    assert blame(result, at_cap)[:2] == ("live", "is one block short at the max_model_len cap")
    dcp = floor_record("live", 3, floor=6, floor_without_lookahead=5, dcp=2)
    assert blame(result, dcp).miss.startswith("is short by the DCP factor")
    assert blame(result, floor_record("warmup", 1, warmup=1))[:2] == (
        "warmup",
        "is several blocks below the floor",
    )
    # In scheduler and engine mode the live side is vLLM's scheduler, or its engine.
    assert blame(failed("t", kind="scheduler"), floor_record("live", 4))[0] == "scheduler"
    assert blame(failed("e", kind="engine"), floor_record("live", 4))[0] == "engine"


def written(computed: int, scheduled: int, lookahead: int, block: int = 16) -> dict[str, object]:
    """The numbers failure_at records about the positions a step writes."""
    end = computed + scheduled + lookahead
    return {
        "computed": computed,
        "scheduled": scheduled,
        "lookahead": lookahead,
        "written_end": end,
        "block_tokens": block,
        "floor_without_lookahead": -(-(computed + scheduled) // block),
    }


def test_one_position_short_and_the_whole_lookahead_are_told_apart():
    # One slot too few: every record leaves exactly the drafter's last position uncovered.
    one_slot = [
        floor_record("live", 2, floor=3, **written(29, 1, 3)),  # writes 0..32, holds 0..31
        floor_record("live", 4, floor=5, **written(60, 2, 3)),  # writes 0..64, holds 0..63
    ]
    shorts = [blame(failed("s"), f).short for f in one_slot]
    # Each record also holds what its step needs without the lookahead: the records alone
    # cannot tell one slot too few from the lookahead forgotten.
    assert describe_shortfalls(shorts)[0] == "one-position-or-lookahead"
    # The lookahead forgotten: the records leave 1..3 of the drafter's positions uncovered.
    forgot = [
        floor_record("live", 2, floor=3, **written(29, 1, 3)),
        floor_record("live", 2, floor=3, **written(30, 1, 3)),
        floor_record("live", 2, floor=3, **written(31, 1, 3)),
    ]
    shorts = [blame(failed("s"), f).short for f in forgot]
    assert describe_shortfalls(shorts)[0] == "whole-lookahead"
    # A block too few where the target's own positions go without a block.
    target = floor_record("live", 1, floor=2, **written(20, 8, 1))
    assert blame(failed("s"), target).miss == (
        "is one block short, the target's own positions among those without a block"
    )


def test_the_steps_that_did_not_fall_short_tell_one_slot_from_the_whole_lookahead():
    def row(request: str, computed: int, scheduled: int, live: int) -> Observation:
        floor = -(-(computed + scheduled + 3) // 16)
        return Observation(0, 1, request, "prefill", 0, computed, scheduled, 3, floor, live,
                           floor, floor)  # fmt: skip

    result = failed("s", floor_record("live", 2, floor=3, **written(0, 30, 3)))
    assert result.trajectory is not None
    # a writes 0..32 and holds 2 blocks; b writes 0..33 and holds its 3: one slot too few
    # leaves b whole, the lookahead forgotten would have left it 2.
    result.trajectory.observations = [row("a", 0, 30, 2), row("b", 0, 31, 3)]
    (group,) = find_root_causes([result])
    assert group.miss.startswith("is one position short in every record: the last position")
    # Had b fallen short too, one slot too few would not explain it.
    result.trajectory.observations = [row("a", 0, 30, 2), row("b", 0, 31, 2)]
    result.failures.append(floor_record("live", 2, floor=3, request="b", **written(0, 31, 3)))
    (group,) = find_root_causes([result])
    assert group.miss.startswith("is short the whole lookahead")


def test_agree_blames_the_party_below_the_floor_or_the_one_holding_more():
    result = failed("s")

    def agree(live: int, predicted_max: int, floor: int = 5, **numbers: object) -> Failure:
        return Failure(
            "agree",
            "m",
            floor=floor,
            live=live,
            predicted=predicted_max,
            party="live",
            lookahead=3,
            floor_without_lookahead=4,
            detail={"predicted_max": predicted_max},
            **numbers,  # type: ignore[arg-type]
        )

    below = blame(result, agree(5, 4))
    assert below.party == "predicted" and below.follows == "predicted"
    assert below.miss.startswith("predicts fewer than the live allocator holds and is short")
    short = blame(result, agree(4, 5))
    assert short.party == "live" and short.follows == "live"
    assert short.miss.startswith("holds fewer than the warmup predictor predicts and is short")
    assert blame(result, agree(7, 6))[:2] == (
        "live",
        "holds more than the warmup predictor by one block",
    )
    # The running maximum above a live count at the floor follows an earlier shortfall.
    after = blame(result, agree(6, 7, floor=6, capped=True))
    assert after[:2] == (
        "predicted",
        "predicts more than the live allocator holds by one block at the max_model_len cap",
    )
    assert after.follows == "live"


def hybrid(scenario_id: str, *failures: Failure, lookahead: int = 3) -> ScenarioResult:
    """A failed eagle scenario over a sliding-window and a full-attention group."""
    groups = (
        GroupInfo(0, "sliding_window", 16, "sliding_window", True, manager="SlidingWindowManager",
                  manager_file=SINGLE_TYPE),
        GroupInfo(1, "full_attention", 16, "full_attention", False, manager="FullAttentionManager",
                  manager_file=SINGLE_TYPE),
    )  # fmt: skip
    run = Trajectory(groups=groups, lookahead=lookahead, lookahead_source="vllm", method="eagle")
    result = ScenarioResult(scenario_id, f"scenarios/{scenario_id}.yaml", Verdict.FAILED)
    result.failures, result.trajectory = list(failures), run
    return result


SINGLE_TYPE = "vllm/v1/core/single_type_kv_cache_manager.py"


def short_step(step: int, group: int = 0, computed: int = 29, **extra: object) -> list[Failure]:
    """One short step as three checks see it: floor, agree and slots."""
    numbers: dict[str, object] = {
        "step": step, "request": "a", "group": group, "floor": 3, "live": 2, "predicted": 3,
        **written(computed, 1, 3), **extra,
    }  # fmt: skip
    return [
        Failure("floor", "m", party="live", **numbers),  # type: ignore[arg-type]
        Failure("agree", "m", party="live", detail={"predicted_max": 3}, **numbers),  # type: ignore[arg-type]
        Failure("slots", "m", party="live", detail={"party": "live", "role": "drafter",
                "whose": "kvconform's poison past the held columns (no block)"}, **numbers),  # type: ignore[arg-type]
    ]  # fmt: skip


def test_one_short_step_seen_by_three_checks_is_one_group_naming_the_manager():
    one = hybrid("one", *short_step(1), *short_step(4))
    two = hybrid("two", *short_step(2))
    (group,) = find_root_causes([one, two])
    assert group.records == 9 and group.checks == {"floor": 3, "agree": 3, "slots": 3}
    assert group.party == "live" and not group.consequence
    # Full attention ran under speculation too and never fell short: the manager is named.
    assert (group.vllm_function, group.vllm_file) == ("SlidingWindowManager", SINGLE_TYPE)
    assert group.miss.startswith("is one position short in every record")
    assert group.sentence().startswith(
        "9 records, 2 scenarios: the live allocator's SlidingWindowManager "
        f"({SINGLE_TYPE}) is one position short"
    )
    assert group.sentence().endswith("[floor, agree, slots]")
    assert group.to_json()["checks"] == {"floor": 3, "agree": 3, "slots": 3}
    assert [s.failures for s in group.scenarios] == [(0, 1, 2, 3, 4, 5), (0, 1, 2)]


def test_one_shape_in_several_managers_is_the_path_they_share():
    # The lookahead forgotten in allocate_slots: both groups fall short alike.
    result = hybrid("both", *short_step(1, group=0), *short_step(1, group=1))
    (group,) = find_root_causes([result])
    assert group.vllm_function == "KVCacheManager.allocate_slots"
    assert group.vllm_file == "vllm/v1/core/kv_cache_manager.py"
    assert [name for name, _ in group.managers] == ["SlidingWindowManager", "FullAttentionManager"]
    assert "dispatching to SlidingWindowManager, FullAttentionManager" in group.sentence()


def test_a_consequence_without_a_shortfall_ranks_below_the_causes():
    lone_slots = Failure("slots", "m", step=9, request="b", group=1, party="live",
                         detail={"party": "live", "role": "target", "whose": "block 3 of request a"})  # fmt: skip
    result = hybrid("mixed", *short_step(1), lone_slots)
    cause, consequence = find_root_causes([result])
    assert cause.check == "floor" and cause.records == 3
    assert consequence.party == "slots" and consequence.consequence
    assert consequence.miss.endswith("into another request's block")


def test_groups_count_records_and_scenarios_largest_first():
    one = failed("one", floor_record("predicted", 4), floor_record("predicted", 4))
    two = failed("two", floor_record("predicted", 4), floor_record("live", 1))
    known = failed("known", floor_record("live", 1))
    known.verdict = Verdict.XFAILED  # known divergences are not grouped
    groups = find_root_causes([one, two, known])
    assert [(g.party, g.records, [s.id for s in g.scenarios]) for g in groups] == [
        ("predicted", 3, ["one", "two"]),
        ("live", 1, ["two"]),
    ]
    first = groups[0]
    assert first.representative.id == "one"
    assert first.group_types == ["full_attention"] and first.methods == ["eagle"]
    assert first.to_json()["vllm_function"] == "_reserved_block_count"
    assert first.to_json()["vllm_file"] == "vllm/v1/worker/gpu/warmup.py"
    assert "look" not in first.why or "lookahead" in first.why  # the floor rule's reason
    assert first.why.startswith("one column per block_size tokens")


def cause(party: str, records: int, consequence: bool = False) -> RootCause:
    return RootCause("floor", party, "m", records=records, consequence=consequence)


def test_a_cause_upstream_ranks_above_the_parties_that_read_it():
    # Largest first by size; the config and the planning feed the allocator and the
    # predictor, the predictor feeds the recorded warmup, the allocator the slot mapping.
    by_size = [
        cause("slots", 40), cause("live", 30), cause("warmup", 20), cause("predicted", 10),
        cause("planner", 3), cause("config", 2),
    ]  # fmt: skip
    ranked = [c.party for c in rank_by_data_flow(by_size)]
    assert ranked.index("config") < min(
        ranked.index(p) for p in ("live", "predicted", "warmup", "slots")
    )
    assert ranked.index("planner") < ranked.index("live")
    assert ranked.index("predicted") < ranked.index("warmup")
    assert ranked.index("live") < ranked.index("slots")
    # Parties that do not read one another keep the order of their size.
    assert ranked.index("live") < ranked.index("predicted")
    assert ranked == ["planner", "config", "live", "slots", "predicted", "warmup"]
    assert [c.party for c in rank_by_data_flow([cause("predicted", 9), cause("live", 3)])] == [
        "predicted",
        "live",
    ]
    assert upstream_of("warmup") == {"predicted", "config"}
    assert "config" in upstream_of("slots") and "slots" not in upstream_of("live")


def test_every_party_reads_only_parties_that_exist():
    for party in PARTIES.values():
        assert set(party.reads) <= set(PARTIES), party.name
        assert party.name not in upstream_of(party.name)


def lookahead_run(scenario_id: str, *failures: Failure, told: int = 1, drafts: int = 2):
    """A failed dflash scenario whose config told the parties ``told`` lookahead slots
    where the drafter writes ``drafts``, over one full-attention group of 16."""
    group = GroupInfo(0, "full_attention", 16, "full_attention", False,
                      floor_args={"max_model_len": 1024})  # fmt: skip
    run = Trajectory(groups=(group,), lookahead=told, lookahead_source="vllm", method="dflash",
                     num_speculative_tokens=1, vllm_lookahead=told, expected_lookahead=drafts,
                     floor_lookahead=drafts)  # fmt: skip
    result = ScenarioResult(scenario_id, f"scenarios/{scenario_id}.yaml", Verdict.FAILED)
    result.failures, result.trajectory = list(failures), run
    return result


def short_lookahead_records(request: str, computed: int, held: int) -> list[Failure]:
    """The lookahead record and one step's floor and agree records for dflash, k=1."""
    numbers: dict[str, object] = {
        "step": 1, "request": request, "group": 0, "floor": 3, "live": held, "predicted": held,
        **written(computed, 1, 2),
    }  # fmt: skip
    return [
        Failure("floor", "m", party="live", **numbers),  # type: ignore[arg-type]
        Failure("floor", "m", party="predicted", **numbers),  # type: ignore[arg-type]
    ]


def test_a_short_lookahead_folds_the_shortfalls_it_explains_and_ranks_first():
    told = Failure("lookahead", "VllmConfig.num_lookahead_tokens is 1", party="config")
    # 30 computed + 1 scheduled + 1 told = 32: two blocks, what the parties hold; the
    # drafter writes position 32 too: the floor is 3.
    explained = short_lookahead_records("a", 30, held=2)
    one = lookahead_run("one", told, *explained)
    # An independent allocator bug elsewhere: more records, a party that reads the config.
    eagle = hybrid("two", *short_step(1), *short_step(2), *short_step(3))
    groups = find_root_causes([eagle, one])
    first = groups[0]
    assert (first.party, first.vllm_function) == ("config", "VllmConfig.num_lookahead_tokens")
    assert first.checks == {"lookahead": 1, "floor": 2} and first.records == 3
    assert [s.id for s in first.scenarios] == ["one"]
    assert first.records < groups[1].records and groups[1].party == "live"
    assert first.why.startswith("every party reserves VllmConfig.num_lookahead_tokens")


def test_a_party_below_even_the_lookahead_it_was_told_is_a_cause_of_its_own():
    told = Failure("lookahead", "VllmConfig.num_lookahead_tokens is 1", party="config")
    # 40 + 1 + 1 = 42 positions need 3 blocks with the told lookahead; holding 2 is the
    # party's own fault, not the config's.
    numbers: dict[str, object] = {
        "step": 2, "request": "b", "group": 0, "floor": 3, "live": 2, "predicted": 3,
        **written(40, 1, 2),
    }  # fmt: skip
    own = Failure("floor", "m", party="live", **numbers)  # type: ignore[arg-type]
    result = lookahead_run("one", told, *short_lookahead_records("a", 30, held=2), own)
    config, live = find_root_causes([result])
    assert config.party == "config" and config.records == 3
    assert live.party == "live" and live.records == 1 and live.scenarios[0].failures == (3,)


def test_a_lookahead_reported_long_folds_nothing():
    more = Failure("lookahead", "VllmConfig.num_lookahead_tokens is 3", party="config")
    result = lookahead_run("one", more, *short_lookahead_records("a", 30, held=2), told=3)
    groups = find_root_causes([result])
    assert {g.party: g.records for g in groups} == {"config": 1, "live": 1, "predicted": 1}
    assert groups[0].party == "config"


def test_a_party_that_did_as_an_upstream_party_told_it_folds_into_that_shortfall():
    # The recorded warmup sizes its blocks with the predictor's count: at the same step,
    # request and group, a warmup holding what the predictor predicted is its consequence.
    predictor = floor_record("predicted", 4, warmup=4)
    warmup = floor_record("warmup", 4, predicted=4, warmup=4)
    (group,) = find_root_causes([failed("s", predictor, warmup)])
    assert group.party == "predicted" and group.checks == {"floor": 2}
    # A warmup below what it was given is a fault of its own, ranked below the predictor's
    # although larger.
    own = [floor_record("warmup", 2, step=step, warmup=2) for step in (1, 2, 3)]
    first, second = find_root_causes([failed("s", predictor, *own)])
    assert (first.party, first.records) == ("predicted", 1)
    assert (second.party, second.records) == ("warmup", 3)


def test_a_granted_call_follows_another_requests_shortfall_before_it():
    granted = Failure("sanity", "m", step=5, request="b", party="live",
                      detail={"invariant": "grants a call the pool cannot hold"})  # fmt: skip
    result = hybrid("granted", *short_step(1), granted)
    (group,) = find_root_causes([result])
    assert group.checks == {"floor": 1, "agree": 1, "slots": 1, "sanity": 1}
    # Alone (no shortfall in its scenario) it stays a group of its own, and a cause: the
    # allocator granting what the pool cannot hold, ranked with the causes.
    (alone,) = find_root_causes([hybrid("alone", granted)])
    assert alone.checks == {"sanity": 1} and not alone.consequence
    # A write of another request's group is no call of the whole request: it does not
    # follow request a's shortfall.
    stray = Failure("slots", "m", step=5, request="b", group=1, party="live",
                    detail={"party": "live", "role": "target", "whose": "block 3 of request a"})  # fmt: skip
    assert len(find_root_causes([hybrid("stray", *short_step(1), stray)])) == 2


EAGLE = """\
name: eagle-full-{prompt}
description: EAGLE with 3 drafts over full attention, drafts partly rejected.
model: {{groups: [full_attention]}}
speculative: {{method: eagle, num_speculative_tokens: 3}}
requests: {{a: {{prompt_len: {prompt}}}, b: {{prompt_len: 17}}}}
steps:
  - {{a: {{prefill: {prompt}}}, b: {{prefill: 17}}}}
  - {{repeat: 6, step: {{a: {{spec: 3, accepted: 1}}, b: {{spec: 3}}}}}}
  - {{a: finish, b: finish}}
"""


@pytest.mark.slow
def test_two_bugs_at_once_give_two_groups_with_the_right_parties(tmp_path, pristine_tree):
    predictor = tree_with_replacement(
        pristine_tree,
        tmp_path / "predictor-bug",
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = min(num_tokens, max_model_len)",
    )
    both = tree_with_replacement(
        predictor,
        tmp_path / "both-bugs",
        "v1/core/kv_cache_manager.py",
        "num_tokens_main_model + num_lookahead_tokens, self.max_model_len",
        "num_tokens_main_model, self.max_model_len",
    )
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    for prompt in (61, 30):
        (scenarios / f"eagle-{prompt}.yaml").write_text(EAGLE.format(prompt=prompt))
    out = tmp_path / "report"
    proc = run_kvconform(
        "run",
        scenarios,
        "--vllm-src",
        both,
        "--report-dir",
        out,
        "--progress",
        "off",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    records = sum(len(s["failures"]) for s in report["scenarios"])
    groups = report["root_causes"]
    # Every record in one of two causes, one per party, both the lookahead forgotten (where
    # a party's records never leave more than one position uncovered, the shape says
    # that they cannot tell it from one slot too few).
    assert sorted((g["party"], g["check"]) for g in groups) == [
        ("live", "floor"),
        ("predicted", "floor"),
    ]
    for group in groups:
        assert "the whole lookahead" in group["miss"], group["miss"]
    assert sum(g["records"] for g in groups) == records
    by_party = {g["party"]: g for g in groups}
    # Full attention only: nothing tells the path from the manager; the path is named.
    assert by_party["live"]["vllm_function"] == "KVCacheManager.allocate_slots"
    assert by_party["live"]["vllm_managers"] == [
        {"class": "FullAttentionManager", "file": SINGLE_TYPE}
    ]
    assert by_party["predicted"]["vllm_file"] == "vllm/v1/worker/gpu/warmup.py"
    for group in groups:
        assert group["scenarios"] and set(group["scenarios"]) <= {"eagle-full-30", "eagle-full-61"}
    # The console's closing lines and summary.md's first screen say the same.
    assert "in 2 root-cause groups, upstream causes first, then the largest:" in proc.stdout
    assert "the live allocator KVCacheManager.allocate_slots" in proc.stdout
    # Each group's representative, as explain takes it: FILE::ID, against the same tree.
    assert re.search(
        rf"kvconform explain \S+\.yaml::eagle-full-\d+ --vllm-src {re.escape(str(both))}",
        proc.stdout,
    ), proc.stdout
    summary = (out / "summary.md").read_text()
    first_screen = summary.split("## Failing scenarios")[0]
    assert "2 root-cause groups" in first_screen and "`_reserved_block_count`" in first_screen


# The sliding-window manager reserves one slot too few under speculation: it sizes its
# blocks for one token less whenever the call carries lookahead tokens.
SWA_OLD = """class SlidingWindowManager(SingleTypeKVCacheManager):
    def __init__(self, kv_cache_spec: SlidingWindowSpec, **kwargs) -> None:
"""
SWA_NEW = """class SlidingWindowManager(SingleTypeKVCacheManager):
    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        if num_tokens > num_tokens_main_model:  # injected: one slot too few
            num_tokens -= 1
        return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)

    def __init__(self, kv_cache_spec: SlidingWindowSpec, **kwargs) -> None:
"""
HYBRID = """\
name: swa-eagle-{prompt}
description: EAGLE over a sliding window and full attention; the prefill ends one position into a block.
model:
  block_size: 16
  max_model_len: 1024
  num_blocks: 64
  groups: [{{type: sliding_window, sliding_window: 32}}, full_attention]
speculative: {{method: eagle, num_speculative_tokens: 3}}
requests: {{a: {{prompt_len: {prompt}}}}}
steps:
  - {{a: {{prefill: {prompt}}}}}
  - {{repeat: 8, step: {{a: {{spec: 3, accepted: 1}}}}}}
  - {{a: finish}}
"""


def _swa_run(tmp_path, tree, name):
    scenarios = tmp_path / "scenarios"
    if not scenarios.exists():
        scenarios.mkdir()
        for prompt in (62, 45):
            (scenarios / f"swa-{prompt}.yaml").write_text(HYBRID.format(prompt=prompt))
    out = tmp_path / name
    proc = run_kvconform(
        "run", scenarios, "--checks", "all", "--vllm-src", tree, "--report-dir", out, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_one_injected_manager_bug_is_one_group_naming_the_manager(tmp_path, pristine_tree):
    swa = tree_with_replacement(
        pristine_tree, tmp_path / "swa-bug", "v1/core/single_type_kv_cache_manager.py",
        SWA_OLD, SWA_NEW,
    )  # fmt: skip
    proc, report = _swa_run(tmp_path, swa, "swa")
    records = sum(len(s["failures"]) for s in report["scenarios"])
    (group,) = report["root_causes"]
    assert group["records"] == records
    assert set(group["checks"]) >= {"floor", "agree", "slots"}, group["checks"]
    assert (group["vllm_function"], group["vllm_file"]) == ("SlidingWindowManager", SINGLE_TYPE)
    assert group["group_types"] == ["sliding_window"]
    assert group["miss"] == (
        "is one position short in every record: the last position the drafter writes has no block"
    )
    assert "in 1 root-cause group:" in proc.stdout
    assert f"the live allocator's SlidingWindowManager ({SINGLE_TYPE})" in proc.stdout

    # A second, independent bug (the warmup predictor forgets the lookahead): two groups.
    both = tree_with_replacement(
        swa, tmp_path / "swa-and-predictor", "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = min(num_tokens, max_model_len)",
    )  # fmt: skip
    _, report = _swa_run(tmp_path, both, "both")
    groups = {g["vllm_function"]: g for g in report["root_causes"]}
    assert sorted(groups) == ["SlidingWindowManager", "_reserved_block_count"], groups
    assert groups["_reserved_block_count"]["miss"].startswith("is short the whole lookahead")
    assert groups["SlidingWindowManager"]["miss"].startswith("is one position short")


# -- the ranking on bugs injected into copies of vLLM's tree ----------------------------

# DFlash's config reports k lookahead slots; its drafter writes k + 1 (a bonus query).
DFLASH_CONFIG = (
    "v1/worker/gpu/spec_decode/dflash/config.py",
    "        return self.num_speculative_tokens + 1\n",
    "        return self.num_speculative_tokens  # injected: the bonus query forgotten\n",
)
ALLOCATOR_WITHOUT_LOOKAHEAD = (
    "v1/core/kv_cache_manager.py",
    "num_tokens_main_model + num_lookahead_tokens, self.max_model_len",
    "num_tokens_main_model, self.max_model_len",
)
PREDICTOR_WITHOUT_LOOKAHEAD = (
    "v1/worker/gpu/warmup.py",
    "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
    "num_tokens = min(num_tokens, max_model_len)",
)
SCHEDULER_RUNNING_WITHOUT_LOOKAHEAD = (
    "v1/core/sched/scheduler.py",
    "                        num_lookahead_tokens=self.num_lookahead_tokens,\n"
    "                    )",
    "                        num_lookahead_tokens=0,\n                    )",
)
DFLASH = """\
name: dflash-{prompt}
description: DFlash with 2 drafts over full attention; its lookahead is k + 1.
model: {{block_size: 16, max_model_len: 1024, num_blocks: 64, groups: [full_attention]}}
speculative: {{method: dflash, num_speculative_tokens: 2}}
requests: {{a: {{prompt_len: {prompt}}}}}
steps:
  - {{a: {{prefill: {prompt}}}}}
  - {{repeat: 8, step: {{a: {{spec: 2, accepted: 1}}}}}}
  - {{a: finish}}
"""


def _tree(pristine, root, *bugs):
    tree = pristine
    for number, (module, old, new) in enumerate(bugs):
        tree = tree_with_replacement(tree, root / f"bug{number}", module, old, new)
    return tree


def _ranked(tmp_path, tree, *paths, selection=()):
    out = tmp_path / "report"
    proc = run_kvconform(
        "run", *paths, *selection, "--vllm-src", tree, "--report-dir", out, "--progress", "off",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    records = sum(len(s["failures"]) for s in report["scenarios"] if s["verdict"] == "failed")
    assert sum(g["records"] for g in report["root_causes"]) == records
    return proc, report["root_causes"]


@pytest.mark.slow
def test_a_short_config_lookahead_ranks_above_a_larger_allocator_bug(tmp_path, pristine_tree):
    """DFlash's lookahead reported k, and allocate_slots forgetting the lookahead: the
    allocator's group is larger, the config's comes first, and the predictor's DFlash
    shortfalls (it reserved what the config said) are in the config's group."""
    tree = _tree(pristine_tree, tmp_path, DFLASH_CONFIG, ALLOCATOR_WITHOUT_LOOKAHEAD)
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    for prompt in (29, 30, 45, 61, 62):
        (scenarios / f"eagle-{prompt}.yaml").write_text(EAGLE.format(prompt=prompt))
    (scenarios / "dflash.yaml").write_text(DFLASH.format(prompt=29))
    proc, groups = _ranked(tmp_path, tree, scenarios)
    first, second = groups
    assert (first["party"], first["vllm_function"]) == ("config", "VllmConfig.num_lookahead_tokens")
    assert first["scenarios"] == ["dflash-29"] and set(first["checks"]) >= {"lookahead", "floor"}
    assert (second["party"], second["vllm_function"]) == ("live", "KVCacheManager.allocate_slots")
    assert second["records"] > first["records"]
    assert "1. " in proc.stdout and "VllmConfig.num_lookahead_tokens" in proc.stdout.split("1. ")[1]


@pytest.mark.slow
def test_a_short_config_lookahead_ranks_above_a_scheduler_bug(tmp_path, pristine_tree):
    tree = _tree(pristine_tree, tmp_path, DFLASH_CONFIG, SCHEDULER_RUNNING_WITHOUT_LOOKAHEAD)
    scheduler = REPO / "scenarios" / "scheduler"
    _, groups = _ranked(
        tmp_path, tree, scheduler / "sched-dflash-dspark.yaml", scheduler / "sched-eagle-family.yaml",
        selection=("-k", "dflash-sync or eagle-k3-sync"),
    )  # fmt: skip
    assert groups[0]["party"] == "config", groups
    assert groups[0]["vllm_function"] == "VllmConfig.num_lookahead_tokens"
    parties = [g["party"] for g in groups]
    assert "scheduler" in parties and parties.count("config") == 1
    scheduler_records = sum(g["records"] for g in groups if g["party"] == "scheduler")
    assert scheduler_records > groups[0]["records"]


@pytest.mark.slow
def test_a_predictor_bug_takes_in_the_recorded_warmup_that_read_it(tmp_path, pristine_tree):
    """The recorded warmup sizes its blocks with the predictor's count: a predictor that
    forgets the lookahead is one cause, its group first, the warmup's shortfalls in it."""
    tree = _tree(pristine_tree, tmp_path, PREDICTOR_WITHOUT_LOOKAHEAD)
    warmup = REPO / "scenarios" / "warmup" / "warmup-eagle-family.yaml"
    _, groups = _ranked(tmp_path, tree, warmup, selection=("-k", "eagle-k5-bs16"))
    first = groups[0]
    assert (first["party"], first["vllm_function"]) == ("predicted", "_reserved_block_count")
    assert "warmup" not in [g["party"] for g in groups], groups
    assert "the whole lookahead" in first["miss"], first["miss"]
