"""The explorer's strategies and command-line checks, without vLLM.

Every drawn workload must load through the real loader as a scheduler scenario
(the strategies promise legal documents); the swarm's first stage must decide
what the workload holds (a feature that is off leaves no trace in the
document; every feature is drawn both ways); the same seed must draw the same
workloads; and ``kvconform explore``'s argument checks must refuse bad values
with exit 2 before vLLM is loaded.
"""

from __future__ import annotations

from random import Random
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from kvconform.explore.requests import FOLLOW_UP_SLACK, finish_bound, follow_ups
from kvconform.explore.runner import _features_of
from kvconform.explore.space import ExploreSpace, runs_without_caching
from kvconform.explore.strategies import (
    FEATURES,
    LATE_FEATURES,
    feature_sets,
    workload,
    workloads,
)
from kvconform.fronts.cli import main
from kvconform.fuzz.document import render
from kvconform.harness.loader import load_text
from kvconform.harness.loader.scheduler import SCHEDULER_GROUP_TYPES

SPACE = ExploreSpace(
    group_types=SCHEDULER_GROUP_TYPES,
    methods=("dflash", "draft_model", "eagle", "mtp", "ngram"),
    adaptive_threshold=True,
    spec_decode_metrics=True,
    flag_options=(("sliding_window_mla", "bounded_replay"),),
)
QUICK = settings(max_examples=300, derandomize=True, database=None, deadline=None)

# Features whose trace in a document is not theirs alone: a pool, a sequence limit or a
# budget the features left at their roomy draw may still come out small.
SIZE_FEATURES = {"tight_pool", "few_seqs", "small_budget"}


@QUICK
@given(workloads(SPACE))
def test_every_drawn_workload_loads_as_a_scheduler_scenario(doc: dict[str, Any]) -> None:
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == "scheduler"
    assert len(scenario.requests) == len(doc["requests"])


def _stop_past_max_model_len(doc: dict[str, Any]) -> bool:
    room = doc["model"]["max_model_len"]
    return any(r.get("stop_at", 0) > room - r["prompt_len"] for r in doc["requests"].values())


def test_no_stop_is_drawn_past_max_model_len() -> None:
    """``check_stop`` ends a request at ``max_model_len`` tokens whatever it samples next, so
    a stop past ``max_model_len - prompt_len`` is never sampled; the loader refuses one, and
    a drawn one made the explorer blame vLLM for ending the request by its length
    ("ends a request elsewhere than at the output that stops it")."""
    from hypothesis.errors import NoSuchExample

    with pytest.raises(NoSuchExample):
        find(
            workloads(SPACE),
            _stop_past_max_model_len,
            settings=settings(
                max_examples=1500, derandomize=True, database=None, phases=[Phase.generate]
            ),
        )


@QUICK
@given(st.data())
def test_a_feature_that_is_off_leaves_no_trace(data: st.DataObject) -> None:
    on = data.draw(feature_sets())
    doc = workload(data.draw, SPACE, on, "explore")
    shown = set(_features_of(doc)) - SIZE_FEATURES
    off = {name for name, value in on.items() if not value}
    if not all(runs_without_caching(g) for g in doc["model"]["groups"]):
        # a recurrent group (Mamba) turns prefix caching on (docs/explore.md)
        shown.discard("prefix_caching")
    assert not shown & off, (sorted(shown & off), doc)


def test_every_feature_is_drawn_both_ways() -> None:
    seen: dict[str, set[bool]] = {name: set() for name in FEATURES}

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        on = data.draw(feature_sets())
        assert not set(on) & set(LATE_FEATURES), "the late features come after the workload"
        workload(data.draw, SPACE, on, "explore")  # chooses the late ones into `on`
        for name, value in on.items():
            seen[name].add(value)

    draw()
    assert all(values == {True, False} for values in seen.values()), seen


