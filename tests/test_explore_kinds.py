"""The explorer's startup and warmup documents and the methods' declared options, without vLLM.

Each example first draws its kind where the space offers more than the scheduler's
(docs/explore.md, "Kinds"). Every drawn startup and warmup document must load through the
real loader as a scenario of its kind (the strategies promise legal documents) and state
nothing derived by hand (``expect``, ``expect_max_model_len``, ``expect_passes``); a startup
document's memory lies within two blocks of one ``max_model_len`` request's floor, counted
by the floor rules the ``startup`` check applies; the options a method's registry entry
declares (``Method.options``) are drawn both ways and only where they are legal; a space
that offers the scheduler's kind alone draws what it drew before kinds were drawn; and the
search shrinks a failure within its kind.
"""

from __future__ import annotations

from collections import Counter
from random import Random
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from kvconform.explore.runner import ExploreStats, Workloads
from kvconform.explore.space import ExploreSpace
from kvconform.explore.strategies import (
    KIND_SHARES,
    draw_kind,
    startup_document,
    warmup_document,
    workload,
    workloads,
)
from kvconform.fuzz.document import render
from kvconform.harness.loader import load_text
from kvconform.harness.loader.scheduler import SCHEDULER_GROUP_TYPES
from kvconform.harness.loader.startup import STARTUP_GROUP_TYPES
from kvconform.model.kinds import Kind
from kvconform.model.methods import METHODS
from kvconform.model.results import ScenarioResult, Verdict

METHOD_NAMES = ("dflash", "draft_model", "dspark", "eagle", "mtp", "ngram")
SPACE = ExploreSpace(
    group_types=SCHEDULER_GROUP_TYPES,
    methods=METHOD_NAMES,
    adaptive_threshold=True,
    spec_decode_metrics=True,
    flag_options=(("sliding_window_mla", "bounded_replay"),),
    startup_types=STARTUP_GROUP_TYPES,
    warmup=True,
)
SCHEDULER_ONLY = ExploreSpace(group_types=SCHEDULER_GROUP_TYPES, methods=METHOD_NAMES)
QUICK = settings(max_examples=300, derandomize=True, database=None, deadline=None)

# Fields whose value a person derives by hand: never drawn (docs/explore.md).
BY_HAND = ("expect", "expect_max_model_len", "expect_passes")


def _startup(data: st.DataObject) -> dict[str, Any]:
    return startup_document(data.draw, SPACE, "explore")


def _warmup(data: st.DataObject) -> dict[str, Any]:
    return warmup_document(data.draw, SPACE, "explore")


@QUICK
@given(st.data())
def test_every_drawn_startup_document_loads_as_a_startup_scenario(data: st.DataObject) -> None:
    doc = _startup(data)
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == Kind.STARTUP
    assert not [field for field in BY_HAND if field in doc["startup"]]
    spec = scenario.startup
    assert spec is not None and spec.expect is None and spec.expect_max_model_len is None


