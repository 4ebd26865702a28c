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

from kvconform.model.facts import AdmissionHit
from kvconform.model.kinds import KINDS
from kvconform.model.observations import Trajectory
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


def _missed_hits(trajectory: Trajectory) -> dict[tuple[int, str], int]:
    """(step, request) -> the index in ``trajectory.facts`` of each stated hit not given."""
    return {
        (fact.step, fact.request): index
        for index, fact in enumerate(trajectory.facts)
        if isinstance(fact.what, AdmissionHit) and fact.what.hit != fact.what.stated
    }


def name_deciding_settings(
    scenario: Scenario,
    trajectory: Trajectory,
    vllm: Vllm,
    record: SettingsRecord | None,
    drive: Callable[[Scenario, Vllm], Trajectory],
) -> None:
    """Record, on each missed stated hit that a setting denied, the setting and the value
    that gives the hit (``AdmissionHit.decided_by``, which the allocator check reports)."""
    missed = _missed_hits(trajectory)
    if not missed or not KINDS[scenario.kind].builds_manager:
        return
    for name, value, other in _alternatives(scenario):
        try:
            again = drive(replace(scenario, model=replace(scenario.model, **{name: other})), vllm)
        except Exception:  # noqa: BLE001 - the setting changed, vLLM refused: no answer here
            continue
        reached = {(o.step, o.request) for o in again.observations}
        still = _missed_hits(again)
        stated = record is not None and name in record.stated
        source = "stated" if stated else f"vLLM {vllm.version}'s default, left out"
        for key, index in missed.items():
            fact = trajectory.facts[index]
            hit = fact.what
            assert isinstance(hit, AdmissionHit)  # what _missed_hits chose
            if key not in reached or key in still or hit.decided_by:
                continue
            decided = (
                f"decided by the setting {name}: {_shown(value)} ({source}): with "
                f"{name}: {_shown(other)}, vLLM's manager gives the stated hit"
            )
            trajectory.facts[index] = fact._replace(what=hit._replace(decided_by=decided))
