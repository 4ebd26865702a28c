"""The eighth stop's unnamed stalls (docs/explore.md, "Triaged in the eighth stop"): three
errors of kvconform's recording, each with the piece of vLLM's scheduler it misread.

* The long-prefill threshold with chunked prefill off: vLLM up to 0.33.0 caps a chunk at it
  there too, 0.34.0 only with chunked prefill (``threshold_needs_chunked_prefill``,
  kvconform/oracles/vllm/scheduling_queues.py), so #22's and #26's stalls on 0.33.0 with
  chunked prefill off went unnamed.
* The stall's head: the request the waiting loop reaches first (``first_in_line``,
  kvconform/oracles/scheduler/stalls.py), requests holding KV blocks first and then the
  policy's order, not the scenario's order (#30 and #19 under the priority policy).
* Blocks of a request aborted while its KV load is in flight: held until the load reports
  done, so no preemption frees them (``StepQueues.deferred``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from packaging.version import Version

from kvconform.model.observations import ARRIVED_LOAD_BEHIND_FRESH_HEAD, ARRIVED_LOAD_BEHIND_HEAD
from kvconform.model.queue_facts import StepQueues
from kvconform.oracles.scheduler.stalls import arrived_load_cause, first_in_line
from kvconform.oracles.vllm.scheduling_queues import (
    _THRESHOLD_GATE,
    SchedulingQueues,
    _gates_threshold_on_chunked_prefill,
)

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios" / "scheduler"

# -- the long-prefill threshold with chunked prefill off -----------------------------------


class _Gated:
    """Scheduler.schedule as vLLM 0.34.0 writes the cap (abridged)."""

    def schedule(self, num_eligible_reqs: int) -> int:
        config = self.scheduler_config  # type: ignore[attr-defined]
        return (
            config.long_prefill_token_threshold
            if config.enable_chunked_prefill and num_eligible_reqs > 1
            else 0
        )


class _Ungated:
    """Scheduler.schedule as vLLM 0.33.0 writes the cap (abridged): no chunked-prefill test."""

    def schedule(self, num_eligible_reqs: int) -> int:
        config = self.scheduler_config  # type: ignore[attr-defined]
        return config.long_prefill_token_threshold if num_eligible_reqs > 1 else 0


class _AsyncGated(_Gated):
    """A subclass that wraps ``schedule`` (as AsyncScheduler may): the base's gate counts."""

    def schedule(self, num_eligible_reqs: int) -> int:
        return super().schedule(num_eligible_reqs)


def _scheduler(klass: type, chunked: bool, threshold: int = 1, eligible: int = 2) -> Any:
    scheduler: Any = klass()
    scheduler.scheduler_config = SimpleNamespace(
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=48,
    )
    scheduler.adaptive_long_prefill_threshold = False
    scheduler.get_request_counts = lambda: (1, eligible - 1)
    return scheduler


def test_the_threshold_gate_is_read_from_the_schedule_method_of_the_class_or_its_bases() -> None:
    assert _gates_threshold_on_chunked_prefill(_Gated)
    assert _gates_threshold_on_chunked_prefill(_AsyncGated)
    assert not _gates_threshold_on_chunked_prefill(_Ungated)
    assert not _gates_threshold_on_chunked_prefill(object)


def test_the_threshold_caps_a_chunk_without_chunked_prefill_only_where_vllm_does() -> None:
    """``long_prefill_cap``: 0.33.0 (no gate) caps at the threshold with chunked prefill off,
    as its Scheduler.schedule does; 0.34.0 (the gate) does not. With chunked prefill both
    cap, and with one request eligible neither (the cap lifted, 0.31.0 on)."""
    queues = object.__new__(SchedulingQueues)

    def cap(klass: type, chunked: bool, eligible: int = 2) -> int:
        scheduler = _scheduler(klass, chunked, eligible=eligible)
        config = SimpleNamespace(scheduler_config=scheduler.scheduler_config)
        return queues.long_prefill_cap(scheduler, config)

    assert cap(_Ungated, chunked=False) == 1
    assert cap(_Gated, chunked=False) == 0
    assert cap(_Ungated, chunked=True) == cap(_Gated, chunked=True) == 1
    assert cap(_Ungated, chunked=False, eligible=1) == 0


