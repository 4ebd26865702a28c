"""The scenario drivers: each steps one kind of scenario through its parties and records.

A driver is a function from a :class:`~kvconform.model.scenario.Scenario` and the
loaded vLLM to a :class:`~kvconform.model.observations.Trajectory`. It asks the
parties in :mod:`kvconform.oracles` (the live allocator, the predictor, the
recorded warmup, vLLM's scheduler, vLLM's startup planning), each of which builds
what it needs from the scenario's model, and records one observation per step,
request and group (a startup scenario: vLLM's one planning decision). It judges
nothing: the checks read the trajectory afterwards.

:data:`DRIVERS` registers one driver per kind of :data:`kvconform.model.kinds.KINDS`
(the kind's entry cannot name it: the model layer does not import the drivers).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from kvconform.harness.drivers.engine import drive_engine
from kvconform.harness.drivers.scheduler import drive_scheduler
from kvconform.harness.drivers.startup import drive_startup
from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.drivers.warmup import drive_warmup
from kvconform.model.kinds import KINDS, Kind
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm

__all__ = ["DRIVERS", "Driver"]


class Driver(Protocol):
    def __call__(self, scenario: Scenario, vllm: Vllm, /) -> Trajectory: ...


# Keyed by Kind; looked up by a scenario's kind or the name a report keeps.
DRIVERS: Mapping[str, Driver] = MappingProxyType(
    {
        Kind.TRAJECTORY: drive,
        Kind.WARMUP: drive_warmup,
        Kind.SCHEDULER: drive_scheduler,
        Kind.ENGINE: drive_engine,
        Kind.STARTUP: drive_startup,
    }
)
assert set(DRIVERS) == set(KINDS), "every scenario kind has exactly one driver"