@QUICK
@given(workloads(SPACE))
def test_late_features_are_legal_and_follow_their_rules(doc: dict[str, Any]) -> None:
    """Per-group block sizes are multiples of the model's, only in a hybrid, a Mamba group's
    the largest (vLLM's mamba_block_size is the scheduler block size); a retention interval
    is a multiple of the scheduler block size, with prefix caching and a group it applies
    to; the block drop only with a speculative method."""
    model = doc["model"]
    sized = [g for g in model["groups"] if isinstance(g, dict) and "block_size" in g]
    assert all(g["block_size"] in (2 * model["block_size"], 4 * model["block_size"]) for g in sized)
    types = [g if isinstance(g, str) else g["type"] for g in model["groups"]]
    if sized:
        assert len(model["groups"]) > 1
        assert "chunked_local" not in types
        sizes = [
            g.get("block_size", model["block_size"]) if isinstance(g, dict) else model["block_size"]
            for g in model["groups"]
        ]
        for group, size in zip(model["groups"], sizes, strict=True):
            if not isinstance(group, str) and group["type"] == "mamba":
                assert size == max(sizes), doc
    if doc.get("speculative", {}).get("disable_lookahead_block_hashes"):
        assert model.get("enable_caching") is False or "chunked_local" not in types
    (scenario,) = load_text(render(doc), "<explore>")
    interval = model.get("prefix_cache_retention_interval")
    if interval is not None:
        assert interval > 0 and interval % scenario.model.scheduler_block_size == 0
        assert model.get("enable_caching") is not False
    if doc.get("speculative", {}).get("disable_lookahead_block_hashes"):
        assert (
            scenario.speculative is not None and scenario.speculative.disable_lookahead_block_hashes
        )


def test_late_features_leave_each_seeds_workloads_as_drawn() -> None:
    """The late features are chosen from the drawn workload's checksum, not drawn: with them
    all off, every example is the one the strategies drew before they existed, and with them
    chosen, the same but for their fields."""

    def drawn(chosen: bool) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []

        @settings(max_examples=60, derandomize=True, database=None, deadline=None)
        @given(st.data())
        def draw(data: st.DataObject) -> None:
            on = data.draw(feature_sets())
            if not chosen:
                on.update(dict.fromkeys(LATE_FEATURES, False))
            docs.append(workload(data.draw, SPACE, on, "explore"))

        draw()
        return docs

    docs = {chosen: drawn(chosen) for chosen in (True, False)}

    def without_late(doc: dict[str, Any]) -> dict[str, Any]:
        model = dict(doc["model"])
        model.pop("prefix_cache_retention_interval", None)
        groups = []
        for g in model["groups"]:
            if isinstance(g, dict) and "block_size" in g:
                g = {k: v for k, v in g.items() if k != "block_size"}
                g = g["type"] if set(g) == {"type"} else g
            groups.append(g)
        model["groups"] = groups
        bare = {**doc, "model": model}
        if "speculative" in doc:
            spec = {
                k: v for k, v in doc["speculative"].items() if k != "disable_lookahead_block_hashes"
            }
            bare["speculative"] = spec
        return bare

    assert len(docs[True]) == len(docs[False])
    assert [without_late(d) for d in docs[True]] == docs[False]
    assert any(d != without_late(d) for d in docs[True]), "some example takes a late feature"


def test_all_features_off_is_the_plainest_workload() -> None:
    on = dict.fromkeys(FEATURES, False)

    @st.composite
    def plain(draw: Any) -> dict[str, Any]:
        return workload(draw, SPACE, on, "explore")

    doc = find(
        plain(),
        lambda d: True,
        settings=settings(database=None),
        random=Random(0),
    )
    assert doc["model"]["groups"] == ["full_attention"]
    assert "speculative" not in doc and doc["scheduler"] == {
        "mode": "sync",
        "max_num_seqs": 3,
        "max_num_batched_tokens": 64,
    }
    assert list(doc["requests"]) == ["a"]


