"""The KV-event mirror (:mod:`kvconform.model.kv_events`) and its model option, without vLLM."""

from __future__ import annotations

from collections import Counter

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.loader import load_text
from kvconform.model.kv_events import judge_mirror, replay_events


def test_copies_under_one_hash_are_counted_and_removed_one_by_one() -> None:
    announced: Counter[tuple[int, object]] = Counter()
    # Two requests cache the same block hash 7 in group 0; one copy is evicted.
    problems = replay_events(
        announced, [("stored", 0, (5, 7)), ("stored", 0, (7,)), ("removed", 0, (7,))]
    )
    assert problems == []
    assert announced == Counter({(0, 5): 1, (0, 7): 1})
    assert judge_mirror(announced, {(0, 5): 1, (0, 7): 1}) == []


def test_an_unannounced_block_and_a_phantom_one_are_both_reported() -> None:
    announced = Counter({(0, 5): 1, (1, 9): 1})
    # The pool holds block hash 5 twice (one copy never announced) and 9 no more.
    wrong = judge_mirror(announced, {(0, 5): 2})
    assert wrong == [((0, 5), 1, 2), ((1, 9), 1, 0)]


def test_a_removal_of_a_block_never_stored_is_a_problem_and_a_clear_resets() -> None:
    announced: Counter[tuple[int, object]] = Counter({(0, 1): 1})
    assert replay_events(announced, [("removed", 2, (4,))]) == [
        "removes 4 of group 2, never stored"
    ]
    assert replay_events(announced, [("cleared", -1, ())]) == []
    assert not announced


def test_kv_cache_events_are_off_unless_stated():
    text = "model:\n  enable_caching: true\n{}requests: {{a: {{prompt_len: 4}}}}\nsteps: [{{a: {{prefill: 4}}}}]\n"
    assert load_text(text.format(""), "ev.yaml")[0].model.kv_cache_events is False
    stated = load_text(text.format("  kv_cache_events: true\n"), "ev.yaml")[0]
    assert stated.model.kv_cache_events is True
    with pytest.raises(ScenarioError, match="kv_cache_events"):
        load_text(text.format("  kv_cache_events: maybe\n"), "ev.yaml")
