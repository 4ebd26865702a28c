"""The fuzzer's strategies, documents and signatures, without vLLM.

Every drawn document must load through the real loader (the strategies promise
legal trajectories), ``legal_advance`` must offer exactly the moves the loader's
token arithmetic accepts, and the rendering must survive the YAML round trip.
"""

from __future__ import annotations

from dataclasses import replace
from math import lcm

import pytest
from hypothesis import given, settings

from kvconform.errors import Location, ScenarioError
from kvconform.fuzz.document import flow, render, with_header
from kvconform.fuzz.findings import Signature, first_message, signatures
from kvconform.fuzz.space import FuzzSpace, probe_document
from kvconform.fuzz.strategies import (
    legal_advance,
    scenario_documents,
)
from kvconform.harness.loader import load_text
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import expected_lookahead
from kvconform.model.observations import GroupInfo, Trajectory
from kvconform.model.results import ErrorKind, Failure, ScenarioResult, Verdict
from kvconform.model.scenario import Action
from kvconform.model.tokens import RequestTokens

METHODS = {
    "eagle": ("eagle",),
    "mtp": ("mtp", "deepseek_mtp"),
    "dflash": ("dflash",),
    "dspark": ("dspark",),
    "ngram": ("ngram",),
}
SPACE = FuzzSpace(
    group_types=tuple(name for name, t in GROUP_TYPES.items() if t.fuzzed),
    methods=METHODS,
    offered_choices={("mamba", "mamba_cache_mode"): ("none", "align", "all")},
    lookaheads={
        (m, k, anchor): int(expected_lookahead(m, k, anchor) or 0)
        for m in METHODS
        for k in range(1, 6)
        for anchor in (True, False)
    },
)
QUICK = settings(max_examples=150, derandomize=True, database=None, deadline=None)


def test_every_group_type_is_fuzzed_and_has_a_probe() -> None:
    # A group type added to the vocabulary without fuzz support would silently
    # drop out of the search (it is listed as "not fuzzed", but nobody reads that).
    # HiSparse's groups are one layout of four, never a group the fuzzer draws alone.
    assert all(t.fuzzed != t.hisparse for t in GROUP_TYPES.values())
    for type_name, group_type in GROUP_TYPES.items():
        if group_type.hisparse:
            continue
        required = {n for n, o in group_type.options.items() if o.required}
        assert required <= set(group_type.probe_options()), type_name
        assert required <= {n for n, o in group_type.options.items() if o.draw}, type_name
        (scenario,) = load_text(render(probe_document(type_name, "eagle")), "probe.yaml")
        assert [g.type for g in scenario.model.groups] == [type_name]
        assert {c.action for s in scenario.steps for c in s.calls} == set(Action)


@QUICK
@given(scenario_documents(SPACE))
def test_drawn_documents_load_through_the_real_loader(doc: dict) -> None:
    (scenario,) = load_text(render(doc), "drawn.yaml")  # raises on an illegal step
    model = scenario.model
    assert 1 <= len(model.groups) <= SPACE.max_groups
    assert {g.type for g in model.groups} <= set(SPACE.group_types)
    assert model.scheduler_block_size == lcm(*(g.block_size for g in model.groups))
    assert 2 <= model.max_model_len
    assert all(r.prompt_len < model.max_model_len for r in scenario.requests.values())
    assert model.num_blocks >= 2
    if scenario.speculative is not None:
        assert 1 <= scenario.speculative.num_speculative_tokens <= SPACE.max_speculative_tokens
    assert scenario.steps and all(step.calls for step in scenario.steps)


