"""Scheduler scenarios in the loader, and acceptance patterns: no vLLM needed."""

from __future__ import annotations

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.loader import load_file
from kvconform.model.acceptance import AcceptanceStream
from kvconform.model.scenario import Acceptance

SCHEDULER = """
name: s
kind: scheduler
model: {max_model_len: 512, num_blocks: 64}
speculative: {method: eagle, num_speculative_tokens: 3}
scheduler:
  mode: async
  max_num_seqs: 2
  max_num_batched_tokens: 64
  long_prefill_token_threshold: 32
requests:
  a: {prompt_len: 40}
  b: {prompt_len: 100, arrival: 3, max_tokens: 7, accept: [3, 0]}
  c: {prompt_len: 20, accept: {repeat: [1, 2]}, prefix_from: b, prefix_len: 16}
  d: {prompt_len: 20, accept: {rate: 0.25, seed: 4}}
  e: {prompt_len: 20, accept: none}
"""


def test_scheduler_scenario_is_parsed(scenario_from):
    scenario = scenario_from(SCHEDULER)
    assert scenario.kind == "scheduler" and scenario.steps == ()
    limits = scenario.scheduler
    assert limits is not None
    assert (limits.mode, limits.async_scheduling, limits.overlapped) == ("async", True, False)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (2, 64)
    assert limits.long_prefill_token_threshold == 32 and limits.enable_chunked_prefill
    assert limits.model_runner == "auto"
    a, b, c, d, e = scenario.requests.values()
    assert (a.arrival, a.max_tokens, a.acceptance.kind) == (0, 16, "all")
    assert (b.arrival, b.max_tokens, b.acceptance) == (3, 7, Acceptance("list", (3, 0)))
    assert c.acceptance == Acceptance("repeat", (1, 2)) and (c.prefix_from, c.prefix_len) == (
        "b",
        16,
    )
    assert d.acceptance == Acceptance("rate", rate=0.25, seed=4)
    assert e.acceptance == Acceptance("repeat", (0,))


def test_abort_at_is_read_and_off_by_default(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
        "  a: {prompt_len: 40, remote_prefill: 4, abort_at: 1}\n  b: {prompt_len: 40}\n"
    )
    assert [r.abort_at for r in scenario.requests.values()] == [1, None]


def test_stops_and_stats_are_read_and_off_by_default(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {log_stats: true}\nrequests:\n"
        "  a: {prompt_len: 40, max_tokens: 9, stop_at: 9}\n"
        "  b: {prompt_len: 40, stop_at: 2, stop_with: eos}\n  c: {prompt_len: 40}\n"
    )
    assert scenario.scheduler is not None and scenario.scheduler.log_stats
    stops = [(r.stop_at, r.stop_with) for r in scenario.requests.values()]
    assert stops == [(9, "stop_token"), (2, "eos"), (None, "stop_token")]
    plain = scenario_from("kind: scheduler\nrequests: {a: {prompt_len: 10}}\n")
    assert plain.scheduler is not None and not plain.scheduler.log_stats


def test_a_streaming_session_lists_its_later_chunks(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
        "  s:\n    prompt_len: 40\n    max_tokens: 5\n    stream:\n"
        "      - {at: 1, prompt_len: 20, max_tokens: 4}\n      - {at: 9, prompt_len: 12}\n"
        "  t: {prompt_len: 30}\n"
    )
    s, t = scenario.requests.values()
    assert [(c.at, c.prompt_len, c.max_tokens, c.line) for c in s.stream] == [
        (1, 20, 4, 8),
        (9, 12, 5, 9),
    ]
    assert t.stream == ()


def test_pauses_are_read_in_order(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler:\n  pause:\n    - {at: 2, resume_at: 6}\n"
        "    - {at: 6, resume_at: 9}\nrequests: {a: {prompt_len: 10}}\n"
    )
    assert scenario.scheduler is not None
    assert [(p.at, p.resume_at, p.mode) for p in scenario.scheduler.pauses] == [
        (2, 6, "wait"),
        (6, 9, "wait"),
    ]


