"""The startup party: vLLM's own startup KV-cache planning, as the engine core runs it.

Before an engine serves anything, ``EngineCore._initialize_kv_caches`` turns the
workers' KV-cache specs and the profiled memory into the pool the scheduler gets,
and decides whether one request of ``max_model_len`` fits it at all (vLLM refuses
to start otherwise, or, with ``--max-model-len -1``, lowers ``max_model_len`` until
it fits). A pool that vLLM accepts but that cannot hold such a request starts an
engine that admits the request and never schedules it.

This party builds what the engine core hands that planning, from a
``kind: startup`` scenario, and records what vLLM decided:

* the ``VllmConfig`` of a config-only decoder (scheduler mode's tiny model, its
  ``max_position_embeddings`` the scenario's ``max_model_len``; ``max_model_len``
  -1 for auto-fit) with the scenario's block size, prefix caching and
  ``num_gpu_blocks_override``;
* the model's layers: one per scenario group, each with the group's vLLM spec
  (:func:`kvconform.oracles.resolve.group_specs`), named as a decoder's layers;
* the profiled memory: ``startup.available_blocks`` pool blocks of vLLM's own
  bytes per block;

and hands them to vLLM's planning (:class:`kvconform.oracles.vllm.planning.Planning`:
the layout, the grouping, ``get_kv_cache_configs``). The groups vLLM forms must be
the scenario's, type by type and block size by block size, or the floor would judge
groups vLLM does not have: otherwise the scenario is wrong (an input error).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from kvconform.errors import NotOffered, ScenarioError, VllmUnavailable
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kind_specs import SchedulerSpec
from kvconform.model.observations import StartupRecord
from kvconform.model.scenario import Scenario
from kvconform.model.tiny_model import SCHEDULER_TARGET
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.tiny_models import model_folder
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.planning import Planning, PlanResult
from kvconform.oracles.vllm.scheduling import Scheduling

# ModelConfigs built once per process (vLLM inspects the architecture the first time).
_MODEL_CONFIGS: dict[tuple[Any, ...], Any] = {}


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Value error,"):
            return line.removeprefix("Value error,").split(" [type=")[0].strip()
    return lines[0] if lines else type(exc).__name__


def startup_config(vllm: Vllm, scenario: Scenario) -> Any:
    """The ``VllmConfig`` the engine core plans with, before it has a pool."""
    model, startup = scenario.model, scenario.startup
    assert startup is not None
    api = vllm.part(Scheduling)
    folder = str(
        model_folder(replace(SCHEDULER_TARGET, max_position_embeddings=model.max_model_len))
    )
    length = -1 if startup.auto_fit else model.max_model_len
    key = (vllm.location, folder, length)
    if key not in _MODEL_CONFIGS:
        try:
            _MODEL_CONFIGS[key] = api.model_config(folder, length)
        except Exception as exc:  # noqa: BLE001 - vLLM refusing the tiny model
            raise VllmUnavailable(
                vllm.version, "a ModelConfig for kvconform's config-only model", _first_line(exc)
            ) from None
    # The engine's default scheduler limits, synchronous; the planning reads the pool and
    # the model, not the KV-cache events a router would be told of (left off, as vLLM's).
    limits = SchedulerSpec(mode="sync")
    try:
        return api.scheduler_vllm_config(
            copy.deepcopy(_MODEL_CONFIGS[key]),
            None,
            replace(model, kv_cache_events=False),
            limits,
            num_blocks=None,
            num_gpu_blocks_override=startup.num_gpu_blocks_override,
        )
    except Exception as exc:  # noqa: BLE001 - vLLM refusing the configuration
        raise NotOffered(
            vllm.version, f"support for these settings ({startup.where or scenario.where})",
            _first_line(exc),
        ) from None  # fmt: skip


def model_layers(vllm: Vllm, scenario: Scenario) -> dict[str, Any]:
    """The model's layers: one per group, with the group's vLLM spec, in the groups' order."""
    specs = group_specs(vllm, scenario.model, 0)
    return {
        f"model.layers.{i}.{'self_attn' if GROUP_TYPES[g.type].attention else 'mixer'}": spec
        for i, (g, spec) in enumerate(zip(scenario.model.groups, specs, strict=True))
    }


def run_startup(vllm: Vllm, scenario: Scenario) -> StartupRecord:
    """Run vLLM's startup planning for a ``kind: startup`` scenario and record its decision."""
    model, startup = scenario.model, scenario.startup
    assert startup is not None
    config = startup_config(vllm, scenario)
    result = vllm.part(Planning).plan(
        config, model_layers(vllm, scenario), startup.available_blocks
    )
    _require_one_group_each(scenario, result)
    return StartupRecord(
        accepted=result.accepted,
        function=result.function,
        max_model_len=result.max_model_len,
        original_max_model_len=model.max_model_len,
        available_blocks=startup.available_blocks,
        bytes_per_block=result.bytes_per_block,
        num_blocks=result.num_blocks,
        refusal=result.refusal,
        override=startup.num_gpu_blocks_override,
        auto_fit=startup.auto_fit,
        vllm_groups=tuple(g.label for g in result.groups),
        expect=startup.expect,
        expect_max_model_len=startup.expect_max_model_len,
        line=startup.where.line if startup.where else scenario.line,
    )


def _require_one_group_each(scenario: Scenario, result: PlanResult) -> None:
    """vLLM's groups are the scenario's: one per group, of its spec class and block size."""
    wanted = [(GROUP_TYPES[g.type].vllm_class, g.block_size) for g in scenario.model.groups]
    got = [(g.spec_class, g.block_size) for g in result.groups]
    if wanted != got:
        raise ScenarioError(
            scenario.where.at("model.groups"),
            "vLLM's startup planning groups these layers as "
            + ", ".join(g.label for g in result.groups)
            + ", not one group per scenario group ("
            + ", ".join(f"{cls}(block {size})" for cls, size in wanted)
            + "): the floor would judge groups vLLM does not have; use distinct group types "
            "whose pages vLLM can unify without changing a block size",
        )