@QUICK
@given(scenario_documents(SPACE))
def test_legal_advance_offers_exactly_what_the_loader_accepts(doc: dict) -> None:
    (scenario,) = load_text(render(doc), "drawn.yaml")
    mml = scenario.model.max_model_len
    k = scenario.speculative.num_speculative_tokens if scenario.speculative else None
    states = {name: RequestTokens(spec) for name, spec in scenario.requests.items()}

    def accepts(state: RequestTokens, action: Action, count: int = 0) -> bool:
        try:
            replace(state).apply(
                action, Location("x"), count=count, max_model_len=mml, num_speculative_tokens=k
            )
        except ScenarioError:
            return False
        return True

    for step in scenario.steps:
        for call in step.calls:
            state = states[call.request]
            advance = legal_advance(state, mml, k)
            if advance.prefill:
                assert accepts(state, Action.PREFILL, advance.prefill)
            assert not accepts(state, Action.PREFILL, advance.prefill + 1)
            assert accepts(state, Action.DECODE) is advance.decode
            if advance.spec:
                assert accepts(state, Action.SPEC, advance.spec)
            if k:
                assert not accepts(state, Action.SPEC, advance.spec + 1)
            count = call.scheduled - (1 if call.action is Action.SPEC else 0)
            state.apply(
                call.action,
                Location("x"),
                count=count,
                accepted=count - call.rejected,
                max_model_len=mml,
                num_speculative_tokens=k,
            )


def test_documents_reach_the_edge_and_use_every_action() -> None:
    seen: dict[str, int] = {"edge": 0, "preempt": 0, "spec": 0, "partial": 0, "chunked": 0}
    docs: list[dict] = []

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(scenario_documents(SPACE))
    def collect(doc: dict) -> None:
        docs.append(doc)

    collect()
    for doc in docs:
        (scenario,) = load_text(render(doc), "drawn.yaml")
        calls = [c for s in scenario.steps for c in s.calls]
        mml = scenario.model.max_model_len
        seen["edge"] += any(c.computed + c.scheduled + 6 > mml for c in calls if c.allocates)
        seen["preempt"] += any(c.action is Action.PREEMPT for c in calls)
        seen["spec"] += any(c.action is Action.SPEC for c in calls)
        seen["partial"] += any(c.rejected for c in calls)
        seen["chunked"] += any(c.action is Action.PREFILL and not c.sampled for c in calls)
    # Every kind of move shows up in a good share of the examples, not once in a while.
    for kind, count in seen.items():
        assert count >= len(docs) // 10, (kind, count, len(docs))


def test_flow_quotes_what_yaml_would_misread() -> None:
    assert flow({"a": {"prefill": 3}, "b": "decode"}) == "{a: {prefill: 3}, b: decode}"
    assert flow("yes") == '"yes"' and flow("no") == '"no"' and flow("a b") == '"a b"'
    assert flow(False) == "false" and flow([1, 2]) == "[1, 2]"
    # A float is an acceptance rate of the explorer's workloads ({rate: 0.5, seed: 1}).
    assert flow({"rate": 0.5, "seed": 1}) == "{rate: 0.5, seed: 1}"
    with pytest.raises(TypeError):
        flow(object())


def test_render_round_trips_and_header_is_comments_only() -> None:
    doc = probe_document("sliding_window", "dspark")
    doc["speculative"]["sample_from_anchor"] = False
    text = with_header(render(doc), ["finding 1", "", "reproduce: kvconform run x.yaml"])
    assert text.startswith("# finding 1\n#\n# reproduce")
    (scenario,) = load_text(text, "x.yaml")
    assert scenario.speculative is not None and scenario.speculative.sample_from_anchor is False
    assert scenario.model.groups[0].options["sliding_window"] == 32
    assert len(scenario.steps) == len(doc["steps"])


def _trajectory(*types: str, mamba_mode: str = "none") -> Trajectory:
    groups = tuple(
        GroupInfo(i, t, 16, t, False, {"mamba_cache_mode": mamba_mode}) for i, t in enumerate(types)
    )
    return Trajectory(groups, 2, "test")