def test_scheduler_defaults(scenario_from):
    scenario = scenario_from("kind: scheduler\nrequests: {a: {prompt_len: 10}}\n")
    limits = scenario.scheduler
    assert limits is not None and limits.mode == "overlapped"
    assert scenario.speculative is None


def test_remote_prefill_runs_in_every_mode(scenario_from):
    # vLLM defers a KV consumer's block frees under async scheduling; scheduler mode
    # observes the deferral (sched-remote-prefill-overlapped.yaml).
    for mode in ("sync", "async", "overlapped"):
        scenario = scenario_from(
            f"kind: scheduler\nscheduler: {{mode: {mode}}}\n"
            "requests:\n  a: {prompt_len: 40, remote_prefill: 2}\n"
        )
        assert scenario.requests["a"].remote_prefill == 2


def test_remote_prefill_is_off_by_default_and_true_means_one_step(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
        "  a: {prompt_len: 40}\n  b: {prompt_len: 40, remote_prefill: true}\n"
        "  c: {prompt_len: 40, remote_prefill: 3}\n  d: {prompt_len: 40, remote_prefill: false}\n"
    )
    assert [r.remote_prefill for r in scenario.requests.values()] == [0, 1, 3, 0]


def test_prefix_cache_resets_are_read_in_call_order(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler:\n  reset_prefix_cache:\n"
        "    - {at: 9, running: true}\n    - {at: 2, succeeds: false}\n"
        "requests: {a: {prompt_len: 40}}\n"
    )
    limits = scenario.scheduler
    assert limits is not None
    assert [(r.at, r.running, r.succeeds) for r in limits.resets] == [
        (2, False, False),
        (9, True, True),
    ]


def test_load_failure_policy_expect_loaded_and_connector_reset_are_read(scenario_from):
    scenario = scenario_from(
        "kind: scheduler\nscheduler:\n  mode: sync\n  kv_load_failure_policy: recompute\n"
        "  reset_prefix_cache:\n    - {at: 2, connector: true}\n    - {at: 5}\nrequests:\n"
        "  a: {prompt_len: 40, remote_prefill: true, remote_load_fails: 1, expect_loaded: 16}\n"
        "  b: {prompt_len: 40}\n"
    )
    limits = scenario.scheduler
    assert limits is not None
    assert limits.kv_load_failure_policy == "recompute"
    assert [r.connector for r in limits.resets] == [True, False]
    assert [r.expect_loaded for r in scenario.requests.values()] == [16, None]
    default = scenario_from("kind: scheduler\nrequests: {a: {prompt_len: 40}}\n").scheduler
    assert default is not None and default.kv_load_failure_policy is None


def test_priorities_need_the_priority_policy(scenario_from, write_scenario):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {policy: priority}\nrequests:\n"
        "  a: {prompt_len: 40, priority: 3}\n  b: {prompt_len: 40}\n"
    )
    assert scenario.scheduler is not None and scenario.scheduler.policy == "priority"
    assert [r.priority for r in scenario.requests.values()] == [3, 0]
    path = write_scenario("kind: scheduler\nrequests:\n  a: {prompt_len: 40, priority: 3}\n")
    with pytest.raises(ScenarioError, match="needs scheduler.policy: priority"):
        load_file(path)


def test_a_synchronous_connector_is_named_and_excludes_remote_prefill(
    scenario_from, write_scenario
):
    scenario = scenario_from(
        "kind: scheduler\nscheduler: {mode: sync, kv_connector: decode_bench}\n"
        "requests:\n  a: {prompt_len: 40}\n"
    )
    assert scenario.scheduler is not None and scenario.scheduler.kv_connector == "decode_bench"
    unknown = write_scenario(
        "kind: scheduler\nscheduler: {kv_connector: lmcache}\nrequests: {a: {prompt_len: 40}}\n"
    )
    with pytest.raises(ScenarioError, match="must be one of decode_bench, not 'lmcache'"):
        load_file(unknown)
    both = write_scenario(
        "kind: scheduler\nscheduler: {mode: sync, kv_connector: decode_bench}\n"
        "requests:\n  a: {prompt_len: 40, remote_prefill: true}\n"
    )
    with pytest.raises(ScenarioError, match="an instance has one KV connector") as raised:
        load_file(both)
    assert raised.value.where.field.endswith("remote_prefill")


