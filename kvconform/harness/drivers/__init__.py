"""The scenario drivers: each steps one kind of scenario through its parties and records.

A driver is a function from a :class:`~kvconform.model.scenario.Scenario` and the
loaded vLLM to a :class:`~kvconform.model.observations.Trajectory`. It asks the
parties in :mod:`kvconform.oracles` (the live allocator, the predictor, the
recorded warmup, vLLM's scheduler, vLLM's startup planning), each of which builds
what it needs from the scenario's model, and records one observation per step,
request and group (a startup scenario: vLLM's one planning decision). It judges
nothing: the checks read the trajectory afterwards.

:data:`DRIVERS` has one driver per kind in :data:`kvconform.model.scenario.KINDS`.
"""

from __future__ import annotations

from typing import Protocol

from kvconform.harness.drivers.engine import drive_engine
from kvconform.harness.drivers.scheduler import drive_scheduler
from kvconform.harness.drivers.startup import drive_startup
from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.drivers.warmup import drive_warmup
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import KINDS, Scenario
from kvconform.oracles.vllm import Vllm

__all__ = ["DRIVERS", "Driver"]


class Driver(Protocol):
    def __call__(self, scenario: Scenario, vllm: Vllm, /) -> Trajectory: ...


DRIVERS: dict[str, Driver] = {
    "trajectory": drive,
    "warmup": drive_warmup,
    "scheduler": drive_scheduler,
    "engine": drive_engine,
    "startup": drive_startup,
}
assert tuple(DRIVERS) == KINDS, "every scenario kind has exactly one driver"