def test_the_installed_vllm_is_read_as_its_release_writes_the_gate() -> None:
    """The pattern matches the scheduler module of the installed vLLM from 0.34.0 on (the
    gate's text, read without importing vLLM), so the release is not taken for 0.33.0."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations))) / "v1/core/sched/scheduler.py"
    release = Version(Version(importlib.metadata.version("vllm")).base_version)
    found = _THRESHOLD_GATE.search(source.read_text()) is not None
    assert found is (release >= Version("0.34.0"))


# -- the stall's head ----------------------------------------------------------------------


def _oracle(policy: str, requests: dict[str, int], holding: list[str]) -> SimpleNamespace:
    """A stepping's state as ``first_in_line`` reads it: ``requests`` by name (scenario order)
    with their priorities, ``holding`` the names in ``kv_holding_waiting`` (its order)."""
    live = {rid: SimpleNamespace(request_id=rid, priority=p) for rid, p in requests.items()}
    return SimpleNamespace(
        limits=SimpleNamespace(policy=policy),
        scheduler=SimpleNamespace(requests=live, kv_holding_waiting=[live[rid] for rid in holding]),
        _stamps={rid: rank for rank, rid in enumerate(requests)},
    )


def test_the_stall_head_is_the_request_the_waiting_loop_reaches_first() -> None:
    # The explorer's 0.34.0 stall (seed 7): b (priority 1) listed before d (priority 0), both
    # holding KV blocks; d's load failed: d heads the loop, not b.
    oracle = _oracle("priority", {"b": 1, "d": 0, "e": 1}, holding=["b", "d"])
    assert first_in_line(oracle, ["b", "d", "e"]) == "d"
    # Requests holding KV blocks are drained first, whatever their priority (seed 12: b's
    # load arrived, a listed first and of the same priority, waits behind it).
    oracle = _oracle("priority", {"a": 0, "b": 0}, holding=["b"])
    assert first_in_line(oracle, ["a", "b"]) == "b"
    oracle = _oracle("priority", {"a": -1, "f": 1}, holding=["f"])
    assert first_in_line(oracle, ["a", "f"]) == "f"
    # Within the other queue, the policy's order: (priority, arrival_time).
    oracle = _oracle("priority", {"a": 2, "b": 0, "c": 1}, holding=[])
    assert first_in_line(oracle, ["a", "b", "c"]) == "b"
    # FCFS: kv_holding_waiting in its own order, then the scenario's order.
    oracle = _oracle("fcfs", {"a": 0, "b": 0, "c": 0}, holding=["c", "b"])
    assert first_in_line(oracle, ["a", "b", "c"]) == "c"
    oracle = _oracle("fcfs", {"a": 0, "b": 0}, holding=[])
    assert first_in_line(oracle, ["a", "b"]) == "a"
    assert first_in_line(oracle, []) is None


def test_a_priority_stall_behind_a_failed_load_names_its_head_and_cause(vllm) -> None:
    """#30 under the priority policy, run on vLLM: the failed load a (priority 0, listed
    second) heads b, whose load arrived; the stall names a and #30's cause."""
    from kvconform.harness.loader import load_file
    from kvconform.harness.runner import run_scenario
    from kvconform.model.results import Verdict

    (scenario,) = load_file(SCENARIOS / "sched-failed-load-heads-loaded-request-priority.yaml")
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.FAILED, result.error
    (stall,) = [f for f in result.failures if f.check == "capacity"]
    assert "request a:" in stall.message and "needs 10 blocks" in stall.message
    assert ARRIVED_LOAD_BEHIND_HEAD in stall.message


# -- blocks an aborted KV load holds ---------------------------------------------------------


def test_blocks_an_aborted_load_holds_are_not_the_running_requests_to_take(vllm) -> None:
    """sched-aborted-load-holds-blocks on vLLM: at the call where a needs the block d's
    aborted load still holds, a preempts itself and nothing is scheduled; the recording
    counts d's block as held back (neither free nor preemptible), and the scenario conforms."""
    from kvconform.harness.loader import load_file
    from kvconform.harness.runner import run_scenario
    from kvconform.model.results import Verdict

    (scenario,) = load_file(SCENARIOS / "sched-aborted-load-holds-blocks.yaml")
    recordings: list = []
    result = run_scenario(scenario, vllm, record=recordings.append)
    assert result.verdict is Verdict.PASSED, result.failures or result.error
    (recording,) = recordings
    calls = [f.what for f in recording.trajectory.facts if isinstance(f.what, StepQueues)]
    (empty,) = [q for q in calls if q.running and not any(t for t, _, _ in q.scheduled.values())]
    assert not empty.waiting and empty.free_before == 0
    assert empty.deferred == 1  # d's block, its load still in flight
    assert empty.pool - 1 == sum(r.held for r in empty.running) + empty.deferred


def _load_oracle(head: str, remote: set[str]) -> SimpleNamespace:
    """A stepping's state as ``arrived_load_cause`` reads it: b's load arrived and b holds 2
    blocks (of the null block 0 apart) in WAITING_FOR_REMOTE_KVS; ``remote`` the requests
    prefilled remotely."""
    tables = {"a": ((),), "b": ((0, 3, 4),)}
    return SimpleNamespace(
        _loaded={"b", head} & ({"b"} | remote),
        _loading={},
        _remote=remote,
        scheduler=SimpleNamespace(requests={"a": "a", "b": "b"}),
        api=SimpleNamespace(is_loading_remote_kv=lambda request: request == "b"),
        run=SimpleNamespace(null_block=0),
        manager=SimpleNamespace(get_block_ids=lambda rid: tables[rid]),
    )


def test_an_arrived_load_behind_a_head_names_whether_the_head_loaded() -> None:
    # #30: the head a is a load that failed as a whole (a remote prefill); #34 (0.28.0-0.30.0,
    # the explorer's seed-0 stall on 0.28.0): a never loaded KV and heads b under the priority
    # policy. a needs 3 blocks, 2 are free, b holds the 2 more it lacks.
    failed = _load_oracle("a", remote={"a", "b"})
    assert arrived_load_cause(failed, "a", 3, 2) == ARRIVED_LOAD_BEHIND_HEAD
    fresh = _load_oracle("a", remote={"b"})
    assert arrived_load_cause(fresh, "a", 3, 2) == ARRIVED_LOAD_BEHIND_FRESH_HEAD
    # A head that fits the free blocks is no such stall.
    assert arrived_load_cause(fresh, "a", 2, 2) == ""