def _failure(
    check: str, message: str, group: int | None = 0, party: str | None = None, **numbers: int
) -> Failure:
    return Failure(check, message, step=0, request="a", group=group, party=party, **numbers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("failure", "types", "expected"),
    [
        (
            _failure("floor", "step 0 ...: the warmup predictor holds 1", party="predicted"),
            ("sliding_window",),
            Signature("floor", "predicted", "token-indexed"),
        ),
        (
            _failure("floor", "step 0 ...: the live KVCacheManager holds 1 block", party="live"),
            ("mamba",),
            Signature("floor", "live", "MambaSpec"),
        ),
        (
            _failure("agree", "live holds 3 but predicts 2", live=3, predicted=2),
            ("mamba",),
            Signature("agree", "mamba-state", "live above"),
        ),
        (
            _failure("sanity", "blocks leaked", group=None),
            ("full_attention",),
            Signature("sanity", "-"),
        ),
        (
            # A failure that names its invariant: one signature per rule broken.
            replace(
                _failure("sanity", "step 1 ... frees a block ..."),
                detail={"invariant": "frees a block the attention still reads"},
            ),
            ("sliding_window",),
            Signature("sanity", "SlidingWindowSpec", "frees a block the attention still reads"),
        ),
        (
            _failure("lookahead", "... for method 'dflash' with k=3 ...", group=None),
            ("full_attention",),
            Signature("lookahead", "dflash"),
        ),
    ],
)
def test_signatures_are_coarse_where_one_root_cause_shows_many_times(
    failure: Failure, types: tuple[str, ...], expected: Signature
) -> None:
    spec_type = {"mamba": "MambaSpec", "sliding_window": "SlidingWindowSpec"}.get(
        types[0], "FullAttentionSpec"
    )
    failure = replace(failure, spec_type=spec_type if failure.group is not None else None)
    result = ScenarioResult("x", "x.yaml", Verdict.FAILED, failures=[failure])
    result.trajectory = _trajectory(*types)
    # The lookahead check's signature is the scenario's method.
    result.trajectory.method = "dflash" if failure.check == "lookahead" else None
    assert signatures(result) == [expected]
    assert first_message(result, expected) == failure.message


def test_crash_signature_names_type_and_frame_not_the_message() -> None:
    def crash(text: str) -> ScenarioResult:
        return ScenarioResult("x", "x.yaml", Verdict.ERROR, error_kind=ErrorKind.CRASH, error=text)

    one = crash("vLLM 0.33.0 raised AssertionError: 3 <= 2 at vllm/v1/core/a.py:10 in f")
    two = crash("vLLM 0.33.0 raised AssertionError: 9 <= 4 at vllm/v1/core/a.py:10 in f")
    assert (
        signatures(one)
        == signatures(two)
        == [Signature("crash", "AssertionError", "vllm/v1/core/a.py:10 f")]
    )
    assert signatures(one)[0].slug == "crash-assertionerror-vllm-v1-core-a-py-10-f"


AIMED = replace(SPACE, aimed_types=("mamba",))


@QUICK
@given(scenario_documents(AIMED))
def test_an_aimed_space_draws_every_first_group_of_an_aimed_type(doc: dict) -> None:
    # The mutation campaign's fuzz audit aims at one function: every example must carry
    # a group that reaches it, or most of the 20,000 examples never call the mutant.
    (scenario,) = load_text(render(doc), "drawn.yaml")
    assert scenario.model.groups[0].type == "mamba"
    assert {g.type for g in scenario.model.groups} <= set(AIMED.group_types)


def test_an_aimed_space_still_draws_hybrid_layouts() -> None:
    # Only the first group is aimed: the others come from the whole space, so a bug in
    # how an aimed type meets another group type stays findable.
    docs: list[dict] = []

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(scenario_documents(AIMED))
    def collect(doc: dict) -> None:
        docs.append(doc)

    collect()
    others = {
        g.type for doc in docs for g in load_text(render(doc), "drawn.yaml")[0].model.groups[1:]
    }
    assert others - {"mamba"}, "no group after the first was ever of another type"