def test_matrix_over_scheduler_modes(write_scenario):
    path = write_scenario(
        "name: m\nkind: scheduler\nmatrix:\n  mode: [sync, async, overlapped]\n"
        "  method: [eagle, none]\n"
        "speculative: {method: eagle, num_speculative_tokens: 2}\n"
        "requests: {a: {prompt_len: 10}}\n"
    )
    scenarios = load_file(path)
    assert [s.id for s in scenarios] == [
        "m[sync-eagle]",
        "m[sync-nospec]",
        "m[async-eagle]",
        "m[async-nospec]",
        "m[overlapped-eagle]",
        "m[overlapped-nospec]",
    ]
    assert [s.scheduler.mode for s in scenarios if s.scheduler] == [
        "sync",
        "sync",
        "async",
        "async",
        "overlapped",
        "overlapped",
    ]


SPEC = "speculative: {method: eagle, num_speculative_tokens: 3}\n"


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (
            "kind: scheduler\nrequests: {a: {prompt_len: 5}}\nsteps: [{a: {prefill: 5}}]\n",
            3,
            "steps",
            "no steps",
        ),
        (
            "kind: scheduler\nscheduler:\n  mode: eager\nrequests: {a: {prompt_len: 5}}\n",
            3,
            "scheduler.mode",
            "sync, async, overlapped",
        ),
        (
            "kind: scheduler\nscheduler:\n  model_runner: v3\nrequests: {a: {prompt_len: 5}}\n",
            3,
            "scheduler.model_runner",
            "auto, v2, v1",
        ),
        (
            "kind: scheduler\nscheduler:\n  max_num_seqs: 8\n  max_num_batched_tokens: 4\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.max_num_batched_tokens",
            "at least max_num_seqs",
        ),
        (
            "kind: scheduler\nmodel: {max_model_len: 512}\nscheduler:\n"
            "  enable_chunked_prefill: false\n  max_num_batched_tokens: 64\n"
            "requests: {a: {prompt_len: 5}}\n",
            5,
            "scheduler.max_num_batched_tokens",
            "without chunked prefill",
        ),
        (
            "kind: scheduler\nscheduler:\n  surprise: 1\nrequests: {a: {prompt_len: 5}}\n",
            3,
            "scheduler.surprise",
            "unknown field",
        ),
        (
            "kind: scheduler\n" + SPEC + "requests:\n  a: {prompt_len: 5, accept: [1, 4]}\n",
            4,
            "requests.a.accept",
            "0..3",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, accept: [1]}\n",
            3,
            "requests.a.accept",
            "needs a 'speculative' section",
        ),
        (
            "kind: scheduler\n" + SPEC + "requests:\n  a: {prompt_len: 5, accept: {rate: 2}}\n",
            4,
            "requests.a.accept.rate",
            "0..1",
        ),
        (
            "kind: scheduler\n" + SPEC + "requests:\n  a: {prompt_len: 5, accept: sometimes}\n",
            4,
            "requests.a.accept",
            "{repeat: [...]}",
        ),
        (
            "kind: scheduler\nmodel: {max_model_len: 64}\nrequests:\n  a: {prompt_len: 64}\n",
            4,
            "requests.a.prompt_len",
            "below max_model_len",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, arrival: -1}\n",
            3,
            "requests.a.arrival",
            "at least 0",
        ),
        (
            "kind: scheduler\nmodel:\n  groups:\n    - {type: cross_attention}\nrequests: {a: {prompt_len: 5}}\n",
            4,
            "model.groups[0]",
            "not available in scheduler scenarios",
        ),
        (
            "kind: scheduler\nspeculative:\n  method: eagle\n  num_speculative_tokens: 3\n"
            "  num_lookahead_tokens: 5\nrequests: {a: {prompt_len: 5}}\n",
            3,
            "speculative.method",
            "takes the lookahead from vLLM's scheduler",
        ),
        (
            "kind: scheduler\nspeculative: {method: mtp, num_speculative_tokens: 5}\n"
            "scheduler:\n  num_nextn_predict_layers: 3\nrequests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.num_nextn_predict_layers",
            "multiple of the MTP modules",
        ),
        (
            "kind: scheduler\n" + SPEC + "scheduler:\n  num_nextn_predict_layers: 3\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.num_nextn_predict_layers",
            "MTP only",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, expect_hit: 0}\n",
            3,
            "requests.a.expect_hit",
            "needs model.enable_caching: true",
        ),
        (
            "kind: scheduler\nmodel: {enable_caching: true}\nrequests:\n  a: {prompt_len: 32, expect_hit: 32}\n",
            4,
            "requests.a.expect_hit",
            "must be below prompt_len 32",
        ),
        (
            "kind: scheduler\nmodel: {enable_caching: true}\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 32, expect_hit: 16, remote_prefill: true}\n",
            5,
            "requests.a.expect_hit",
            "not judged for a remote_prefill request",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n  a: {prompt_len: 5, remote_prefill: -1}\n",
            4,
            "requests.a.remote_prefill",
            "number of schedule() calls the asynchronous KV load takes",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n  a: {prompt_len: 5, remote_prefill: two}\n",
            4,
            "requests.a.remote_prefill",
            "not 'two'",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, arrival: 2, abort_at: 1}\n",
            4,
            "requests.a.abort_at",
            "must be at least the request's arrival (2)",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, abort_at: 3}\n",
            3,
            "requests.a.abort_at",
            "needs scheduler.mode: sync, not 'overlapped'",
        ),
        (
            "kind: trajectory\nscheduler: {mode: sync}\nrequests: {a: {prompt_len: 5}}\n"
            "steps: [{a: {prefill: 5}}]\n",
            2,
            "scheduler",
            "unknown field",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, max_tokens: 4, stop_at: 5}\n",
            3,
            "requests.a.stop_at",
            "must be at most max_tokens (4)",
        ),
        (
            # check_stop caps the request at max_model_len tokens: 20 + 12 = 32 outputs 12
            "kind: scheduler\nmodel: {max_model_len: 32}\nrequests:\n"
            "  a: {prompt_len: 20, max_tokens: 16, stop_at: 13}\n",
            4,
            "requests.a.stop_at",
            "must be at most 12 (max_model_len 32 less prompt_len 20)",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, stop_at: 0}\n",
            3,
            "requests.a.stop_at",
            "at least 1",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, stop_at: 2, stop_with: eot}\n",
            3,
            "requests.a.stop_with",
            "must be one of stop_token, eos, not 'eot'",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, stop_with: eos}\n",
            3,
            "requests.a.stop_with",
            "needs stop_at",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, stop_at: 2, abort_at: 1}\n",
            4,
            "requests.a.stop_at",
            "cannot go with abort_at",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, stop_at: 2, remote_prefill: 1}\n",
            4,
            "requests.a.stop_at",
            "not offered with remote_prefill",
        ),
        (
            "kind: scheduler\nscheduler:\n  mode: sync\n  log_stats: true\n"
            "  kv_connector: decode_bench\nrequests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.log_stats",
            "cannot go with scheduler.kv_connector: decode_bench",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, stream: [{at: 1, prompt_len: 4}]}\n",
            3,
            "requests.a.stream",
            "needs scheduler.mode: sync, not 'overlapped'",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, arrival: 2, stream: [{at: 2, prompt_len: 4}]}\n",
            4,
            "requests.a.stream[0].at",
            "must come after 2",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, stream: [{at: 1, prompt_len: 0}]}\n",
            4,
            "requests.a.stream[0].prompt_len",
            "at least 1",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, stop_at: 2, stream: [{at: 1, prompt_len: 4}]}\n",
            4,
            "requests.a.stream",
            "cannot go with stop_at",
        ),
        (
            "kind: scheduler\nmodel: {max_model_len: 64}\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 40, max_tokens: 8, stream: [{at: 1, prompt_len: 20}]}\n",
            5,
            "requests.a.stream",
            "the session's turns reach 75 tokens (40 + 8 - 1 + 20 + 8: each turn",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n  a: {prompt_len: 5, stream: 3}\n",
            4,
            "requests.a.stream",
            "must be a non-empty list",
        ),
        (
            "kind: scheduler\nscheduler:\n  pause:\n    - {at: 1, resume_at: 4, mode: abort}\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.pause[0].mode",
            "abort needs scheduler.mode: sync",
        ),
        (
            "kind: scheduler\nscheduler:\n  pause:\n    - {at: 1, resume_at: 4, mode: keep}\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.pause[0].mode",
            "must be one of wait, abort, not 'keep'",
        ),
        (
            "kind: scheduler\nrequests:\n  a: {prompt_len: 5, close_at: 4}\n",
            3,
            "requests.a.close_at",
            "needs stream",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 5, stream: [{at: 3, prompt_len: 4}], close_at: 3}\n",
            4,
            "requests.a.close_at",
            "must come after the last chunk's at (3)",
        ),
        (
            "kind: scheduler\nscheduler:\n  pause:\n    - {at: 4, resume_at: 4}\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.pause[0].resume_at",
            "must come after at (4)",
        ),
        (
            "kind: scheduler\nscheduler:\n  pause:\n    - {at: 1, resume_at: 5}\n"
            "    - {at: 3, resume_at: 8}\nrequests: {a: {prompt_len: 5}}\n",
            5,
            "scheduler.pause[1].at",
            "must come at or after the pause before resumes (5)",
        ),
        (
            "kind: scheduler\nscheduler:\n  log_stats: yes please\nrequests: {a: {prompt_len: 5}}\n",
            3,
            "scheduler.log_stats",
            "must be true or false",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync, kv_load_failure_policy: retry}\n"
            "requests: {a: {prompt_len: 40, remote_prefill: true}}\n",
            2,
            "scheduler.kv_load_failure_policy",
            "must be one of fail, recompute, not 'retry'",
        ),
        (
            "kind: scheduler\nscheduler:\n  mode: sync\n  kv_connector: decode_bench\n"
            "  kv_load_failure_policy: recompute\nrequests: {a: {prompt_len: 40}}\n",
            5,
            "scheduler.kv_load_failure_policy",
            "cannot go with scheduler.kv_connector: decode_bench",
        ),
        (
            "kind: scheduler\nscheduler:\n  mode: sync\n  kv_load_failure_policy: recompute\n"
            "requests: {a: {prompt_len: 40}}\n",
            3,
            "scheduler.kv_load_failure_policy",
            "needs a remote_prefill request",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n  a: {prompt_len: 40, expect_loaded: 16}\n",
            4,
            "requests.a.expect_loaded",
            "needs remote_prefill (a KV load)",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 40, remote_prefill: true, expect_loaded: 40}\n",
            4,
            "requests.a.expect_loaded",
            "must be below prompt_len 40",
        ),
        (
            "kind: scheduler\nscheduler: {mode: sync}\nrequests:\n"
            "  a: {prompt_len: 40, remote_prefill: true, expect_loaded: -1}\n",
            4,
            "requests.a.expect_loaded",
            "at least 0",
        ),
        (
            "kind: scheduler\nscheduler:\n  reset_prefix_cache:\n    - {at: 2, connector: maybe}\n"
            "requests: {a: {prompt_len: 5}}\n",
            4,
            "scheduler.reset_prefix_cache[0].connector",
            "must be true or false",
        ),
    ],
)
def test_bad_scheduler_input_names_file_line_and_field(write_scenario, text, line, field, words):
    path = write_scenario(text)
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (line, field), str(error)
    assert words in error.message, str(error)
    assert str(error).startswith(f"{path}:{line}: ")


