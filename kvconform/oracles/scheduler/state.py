"""What the scheduler oracle's helpers read and advance of it (:class:`OracleState`): the
recording modules of this package take the oracle as this protocol, so that none of them
imports :mod:`.stepping`, which imports them all."""

from __future__ import annotations

from typing import Any, Protocol

from kvconform.model.scenario import Scenario, SchedulerSpec
from kvconform.oracles.scheduler.records import SchedulerRun
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.scheduling import Scheduling


class OracleState(Protocol):
    """The state of :class:`~kvconform.oracles.scheduler.stepping.SchedulerOracle` that its
    helpers share: vLLM and its scheduler, the scenario, the run being recorded and the
    engine loop's counters."""

    vllm: Vllm
    api: Scheduling
    config: Any  # the VllmConfig the scheduler was built with
    scenario: Scenario
    limits: SchedulerSpec  # the scenario's scheduler section
    scheduler: Any  # vLLM's Scheduler / AsyncScheduler
    manager: Any  # its KVCacheManager
    connector_hits: dict[str, int]  # the local hit last shown the KV connector, per request
    freed_since_zeroing: set[str]  # requests whose blocks were freed since the last list
    run: SchedulerRun
    num_spec: int  # speculative tokens per step (0: none)
    _step: int  # schedule() calls made
    _current: int  # the ongoing or latest schedule() call
    _paused: bool  # the engine's pause for new requests is on
    _remote: set[str]  # the requests prefilled remotely
    _loaded: set[str]  # began loading remote KV, not scheduled since
    _loading: dict[str, int]  # KV loads in flight: steps until received
    _zeroed_groups: list[int] | None  # the groups whose new blocks vLLM zeroes
    _added: dict[str, int]  # the order requests were handed to the scheduler
    _stamps: dict[str, int]  # the rank of each request's Request.arrival_time
