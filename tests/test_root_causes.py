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

import pytest
from vllm_copy import run_kvconform, tree_with_replacement

from kvconform.harness.root_causes import blame, find_root_causes
from kvconform.model.observations import GroupInfo, Trajectory
from kvconform.model.results import Failure, ScenarioResult, Verdict


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
    return Failure("floor", "m", step=1, request="a", group=0, floor=floor, party=party, **values)


def test_the_shape_of_a_shortfall_comes_from_the_records_numbers():
    result = failed("s")
    assert blame(result, floor_record("predicted", 4)) == (
        "predicted",
        "is below the floor by exactly the lookahead",
    )
    at_cap = floor_record("live", 4, floor_without_lookahead=3, capped=True)
    assert blame(result, at_cap) == (
        "live",
        "is below the floor by one block at the max_model_len cap",
    )
    dcp = floor_record("live", 3, floor=6, floor_without_lookahead=5, dcp=2)
    assert blame(result, dcp) == ("live", "is below the floor by the DCP factor")
    assert blame(result, floor_record("warmup", 1, warmup=1)) == (
        "warmup",
        "is below the floor by several blocks",
    )
    # In scheduler and engine mode the live side is vLLM's scheduler, or its engine.
    assert blame(failed("t", kind="scheduler"), floor_record("live", 4))[0] == "scheduler"
    assert blame(failed("e", kind="engine"), floor_record("live", 4))[0] == "engine"


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

    assert blame(result, agree(5, 4)) == (
        "predicted",
        "predicts fewer than the live allocator holds, below the floor by exactly the lookahead",
    )
    assert blame(result, agree(4, 5)) == (
        "live",
        "holds fewer than the warmup predictor predicts, below the floor by exactly the lookahead",
    )
    assert blame(result, agree(7, 6)) == (
        "live",
        "holds more than the warmup predictor by one block",
    )
    assert blame(result, agree(6, 7, capped=True)) == (
        "predicted",
        "predicts more than the live allocator holds by one block at the max_model_len cap",
    )


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
    # Every record in one of two causes, one per party, both the lookahead forgotten.
    assert sorted((g["party"], g["check"], g["miss"]) for g in groups) == [
        ("live", "floor", "is below the floor by exactly the lookahead"),
        ("predicted", "floor", "is below the floor by exactly the lookahead"),
    ]
    assert sum(g["records"] for g in groups) == records
    by_party = {g["party"]: g for g in groups}
    assert by_party["live"]["vllm_function"] == "KVCacheManager.allocate_slots"
    assert by_party["predicted"]["vllm_file"] == "vllm/v1/worker/gpu/warmup.py"
    for group in groups:
        assert group["scenarios"] and set(group["scenarios"]) <= {"eagle-full-30", "eagle-full-61"}
    # The console's closing lines and summary.md's first screen say the same.
    assert "in 2 root-cause groups, largest first:" in proc.stdout
    assert "the live allocator KVCacheManager.allocate_slots" in proc.stdout
    assert f"yaml --vllm-src {both}" in proc.stdout and "kvconform explain " in proc.stdout
    summary = (out / "summary.md").read_text()
    first_screen = summary.split("## Failing scenarios")[0]
    assert "2 root-cause groups" in first_screen and "`_reserved_block_count`" in first_screen
