"""The startup driver: a ``kind: startup`` scenario through vLLM's startup KV-cache planning.

A startup scenario has no requests and no steps. Its model's groups are the layers
of a model; :mod:`kvconform.oracles.startup` hands them, the profiled memory and
``num_gpu_blocks_override`` to vLLM's own planning (``get_kv_cache_configs``, as
``EngineCore._initialize_kv_caches`` calls it) and records whether vLLM accepted,
the pool it chose and ``max_model_len`` after auto-fit
(:class:`~kvconform.model.observations.StartupRecord`). The ``startup`` check
judges that record against one ``max_model_len`` request's floor.
"""

from __future__ import annotations

from kvconform.model.kinds import KINDS, Kind
from kvconform.model.observations import StartupRecord, Trajectory
from kvconform.model.scenario import Scenario
from kvconform.oracles.resolve import new_trajectory
from kvconform.oracles.startup import run_startup
from kvconform.oracles.vllm import Vllm


def drive_startup(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run vLLM's startup planning for a ``kind: startup`` scenario and record its decision."""
    trajectory = new_trajectory(scenario, vllm)
    trajectory.parties = KINDS[Kind.STARTUP].recorded
    record = run_startup(vllm, scenario)
    trajectory.startup = record
    trajectory.num_blocks = record.num_blocks or 0
    trajectory.notes.append(summary(record))
    return trajectory


def summary(record: StartupRecord) -> str:
    """One line: what the planning was handed and what it decided."""
    handed = f"{record.available_blocks} blocks of memory ({record.bytes_per_block} bytes each)"
    if record.override is not None:
        handed += f", num_gpu_blocks_override {record.override}"
    length = (
        f"max_model_len -1 (auto-fit from {record.original_max_model_len})"
        if record.auto_fit
        else f"max_model_len {record.original_max_model_len}"
    )
    groups = ", ".join(record.vllm_groups) or "none"
    if record.accepted:
        decided = f"accepted: a pool of {record.num_blocks} blocks"
        if record.auto_fit:
            decided += f", max_model_len {record.max_model_len}"
    else:
        decided = f"refused: {record.refusal}"
    return f"startup: vLLM's {record.function} with {handed}, {length}; groups {groups}; {decided}"
