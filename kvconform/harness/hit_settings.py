"""Which setting decided a prefix-cache hit the scenario states and vLLM did not give.

A stated ``expect_hit`` that vLLM's manager does not give fails ``sanity``; but where a
setting denies it (prefix caching off; sparse retention, vLLM's default from 0.29 on,
keeping no state where a sliding-window or Mamba hit would end), the hit is not the
allocator's to answer for, and the message must say so. So the runner asks vLLM itself:
it runs the scenario again with one setting changed (prefix caching on; dense retention,
``null``), and where the same call then gets the stated hit, the failure names the
setting, the value it ran with and who chose it (the scenario or vLLM's default for the
release), and the value that gives the stated hit. Only trajectory scenarios with such a
miss pay for the second run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from kvconform.model.observations import HIT_MISSED, Trajectory
from kvconform.model.scenario import Scenario
from kvconform.model.settings import SettingsRecord
from kvconform.oracles.vllm import Vllm


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _alternatives(scenario: Scenario) -> Iterator[tuple[str, Any, Any]]:
    """(setting, the value it ran with, the value that may give the hit)."""
    model = scenario.model
    if not model.enable_caching:
        yield "enable_caching", False, True
    elif model.prefix_cache_retention_interval is not None:
        yield "prefix_cache_retention_interval", model.prefix_cache_retention_interval, None


def name_deciding_settings(
    scenario: Scenario,
    trajectory: Trajectory,
    vllm: Vllm,
    record: SettingsRecord | None,
    drive: Callable[[Scenario, Vllm], Trajectory],
) -> None:
    """Amend each missed stated hit that a setting denied with the setting and the value
    that gives the hit (in ``trajectory.misses``)."""
    missed = [m for m in trajectory.misses if m.invariant == HIT_MISSED]
    if not missed or scenario.kind != "trajectory":
        return
    for name, value, other in _alternatives(scenario):
        try:
            again = drive(replace(scenario, model=replace(scenario.model, **{name: other})), vllm)
        except Exception:  # noqa: BLE001 - the setting changed, vLLM refused: no answer here
            continue
        reached = {(o.step, o.request) for o in again.observations}
        still = {(m.step, m.request) for m in again.misses if m.invariant == HIT_MISSED}
        stated = record is not None and name in record.stated
        source = "stated" if stated else f"vLLM {vllm.version}'s default, left out"
        for index, miss in enumerate(trajectory.misses):
            key = (miss.step, miss.request)
            if miss.invariant != HIT_MISSED or key not in reached or key in still:
                continue
            if "decided by" in miss.message:
                continue
            trajectory.misses[index] = miss._replace(
                message=f"{miss.message}; decided by the setting {name}: {_shown(value)} "
                f"({source}): with {name}: {_shown(other)}, vLLM's manager gives the stated hit"
            )