def _stream(pattern: Acceptance, drafts: list[int], request: str = "a") -> list[int]:
    stream = AcceptanceStream(pattern, request)
    return [stream.next(n) for n in drafts]


def test_acceptance_list_then_all_and_capped():
    # The list is used once, then every draft is accepted; never more than scheduled.
    assert _stream(Acceptance("list", (3, 0, 2)), [3, 3, 1, 3, 2]) == [3, 0, 1, 3, 2]


def test_acceptance_repeat_cycles_and_none():
    assert _stream(Acceptance("repeat", (1, 2)), [3, 3, 3, 3, 1]) == [1, 2, 1, 2, 1]
    assert _stream(Acceptance("repeat", (0,)), [3, 3, 3]) == [0, 0, 0]
    assert _stream(Acceptance("all"), [3, 1, 2]) == [3, 1, 2]


def test_acceptance_rate_is_seeded_per_request():
    pattern = Acceptance("rate", rate=0.5, seed=7)
    first = _stream(pattern, [3] * 200)
    assert first == _stream(pattern, [3] * 200)  # same seed, same request: same drafts
    assert first != _stream(pattern, [3] * 200, request="b")  # another request differs
    assert all(0 <= a <= 3 for a in first)
    assert 0.3 < sum(a > 0 for a in first) / 200 < 0.7  # the first draft passes at rate 0.5
    assert _stream(Acceptance("rate", rate=1.0), [3, 2]) == [3, 2]
    assert _stream(Acceptance("rate", rate=0.0), [3, 2]) == [0, 0]