@QUICK
@given(st.data())
def test_a_startup_document_lies_at_the_edge_of_one_request(data: st.DataObject) -> None:
    """The memory (or the override) is the null block plus the floor of one max_model_len
    request, the startup check's own count, give or take two blocks."""
    doc = _startup(data)
    (scenario,) = load_text(render(doc), "<explore>")
    model = scenario.model
    # The startup check's floor (kvconform/harness/checks/startup.py), by hand: a token
    # column per block of max_model_len for attention, the running state plus its
    # speculative blocks for Mamba in mode none.
    need = [
        1 + int(g.options.get("num_speculative_blocks") or 0)
        if g.type == "mamba"
        else -(-model.max_model_len // model.block_size)
        for g in model.groups
    ]
    edge = 1 + sum(need)
    startup = doc["startup"]
    near = startup.get("num_gpu_blocks_override", startup["available_blocks"])
    assert abs(near - edge) <= 2 or near == 1, (near, edge, doc)
    groups = scenario.model.groups
    if len(groups) > 1:  # a hybrid vLLM keeps apart: attention beside a recurrent state
        kinds = sorted(g.type for g in groups)
        assert len(groups) == 2 and "mamba" in kinds and kinds != ["mamba", "mamba"], kinds


@QUICK
@given(st.data())
def test_every_drawn_warmup_document_loads_as_a_warmup_scenario(data: st.DataObject) -> None:
    doc = _warmup(data)
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == Kind.WARMUP
    assert not [field for field in BY_HAND if field in doc["warmup"]]
    assert {g.type for g in scenario.model.groups} <= set(SPACE.group_types)
    # The mixed step as vLLM's callers make it (mixed_batch_attention_warmup caps num_tokens
    # at the budget and max_model_len): a longer one made 0.33.0's warmup, which does not
    # split its prefill, over-reserve and crash in the explorer, a call no engine makes.
    limit = min(scenario.warmup.max_num_batched_tokens, scenario.model.max_model_len)
    assert 1 <= scenario.warmup.mixed_num_tokens <= limit, (doc["warmup"], limit)


def test_the_kinds_are_drawn_in_their_shares() -> None:
    # Each ticket of the kind's draw, once: exactly the shares of KIND_SHARES.
    total = sum(share for _, share in KIND_SHARES)
    by_ticket = Counter(draw_kind(lambda _strategy, t=t: t, SPACE) for t in range(total))
    assert by_ticket == Counter({kind: share for kind, share in KIND_SHARES}), by_ticket
    # And Hypothesis's own draws (not uniform: it favours small tickets) give every kind,
    # the scheduler's most of all.
    counts: Counter[str] = Counter()

    @settings(max_examples=1000, derandomize=True, database=None, deadline=None)
    @given(workloads(SPACE))
    def draw(doc: dict[str, Any]) -> None:
        counts[doc["kind"]] += 1

    draw()
    drawn = sum(counts.values())
    assert counts[Kind.SCHEDULER] > drawn / 2, counts
    for kind, share in KIND_SHARES:
        assert counts[kind] >= drawn * share / total / 4, counts


@QUICK
@given(workloads(SCHEDULER_ONLY))
def test_a_space_of_the_scheduler_alone_draws_only_scheduler_workloads(
    doc: dict[str, Any],
) -> None:
    assert doc["kind"] == Kind.SCHEDULER


def test_a_space_of_the_scheduler_alone_draws_what_it_drew_before_kinds() -> None:
    """No kind is drawn where only the scheduler's is offered: the same draws make the
    same workload as the feature stage and the workload stage alone."""
    from kvconform.explore.strategies import feature_sets

    def before(draw: Any) -> dict[str, Any]:
        return workload(draw, SCHEDULER_ONLY, draw(feature_sets()), "explore")

    for seed in range(5):
        shown = [
            find(
                strategy,
                lambda doc: True,
                settings=settings(database=None, deadline=None),
                random=Random(seed),
            )
            for strategy in (workloads(SCHEDULER_ONLY), st.composite(before)())
        ]
        assert shown[0] == shown[1]


def test_the_declared_method_options_are_drawn_both_ways_and_legal() -> None:
    """DSpark's fill-in layout and MTP's stacked modules (``Method.options``) appear in drawn
    scheduler and warmup documents, and every such document loads."""
    declared = {(o.section, o.name) for m in METHODS.values() for o in m.options}
    assert ("speculative", "sample_from_anchor") in declared
    assert ("scheduler", "num_nextn_predict_layers") in declared
    seen: Counter[str] = Counter()

    def draw(doc: dict[str, Any]) -> bool:
        speculative = doc.get("speculative", {})
        if "sample_from_anchor" in speculative or "num_nextn_predict_layers" in doc.get(
            "scheduler", {}
        ):
            load_text(render(doc), "<explore>")  # the others: the tests above
        if speculative.get("sample_from_anchor") is False:
            assert speculative["method"] == "dspark"
            seen[f"fill-in {doc['kind']}"] += 1
        if speculative.get("method") == "dspark" and "sample_from_anchor" not in speculative:
            seen["anchor"] += 1
        layers = doc.get("scheduler", {}).get("num_nextn_predict_layers")
        if layers is not None:
            assert speculative["method"] == "mtp" and layers > 1
            assert speculative["num_speculative_tokens"] % layers == 0
            seen["mtp modules"] += 1
        if doc["kind"] == Kind.WARMUP:
            assert "num_nextn_predict_layers" not in render(doc)  # a scheduler setting
        return False

    # A seeded search (the explorer's own way of drawing), not @given: the same documents
    # whatever ran before in the session.
    with pytest.raises(NoSuchExample):
        find(
            workloads(SPACE),
            draw,
            settings=settings(
                max_examples=3000, database=None, deadline=None, phases=[Phase.generate]
            ),
            random=Random(0),
        )
    assert seen["fill-in scheduler"] and seen["anchor"], seen
    assert seen["mtp modules"], seen
    # A warmup document is one example in ten: look for its fill-in layout directly.
    fill_in = find(
        st.composite(lambda draw: warmup_document(draw, SPACE, "explore"))(),
        lambda doc: doc.get("speculative", {}).get("sample_from_anchor") is False,
        # About one document in 40 (DSpark, then its option off): room for the seed to find it.
        settings=settings(
            max_examples=2000, database=None, deadline=None, phases=[Phase.generate]
        ),
        random=Random(0),
    )
    (scenario,) = load_text(render(fill_in), "<explore>")
    assert scenario.speculative is not None and not scenario.speculative.sample_from_anchor


def test_statistics_count_kinds_and_tolerate_documents_without_steps() -> None:
    """runner.py's measurements: a startup or warmup document has no scheduler, features or
    steps; it is counted by kind (and a startup pool vLLM accepted), nothing else."""
    stats = ExploreStats(seed=0, budget=1)
    source = Workloads(SPACE, stats)
    startup = {"name": "x", "kind": "startup", "model": {}, "startup": {}}
    warmup = {"name": "x", "kind": "warmup", "model": {}, "warmup": {}}
    result = ScenarioResult("x", "x", Verdict.PASSED)
    source.measure(result, startup)
    source.measure(result, warmup)
    assert stats.kinds == Counter({"startup": 1, "warmup": 1})
    assert stats.scheduler_steps == 0 and not stats.modes and not stats.features
    stats.examples = 2
    lines = "\n".join(stats.summary_lines())
    assert "kinds: startup 50.0%, warmup 50.0% (startup pools accepted: 0 of 1)" in lines
    assert stats.to_json()["kinds"] == {"startup": 1, "warmup": 1}


def test_a_failure_shrinks_within_its_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search loop counts a shrink candidate only where it is of the kind of the example
    that first failed. A stand-in run fails only scheduler documents (n >= 3) until the first
    failure, then every document the same way: without the guard the shrinker would go on
    to the smaller startup documents (n < 3); with it, the finding is the smallest scheduler
    document."""
    from kvconform.fuzz import search as search_module
    from kvconform.fuzz.search import Budget, SearchStats, search
    from kvconform.model.results import ErrorKind

    failing = {"on": False}

    def doc_of(n: int) -> dict[str, Any]:
        return {"name": "explore", "kind": "scheduler" if n >= 3 else "startup", "n": n}

    def run(doc: dict[str, Any], vllm: Any, file: str = "") -> ScenarioResult:
        if doc["n"] >= 3 or failing["on"]:
            failing["on"] = True
            return ScenarioResult(
                "x", file, Verdict.ERROR, error_kind=ErrorKind.CRASH,
                error="vLLM raised AssertionError at vllm/x.py:1 in f",
            )  # fmt: skip
        return ScenarioResult("x", file, Verdict.PASSED)

    class Source:
        name = "explore"

        def documents(self) -> st.SearchStrategy[dict[str, Any]]:
            return st.integers(0, 9).map(doc_of)

        def measure(self, result: Any, doc: dict[str, Any]) -> None:
            pass

    monkeypatch.setattr(search_module, "run_document", run)
    stats = SearchStats(seed=0, budget=50)
    search(Source(), None, stats, Budget(examples=50), max_findings=1)  # type: ignore[arg-type]
    (finding,) = stats.findings
    assert "kind: scheduler" in finding.text and "n: 3" in finding.text, finding.text