def test_the_same_seed_draws_the_same_workloads() -> None:
    def draw(seed: int) -> list[str]:
        rng = Random(seed)
        docs: list[str] = []
        for _ in range(5):
            doc = find(
                workloads(SPACE),
                lambda d: len(d["requests"]) >= 3,
                settings=settings(database=None, phases=[Phase.generate]),  # the first drawn
                random=Random(rng.random()),
            )
            docs.append(render(doc))
        return docs

    first = draw(7)
    assert draw(7) == first
    assert draw(8) != first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "0"], "--budget must be a positive number"),
        (["--budget", "-5"], "--budget must be a positive number"),
        (["--jobs", "0"], "--jobs must be between 1 and 64"),
        (["--jobs", "65"], "--jobs must be between 1 and 64"),
        (["--max-findings", "0"], "--max-findings must be at least 1"),
        (["--seed", "-1"], "--seed must be at least 0"),
    ],
)
def test_bad_arguments_exit_2_before_vllm_loads(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explore", *args]) == 2
    out = capsys.readouterr()
    assert message in out.out + out.err
    assert "loading" not in out.out  # refused before vLLM is loaded


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--examples", "3"]) == 2  # argparse's usage error
    assert "unrecognized arguments: --examples" in capsys.readouterr().err


def _replay_windows(doc: dict[str, Any]) -> list[int]:
    return [
        g["sliding_window"]
        for g in doc["model"]["groups"]
        if isinstance(g, dict) and g.get("bounded_replay")
    ]


# Every group a sliding-window MLA one, so that pairs of bounded-replay groups are common.
REPLAY_SPACE = ExploreSpace(
    group_types=("sliding_window_mla",),
    methods=(),
    flag_options=(("sliding_window_mla", "bounded_replay"),),
)


@QUICK
@given(st.data())
def test_drawn_bounded_replay_groups_share_one_window(data: st.DataObject) -> None:
    # The explorer drew two bounded-replay groups of different windows, which no vLLM model
    # has (vLLM's Scheduler.__init__ asserts one replay window; the loader refuses two).
    on = {name: name == "hybrid" for name in FEATURES}
    doc = workload(data.draw, REPLAY_SPACE, on, "explore")
    windows = _replay_windows(doc)
    assert len(set(windows)) <= 1, (windows, doc)
    groups = doc["model"]["groups"]
    # Several groups never all bounded-replay ones (no cacheable group: no vLLM model).
    assert len(groups) == 1 or len(windows) < len(groups), doc
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == "scheduler"


# Every group a Mamba one (prefix caching on, as the explorer draws it) and chunked prefill
# asked off: vLLM requires chunked prefill for Mamba prefix caching (MambaModelConfig).
MAMBA_SPACE = ExploreSpace(group_types=("mamba", "full_attention"), methods=())


@QUICK
@given(st.data())
def test_a_mamba_workload_keeps_chunked_prefill_on(data: st.DataObject) -> None:
    # The explorer drew a Mamba model with prefix caching and chunked prefill off, which
    # vLLM refuses to build; its "align" split then stalled a multimodal request forever.
    on = {name: name in ("no_chunked_prefill", "multimodal") for name in FEATURES}
    doc = workload(data.draw, MAMBA_SPACE, on, "explore")
    recurrent = not all(runs_without_caching(g) for g in doc["model"]["groups"])
    if recurrent:
        assert doc["scheduler"].get("enable_chunked_prefill", True), doc
        assert not doc["scheduler"].get("disable_chunked_mm_input"), doc
    else:
        assert doc["scheduler"]["enable_chunked_prefill"] is False, doc
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == "scheduler"


CHUNK_REPLAY_SPACE = ExploreSpace(
    group_types=("sliding_window_mla", "chunked_local"),
    methods=(),
    flag_options=(("sliding_window_mla", "bounded_replay"),),
)


@QUICK
@given(st.data())
def test_bounded_replay_is_never_drawn_beside_chunked_local(data: st.DataObject) -> None:
    on = {name: name == "hybrid" for name in FEATURES}
    doc = workload(data.draw, CHUNK_REPLAY_SPACE, on, "explore")
    groups = [g for g in doc["model"]["groups"] if isinstance(g, dict)]
    replays = any(g.get("bounded_replay") for g in groups)
    assert not (replays and any(g["type"] == "chunked_local" for g in groups)), doc
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == "scheduler"


def test_multimodal_workloads_draw_encoder_pressure_down_to_one_item() -> None:
    # The encoder invariants fail only under pressure (an eviction, a full cache, a step
    # past its encoder budget): vLLM sizes both to max(token budget, largest item) unless
    # told, so the explorer states them, down to exactly one item's worth, on some
    # multimodal workloads and never on a workload without an item.
    on = {name: name in ("multimodal", "no_chunked_prefill") for name in FEATURES}
    seen: list[tuple[int, int, int]] = []
    stated = 0

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        nonlocal stated
        doc = workload(data.draw, SPACE, on, "explore")
        items = [i["length"] for r in doc["requests"].values() for i in r.get("mm_inputs", ())]
        scheduler = doc["scheduler"]
        if "encoder_cache_size" not in scheduler:
            assert "max_num_encoder_input_tokens" not in scheduler, doc
            return
        assert items, doc
        # vLLM's encoder sizes without chunked prefill come from a budget >= max_model_len.
        assert scheduler.get("enable_chunked_prefill", True), doc
        stated += 1
        budget, cache = scheduler["max_num_encoder_input_tokens"], scheduler["encoder_cache_size"]
        assert 1 <= budget <= 2 * max(items) and 1 <= cache <= 3 * max(items), doc
        seen.append((budget, cache, max(items)))
        load_text(render(doc), "<explore>")

    draw()
    assert stated, "no multimodal workload stated its encoder sizes"
    assert any(cache <= largest for _, cache, largest in seen), seen


MAMBA_REPLAY_SPACE = ExploreSpace(
    group_types=("sliding_window_mla", "mamba"),
    methods=(),
    flag_options=(("sliding_window_mla", "bounded_replay"),),
)


@QUICK
@given(st.data())
def test_bounded_replay_is_never_drawn_beside_a_mamba_group(data: st.DataObject) -> None:
    # DeepSeek V4.1, the only model vLLM builds bounded-replay groups for, has no Mamba
    # layers; seed 0 met a Mamba "align" finding that needs the pair.
    on = {name: name == "hybrid" for name in FEATURES}
    doc = workload(data.draw, MAMBA_REPLAY_SPACE, on, "explore")
    groups = doc["model"]["groups"]
    replays = any(isinstance(g, dict) and g.get("bounded_replay") for g in groups)
    mamba = any((g if isinstance(g, str) else g["type"]) == "mamba" for g in groups)
    assert not (replays and mamba), doc
    (scenario,) = load_text(render(doc), "<explore>")
    assert scenario.kind == "scheduler"


def test_follow_ups_arrive_once_their_source_can_have_finished() -> None:
    """A follow-up (a conversation's next turn) resends an earlier request's prompt, whole or
    a part, with new tokens after it, and arrives no earlier than the source's finish bound
    computed from what was drawn before it; opening turns span two blocks past the widest
    window or chunk where ``max_model_len`` allows; every such workload loads."""
    on = {name: name in ("follow_ups", "hybrid", "prefix_caching") for name in FEATURES}
    turns = whole = 0

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        nonlocal turns, whole
        doc = workload(data.draw, SPACE, on, "explore")
        requests, scheduler = doc["requests"], doc["scheduler"]
        names = list(requests)
        found = follow_ups(doc)
        block, most = doc["model"]["block_size"], doc["model"]["max_model_len"] - 1
        reach = max(
            [int(g.get("sliding_window") or g.get("attention_chunk_size") or 0)
             for g in doc["model"]["groups"] if isinstance(g, dict)] + [0]
        )  # fmt: skip
        for index, name in enumerate(names):
            body = requests[name]
            if name not in found:
                # an opening turn: long enough to span blocks and windows
                assert body["prompt_len"] >= min(most, 2 * block + reach), doc
                continue
            turns += 1
            source = requests[body["prefix_from"]]
            assert names.index(body["prefix_from"]) < index
            assert 1 <= body["prefix_len"] <= min(source["prompt_len"], body["prompt_len"]), doc
            whole += body["prefix_len"] == source["prompt_len"]
            earlier = {n: requests[n] for n in names[:index]}
            bound = finish_bound(scheduler, earlier, body["prefix_from"])
            # the bound counts the source's own arrival, prefill, decode and the slack
            assert bound >= (
                source.get("arrival", 0)
                + -(-source["prompt_len"] // scheduler["max_num_batched_tokens"])
                + source["max_tokens"]
                + FOLLOW_UP_SLACK
            )
            assert bound <= body["arrival"] <= bound + 4, doc
        load_text(render(doc), "<explore>")

    draw()
    assert turns > 50 and 0 < whole < turns, (turns, whole)


def test_follow_ups_off_draw_no_arrival_past_8_steps() -> None:
    """Without follow-ups, `arrivals` and shared prefixes never look like one: every bound is
    past the 8 steps `arrivals` draws (the statistics and the no-trace test rely on it)."""
    on = {name: name in ("arrivals", "prefix_caching") for name in FEATURES}

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        doc = workload(data.draw, SPACE, on, "explore")
        assert all(r.get("arrival", 0) <= 8 for r in doc["requests"].values())
        assert follow_ups(doc) == [], doc

    draw()


def test_a_connector_meets_the_edge_of_the_pool_without_tight_pool() -> None:
    """With a KV connector the roomy pool's multiple starts at one request (loads and
    evictions interact only under pressure); without one it starts at two."""

    def smallest_multiples(feature: str | None) -> set[int]:
        on = {name: name == feature for name in FEATURES}
        seen: set[int] = set()

        @settings(max_examples=120, derandomize=True, database=None, deadline=None)
        @given(st.data())
        def draw(data: st.DataObject) -> None:
            doc = workload(data.draw, SPACE, on, "explore")
            model = doc["model"]
            k = doc.get("speculative", {}).get("num_speculative_tokens", 0)
            alone = len(model["groups"]) * (
                -(-model["max_model_len"] // model["block_size"]) + k + 1
            )
            assert (model["num_blocks"] - 1) % alone == 0, doc
            seen.add((model["num_blocks"] - 1) // alone)

        draw()
        return seen

    assert 1 in smallest_multiples("remote_kv")
    assert 1 in smallest_multiples("sync_connector")
    assert min(smallest_multiples(None)) == 2


def test_mamba_hybrids_draw_per_group_block_sizes_with_mamba_the_largest() -> None:
    """Under group_block_sizes a Mamba hybrid takes per-group sizes (the attention groups'
    below Mamba's, as vLLM builds a drafter's or a smaller page's group beside it)."""
    space = ExploreSpace(group_types=("full_attention", "sliding_window", "mamba"), methods=())
    seen = 0

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        nonlocal seen
        on = {name: name in ("hybrid", "group_block_sizes") for name in FEATURES}
        doc = workload(data.draw, space, on, "explore")
        groups = doc["model"]["groups"]
        types = [g if isinstance(g, str) else g["type"] for g in groups]
        sized = [g for g in groups if isinstance(g, dict) and "block_size" in g]
        if "mamba" in types and sized:
            size = doc["model"]["block_size"]
            sizes = [size if isinstance(g, str) else g.get("block_size", size) for g in groups]
            mamba = max(s for s, t in zip(sizes, types, strict=True) if t == "mamba")
            assert mamba == max(sizes), doc
            seen += any(s < mamba for s, t in zip(sizes, types, strict=True) if t != "mamba")
            load_text(render(doc), "<explore>")

    draw()
    assert seen, "no Mamba hybrid drew an attention block below Mamba's"