def test_the_adaptive_long_prefill_threshold_is_read_and_off_by_default(scenario_from):
    on = scenario_from(
        "kind: scheduler\nscheduler: {long_prefill_token_threshold: 16, "
        "long_prefill_token_threshold_adaptive: true}\nrequests:\n  a: {prompt_len: 40}\n"
    ).scheduler
    off = scenario_from("kind: scheduler\nrequests:\n  a: {prompt_len: 40}\n").scheduler
    assert on is not None and off is not None
    assert (
        on.long_prefill_token_threshold_adaptive and not off.long_prefill_token_threshold_adaptive
    )


def test_the_prefill_schedule_interval_is_read_and_one_by_default(scenario_from):
    every_third = scenario_from(
        "kind: scheduler\nscheduler: {prefill_schedule_interval: 3}\n"
        "requests:\n  a: {prompt_len: 40}\n"
    ).scheduler
    default = scenario_from("kind: scheduler\nrequests:\n  a: {prompt_len: 40}\n").scheduler
    assert every_third is not None and default is not None
    assert (every_third.prefill_schedule_interval, default.prefill_schedule_interval) == (3, 1)


@pytest.mark.parametrize(
    ("section", "words"),
    [("{prefill_schedule_interval: 0}", "must be at least 1"),
     ("{prefill_schedule_interval: two}", "must be an integer")],
)  # fmt: skip
def test_a_bad_prefill_schedule_interval_names_the_field(write_scenario, section, words):
    path = write_scenario(
        f"kind: scheduler\nscheduler: {section}\nrequests:\n  a: {{prompt_len: 40}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (
        2,
        "scheduler.prefill_schedule_interval",
    ), str(error)
    assert words in error.message, str(error)


