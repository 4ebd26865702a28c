"""Building vLLM's scheduler for a ``kind: scheduler`` scenario: its ``ModelConfig`` and
``SpeculativeConfig`` (on kvconform's config-only model folders, built once per process and
handed out as deep copies), the ``VllmConfig`` an engine with the scenario's limits would
build, and the ``Scheduler`` / ``AsyncScheduler`` itself."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, NamedTuple

from kvconform.errors import NotOffered, VllmUnavailable
from kvconform.model.methods import method_for
from kvconform.model.scenario import Scenario
from kvconform.model.tiny_model import SCHEDULER_TARGET
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.tiny_models import model_folder
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.messages import first_line
from kvconform.oracles.vllm.scheduling import Scheduling

# Built once per process: vLLM's first ModelConfig / SpeculativeConfig inspects model
# architectures (seconds).
_CONFIGS: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def model_and_speculative_config(
    vllm: Vllm, scenario: Scenario, method: str | None
) -> tuple[Any, Any]:
    """``(ModelConfig, SpeculativeConfig | None)`` for a scenario: fresh copies of cached ones."""
    spec = scenario.speculative
    assert scenario.scheduler is not None
    entry = method_for(method)
    target_model = entry.target if entry is not None else SCHEDULER_TARGET
    extra = dict(target_model.extra)
    if entry is not None and entry.mtp_modules:
        extra["num_nextn_predict_layers"] = scenario.scheduler.num_nextn_predict_layers
    if spec is not None and not spec.sample_from_anchor:
        extra["sample_from_anchor"] = False  # DSpark's fill-in layout
    target = str(model_folder(replace(target_model, extra=extra)))
    draft_model = entry.draft if entry is not None and spec is not None else None
    draft = str(model_folder(draft_model)) if draft_model is not None else None
    max_model_len = scenario.model.max_model_len
    k = spec.num_speculative_tokens if spec is not None else 0
    # SpeculativeConfig's switch back to EAGLE's trailing-block drop (0.33); releases
    # without it always drop under prefix caching.
    no_hashes = spec is not None and spec.disable_lookahead_block_hashes
    key = (vllm.location, target, draft, method, k, max_model_len, no_hashes)
    if key not in _CONFIGS:
        api = vllm.part(Scheduling)
        try:
            model_config = api.model_config(target, max_model_len)
        except Exception as exc:  # noqa: BLE001 - vLLM refusing the tiny model
            raise VllmUnavailable(
                vllm.version, "a ModelConfig for kvconform's config-only model", first_line(exc)
            ) from None
        speculative = None
        if spec is not None and method is not None:
            options = dict(entry.speculative_options) if entry is not None else {}
            if draft is not None:
                options["model"] = draft
            if no_hashes:
                options["disable_lookahead_block_hashes"] = True
            try:
                speculative = api.model_speculative_config(model_config, method, k, **options)
            except Exception as exc:  # noqa: BLE001 - the method cannot be built here
                # Not NotOffered: what fails here is this machine as often as the release
                # (a drafter's package missing, the architecture inspection's subprocess).
                raise VllmUnavailable(
                    vllm.version,
                    f"a SpeculativeConfig for method {method!r} in scheduler mode",
                    first_line(exc),
                ) from None
        _CONFIGS[key] = (model_config, speculative)
    # One deepcopy of the pair keeps the draft's reference to its target config.
    return copy.deepcopy(_CONFIGS[key])


class BuiltScheduler(NamedTuple):
    """vLLM's scheduler for a scenario, with what the stepping reads of its configuration."""

    config: Any  # VllmConfig
    scheduler: Any  # Scheduler / AsyncScheduler
    block_size: int  # the scheduler's block size
    hash_block_size: int  # the block size of the requests' block hashes
    max_concurrent_batches: int
    model_runner: str  # the model runner the configuration was built for


def mamba_cache_mode(scenario: Scenario) -> str | None:
    """The mode of the scenario's Mamba groups (``mamba_cache_mode``), None without one."""
    return next(
        (
            str(g.options["mamba_cache_mode"])
            for g in scenario.model.groups
            if g.options.get("mamba_cache_mode") is not None
        ),
        None,
    )


def build_scheduler(
    vllm: Vllm, scenario: Scenario, num_speculative_tokens: int, method: str | None
) -> BuiltScheduler:
    """The scheduler an engine with the scenario's model, limits and method would build.

    vLLM refusing the configuration is :class:`NotOffered` (the loader checked vLLM's generic
    limits; what is left is a method, mode or combination this release does not run); the
    scheduler's constructor raising on a configuration vLLM accepted is a finding, and
    propagates.
    """
    limits, model = scenario.scheduler, scenario.model
    assert limits is not None
    api = vllm.part(Scheduling)
    model_config, speculative = model_and_speculative_config(vllm, scenario, method)
    where = limits.where or scenario.where.at("scheduler")
    kv_specs = group_specs(vllm, model, num_speculative_tokens)
    # As vLLM's engine core builds it: the retention interval from the cache config.
    kv_cache_config = vllm.kv_cache_config(
        model.num_blocks,
        kv_specs,
        prefix_cache_retention_interval=model.prefix_cache_retention_interval,
    )
    with api.model_runner(limits.model_runner):
        try:
            config = api.scheduler_vllm_config(
                model_config,
                speculative,
                model,
                limits,
                num_blocks=model.num_blocks,
                remote_prefill=any(r.remote_prefill for r in scenario.requests.values()),
                mamba_cache_mode=mamba_cache_mode(scenario),
            )
            block_size, hash_block_size = api.kv_block_sizes(kv_cache_config, config)
            max_concurrent_batches = api.max_concurrent_batches(config)
            runner_name = api.model_runner_name(config)
        except VllmUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM refusing the configuration
            # The loader checked vLLM's generic limits; what is left is a method,
            # mode or combination this release does not run.
            raise NotOffered(
                vllm.version, f"support for these settings ({where})", first_line(exc)
            ) from None
        # Raising here, on a configuration vLLM accepted, is a finding (a crash).
        scheduler = api.new_scheduler(
            config,
            kv_cache_config,
            block_size,
            hash_block_size,
            log_stats=limits.log_stats,
        )
    return BuiltScheduler(
        config, scheduler, block_size, hash_block_size, max_concurrent_batches, runner_name
    )