@pytest.mark.parametrize(
    ("section", "field", "words"),
    [
        ("{long_prefill_token_threshold_adaptive: true}",
         "scheduler.long_prefill_token_threshold_adaptive",
         "needs scheduler.long_prefill_token_threshold above 0"),
        ("{long_prefill_token_threshold: 16, long_prefill_token_threshold_adaptive: 2}",
         "scheduler.long_prefill_token_threshold_adaptive", "must be true or false"),
    ],
)  # fmt: skip
def test_a_bad_adaptive_threshold_names_the_field(write_scenario, section, field, words):
    path = write_scenario(
        f"kind: scheduler\nscheduler: {section}\nrequests:\n  a: {{prompt_len: 40}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (2, field), str(error)
    assert words in error.message, str(error)


def test_spec_decode_metrics_level_needs_drafts(scenario_from, write_scenario):
    scenario = scenario_from(
        "kind: scheduler\nspeculative: {method: eagle, num_speculative_tokens: 2}\n"
        "scheduler: {spec_decode_metrics: summary}\nrequests: {a: {prompt_len: 40}}\n"
    )
    assert scenario.scheduler is not None and scenario.scheduler.spec_decode_metrics == "summary"
    plain = scenario_from("kind: scheduler\nrequests: {a: {prompt_len: 40}}\n")
    assert plain.scheduler is not None and plain.scheduler.spec_decode_metrics == "none"
    unknown = write_scenario(
        "kind: scheduler\nspeculative: {method: eagle, num_speculative_tokens: 2}\n"
        "scheduler: {spec_decode_metrics: full}\nrequests: {a: {prompt_len: 40}}\n"
    )
    with pytest.raises(ScenarioError, match="must be one of none, summary, detailed, not 'full'"):
        load_file(unknown)
    no_drafts = write_scenario(
        "kind: scheduler\nscheduler: {spec_decode_metrics: detailed}\n"
        "requests: {a: {prompt_len: 40}}\n"
    )
    with pytest.raises(ScenarioError, match="needs a speculative section") as raised:
        load_file(no_drafts)
    assert raised.value.where.field.endswith("spec_decode_metrics")


# -- bounded-replay groups share one window (vLLM's Scheduler.__init__ asserts it) ----------

REPLAY_GROUPS = """
kind: scheduler
model:
  groups:
    - {type: sliding_window_mla, sliding_window: 1, bounded_replay: true}
    - {type: sliding_window_mla, sliding_window: SECOND, bounded_replay: REPLAYS}
requests: {a: {prompt_len: 1}}
"""


def test_two_bounded_replay_windows_are_refused_with_file_line_and_field(write_scenario):
    # vLLM builds bounded-replay groups only for DeepSeek V4.1, whose windows all come from
    # its config's one sliding_window; the explorer's reproducer of two windows crashed in
    # the scheduler's "Prefix replay windows should agree" assert.
    path = write_scenario(REPLAY_GROUPS.replace("SECOND", "2").replace("REPLAYS", "true"))
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (5, "model.groups[1].sliding_window"), str(
        error
    )
    assert "differs from the 1 of the first bounded_replay group" in error.message, str(error)


@pytest.mark.parametrize(("second", "replays"), [("1", "true"), ("2", "false")])
def test_one_bounded_replay_window_loads(scenario_from, second, replays):
    # The same window twice beside a cacheable MLA group (DeepSeek V4.1's compressed layers),
    # or a second window without bounded replay (a plain DeepSeek-style sliding window beside
    # it), is a model vLLM can be configured with.
    text = REPLAY_GROUPS.replace("SECOND", second).replace("REPLAYS", replays)
    if replays == "true":
        text = text.replace("  groups:\n", "  groups:\n    - mla\n")
    scenario = scenario_from(text)
    windows = [g.options.get("sliding_window") for g in scenario.model.groups]
    assert windows[-2:] == [1, int(second)]


def test_only_bounded_replay_groups_are_refused_with_file_line_and_field(write_scenario):
    # Several groups, none prefix-cacheable: DeepSeek V4.1's SWA layers share one spec (one
    # group) and its other layers are a cacheable MLA group, so no vLLM model has it; the
    # explorer's reproducer (seed 0) crashed in HybridKVCacheCoordinator's "requires at
    # least one cacheable group" assert.
    path = write_scenario(REPLAY_GROUPS.replace("SECOND", "1").replace("REPLAYS", "true"))
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (
        5,
        "model.groups[1].bounded_replay",
    ), str(error)
    assert "all 2 groups are bounded_replay groups" in error.message, str(error)


def test_one_bounded_replay_group_alone_loads(scenario_from):
    # One group (a model of SWA layers only) is what vLLM builds for such a config: its
    # UnitaryKVCacheCoordinator takes a group left out of prefix caching.
    scenario = scenario_from(
        "kind: scheduler\nmodel:\n  groups:\n"
        "    - {type: sliding_window_mla, sliding_window: 1, bounded_replay: true}\n"
        "requests: {a: {prompt_len: 1}}\n"
    )
    assert scenario.model.groups[0].options["bounded_replay"] is True


# -- a Mamba group with prefix caching needs chunked prefill (vLLM's MambaModelConfig) -------

MAMBA_CACHING = """
kind: scheduler
model:
  enable_caching: CACHING
  groups: [full_attention, mamba]
scheduler:
  enable_chunked_prefill: false
  max_num_batched_tokens: 2048
requests: {a: {prompt_len: 17}}
"""


def test_mamba_prefix_caching_without_chunked_prefill_is_refused(write_scenario):
    # vLLM asserts "Chunked prefill is required for Mamba prefix caching." when it builds a
    # model with Mamba layers; the explorer's reproducer of the combination stalled a
    # multimodal request forever (the align split cuts a prompt that may not be cut).
    path = write_scenario(MAMBA_CACHING.replace("CACHING", "true"))
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert (error.where.line, error.where.field) == (6, "scheduler.enable_chunked_prefill"), str(
        error
    )
    assert "requires chunked prefill for Mamba prefix caching" in error.message, str(error)


def test_mamba_without_prefix_caching_may_turn_chunked_prefill_off(scenario_from):
    scenario = scenario_from(MAMBA_CACHING.replace("CACHING", "false"))
    assert scenario.scheduler is not None and not scenario.scheduler.enable_chunked_prefill


def test_mamba_prefix_caching_with_whole_mm_inputs_is_refused(write_scenario):
    # VllmConfig asserts "Chunked MM input is required" for Mamba "align": its chunk split
    # must be free to cut a chunk inside a multimodal input.
    text = MAMBA_CACHING.replace("CACHING", "true").replace(
        "  enable_chunked_prefill: false\n  max_num_batched_tokens: 2048\n",
        "  disable_chunked_mm_input: true\n",
    )
    with pytest.raises(ScenarioError) as info:
        load_file(write_scenario(text))
    error = info.value
    assert (error.where.line, error.where.field) == (6, "scheduler.disable_chunked_mm_input"), str(
        error
    )
    assert "Chunked MM input is required" in error.message, str(error)


def test_bounded_replay_beside_chunked_local_attention_is_refused(write_scenario):
    # No vLLM model has both (bounded replay is DeepSeek V4.1's); the explorer's reproducer
    # (seed 1) rewound an admission by the replay into a chunk already made null.
    path = write_scenario(
        """
        kind: scheduler
        model:
          groups:
            - {type: sliding_window_mla, sliding_window: 1, bounded_replay: true}
            - {type: chunked_local, attention_chunk_size: 16}
        requests: {a: {prompt_len: 17}}
        """
    )
    with pytest.raises(ScenarioError) as info:
        load_file(path)
    error = info.value
    assert error.where.line == 5 and "cannot go with a bounded_replay group" in error.message, str(
        error
    )


RETENTION = """
name: r
kind: {kind}
model:
  block_size: 16
  max_model_len: 512
  num_blocks: 64
  prefix_cache_retention_interval: 64
  groups: [{{type: full_attention, block_size: 32}}, {{type: sliding_window, sliding_window: 32}}]
{limits}
requests:
  a: {{prompt_len: 40}}
"""


def test_a_scheduler_scenario_states_a_retention_interval_and_per_group_block_sizes(
    scenario_from,
):
    scenario = scenario_from(
        RETENTION.format(
            kind="scheduler", limits="scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}"
        )
    )
    assert scenario.model.prefix_cache_retention_interval == 64
    assert "prefix_cache_retention_interval" in scenario.model.stated
    assert [g.block_size for g in scenario.model.groups] == [32, 16]
    assert scenario.model.scheduler_block_size == 32
    # The interval must be a multiple of the scheduler block size (vLLM's rule).
    with pytest.raises(ScenarioError, match="multiple"):
        scenario_from(
            RETENTION.replace("interval: 64", "interval: 48").format(
                kind="scheduler", limits="scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64}"
            )
        )


def test_an_engine_scenario_refuses_a_retention_interval(scenario_from):
    with pytest.raises(ScenarioError, match="trajectory and scheduler scenarios only"):
        scenario_from(RETENTION.format(kind="engine", limits="engine: {}"))
