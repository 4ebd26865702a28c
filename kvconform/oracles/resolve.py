"""What a scenario means on the loaded vLLM: its lookahead, and its groups as vLLM specs.

Every party starts from the same two answers, so they are given once, here:

* :func:`new_trajectory` -- an empty :class:`Trajectory` for the scenario, with
  its lookahead resolved (a scenario override, else vLLM's
  ``VllmConfig.num_lookahead_tokens``, else kvconform's own table, and which of
  the three it was), the floor's lookahead (kvconform's table: what the drafter
  writes) and, per group, the inputs its floor rule reads off the vLLM spec;
* :func:`group_specs` -- the ``KVCacheSpec`` of each group, which each party
  builds for itself from the scenario's model.

An unknown method is the scenario's error (file, line, field), not vLLM's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvconform.errors import NotOffered, ScenarioError, did_you_mean
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import expected_lookahead, method_for
from kvconform.model.observations import GroupInfo, Trajectory
from kvconform.model.scenario import GroupSpec, ModelSpec, Scenario
from kvconform.model.settings import SETTINGS, SettingsRecord
from kvconform.oracles.vllm import Vllm

__all__ = [
    "extra_retained_tokens",
    "group_specs",
    "new_trajectory",
    "resolve_settings",
    "spec_options",
]


def resolve_settings(scenario: Scenario, vllm: Vllm) -> tuple[Scenario, SettingsRecord]:
    """The scenario with every setting it leaves out set to vLLM's default for this release.

    What the file states wins; the record says what ran, vLLM's defaults, and which
    settings the scenario chose (kvconform.model.settings).
    """
    defaults = vllm.default_settings()
    # EngineArgs leaves prefix caching to the model: on unless its attention type
    # does not support it (encoder-decoder, attention-free).
    supported = vllm.prefix_caching_default(scenario.model.attn_type)
    if supported is not None:
        defaults["enable_caching"] = supported
    k = scenario.speculative.num_speculative_tokens if scenario.speculative is not None else 0
    if defaults.get("enable_caching") and not any(
        vllm.prefix_cacheable(spec) for spec in group_specs(vllm, scenario.model, k)
    ):
        # vLLM's hybrid coordinator needs a prefix-cacheable group; a model without one
        # (R-SWA alone, ...) is one whose config turns prefix caching off.
        defaults["enable_caching"] = False
    kind_settings = [s for s in SETTINGS.values() if scenario.kind in s.kinds]
    stated = set(scenario.model.stated)
    implied = caching_implied_by_groups(scenario.model)
    if implied and not defaults.get("enable_caching"):
        implied = None  # vLLM turns caching off for this model: a stated align stays as stated
    if implied is not None and "enable_caching" not in stated:
        # A stated Mamba "none" is vLLM's configuration with prefix caching off.
        scenario = replace(
            scenario,
            model=replace(scenario.model, enable_caching=implied,
                          stated=scenario.model.stated | {"enable_caching"}),
        )  # fmt: skip
        stated.add("enable_caching")
    if scenario.scheduler is not None:
        stated |= scenario.scheduler.stated
    if scenario.engine is not None:
        stated |= scenario.engine.stated
    values: dict[str, Any] = {}
    for setting in kind_settings:
        if setting.name in stated:
            values[setting.name] = _stated_value(scenario, setting.name)
        elif setting.name in defaults:
            values[setting.name] = defaults[setting.name]
    # dataclasses.replace only where something changes: each builds and validates a whole
    # spec again, and this runs once per scenario run.
    model = scenario.model
    taken = {
        name: values[name]
        for name in ("enable_caching", "prefix_cache_retention_interval",
                     "scheduler_reserve_full_isl")
        if name in values and name not in model.stated
    }  # fmt: skip
    if any(
        type(getattr(model, name)) is not type(value) or getattr(model, name) != value
        for name, value in taken.items()
    ):
        model = replace(model, **taken)
    groups = _groups_following_caching(model)
    if any(new is not old for new, old in zip(groups, model.groups, strict=True)):
        model = replace(model, groups=groups)
    resolved = scenario if model is scenario.model else replace(scenario, model=model)
    if scenario.scheduler is not None:
        resolved = replace(
            resolved,
            spec=replace(
                scenario.scheduler,
                enable_chunked_prefill=bool(values.get("enable_chunked_prefill", True)),
                mode=scenario.scheduler.mode
                if "async_scheduling" in stated
                else ("overlapped" if values.get("async_scheduling", True) else "sync"),
            ),
        )
    record = SettingsRecord(
        values=values,
        defaults={name: defaults.get(name) for name in values},
        stated=frozenset(stated & set(values)),
    )
    return resolved, record


def caching_implied_by_groups(model: ModelSpec) -> bool | None:
    """The prefix-caching setting a group's stated option implies (Option.follows_caching:
    vLLM derives Mamba's cache mode from prefix caching), or None."""
    for group in model.groups:
        for name in group.stated:
            follows = GROUP_TYPES[group.type].options[name].follows_caching
            if follows is None:
                continue
            for caching, value in follows.items():
                if group.options.get(name) == value:
                    return caching
    return None


def _groups_following_caching(model: ModelSpec) -> tuple[GroupSpec, ...]:
    """The groups with their caching-following options set as vLLM derives them."""
    groups = []
    for group in model.groups:
        options = dict(group.options)
        for name, option in GROUP_TYPES[group.type].options.items():
            if option.follows_caching is not None and name not in group.stated:
                options[name] = option.follows_caching[model.enable_caching]
        groups.append(replace(group, options=options) if options != group.options else group)
    return tuple(groups)


def _stated_value(scenario: Scenario, name: str) -> Any:
    if name in scenario.model.stated:
        return getattr(scenario.model, name)
    if scenario.scheduler is not None and name in scenario.scheduler.stated:
        if name == "async_scheduling":
            return scenario.scheduler.async_scheduling
        return getattr(scenario.scheduler, name)
    assert scenario.engine is not None
    return getattr(scenario.engine, name)


def new_trajectory(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """The scenario's empty trajectory: lookahead resolved, groups described for the floor."""
    trajectory = _resolve_lookahead(scenario, vllm)
    model = scenario.model
    for group in model.groups:
        if group.eagle_group and not (
            trajectory.method is not None
            and vllm.eagle_block_drop(
                trajectory.method, trajectory.num_speculative_tokens, trajectory.sample_from_anchor
            )
        ):
            where = group.where or scenario.where
            raise ScenarioError(
                where.at(f"{where.field}.eagle_group"),
                "vLLM flags a group as an EAGLE group only when the speculative method drops "
                f"the trailing prefix-cache block (use_eagle_block_drop()); {trajectory.method!r} does not",
            )
    entry = method_for(trajectory.method)
    if extra_retained_tokens(model) and not (entry is not None and entry.mtp_modules):
        group = next(g for g in model.groups if g.options.get("extra_retained_tokens"))
        where = group.where or scenario.where
        raise ScenarioError(
            where.at(f"{where.field}.extra_retained_tokens"),
            "needs speculative.method mtp (or an MTP variant): vLLM sets it only for "
            f"multi-module MTP, not for {trajectory.method!r}",
        )
    specs = group_specs(vllm, model, trajectory.num_speculative_tokens)
    trajectory.groups = tuple(
        replace(
            info,
            floor_args=dict(
                block_size=group.block_size,
                max_model_len=model.max_model_len,
                dcp_world_size=model.dcp_world_size if vllm.dcp_sharded(spec) else 1,
                num_speculative_blocks=int(getattr(spec, "num_speculative_blocks", 0) or 0),
                mamba_cache_mode=str(getattr(spec, "mamba_cache_mode", "none")),
                num_prefill_checkpoint_blocks=int(
                    getattr(spec, "num_prefill_checkpoint_blocks", 0) or 0
                ),
            ),
            read_span=_read_span(group),
            replay_tokens=group.replay_tokens,
            manager=managed[0] if managed else None,
            manager_file=managed[1] if managed else None,
        )
        for info, group, spec, managed in zip(
            trajectory.groups,
            model.groups,
            specs,
            [vllm.manager_class(spec) for spec in specs],
            strict=True,
        )
    )
    return trajectory


def spec_options(group: GroupSpec, num_speculative_tokens: int) -> dict[str, Any]:
    """The options ``group``'s vLLM spec is built with.

    A group type with speculative state blocks (``GroupType.speculative_blocks``:
    Mamba) left unset gets one per speculative token, as vLLM's config does for
    Mamba models under speculative decoding.
    """
    options = dict(group.options)
    speculative_blocks = GROUP_TYPES[group.type].speculative_blocks
    if speculative_blocks is not None and options.get(speculative_blocks) is None:
        options[speculative_blocks] = num_speculative_tokens
    return options


def extra_retained_tokens(model: ModelSpec) -> int:
    """The sliding windows' ``extra_retained_tokens`` (the loader makes them all alike), or 0."""
    values = [int(g.options.get("extra_retained_tokens") or 0) for g in model.groups]  # type: ignore[call-overload]
    return max(values, default=0)


def _read_span(group: GroupSpec) -> tuple[str, int] | None:
    """The span of positions a step of this group must find in real blocks, with its size.

    GroupType.reads; a sliding window's ``extra_retained_tokens`` widen it: vLLM keeps
    those tokens below the window readable (``SlidingWindowSpec.num_retained_tokens``
    is ``sliding_window - 1 + extra_retained_tokens``) for multi-module MTP's re-prefill.
    """
    reads = GROUP_TYPES[group.type].reads
    if reads is None:
        return None
    kind, option = reads
    size = int(group.options[option])  # type: ignore[call-overload]
    if kind == "window":
        size += int(group.options.get("extra_retained_tokens") or 0)  # type: ignore[call-overload]
    return kind, size


def group_specs(vllm: Vllm, model: ModelSpec, num_speculative_tokens: int) -> list[Any]:
    """vLLM ``KVCacheSpec``s for the model's groups, in order."""
    return vllm.build_specs(
        [(g.type, g.block_size, spec_options(g, num_speculative_tokens)) for g in model.groups]
    )


def _resolve_lookahead(scenario: Scenario, vllm: Vllm) -> Trajectory:
    model, spec = scenario.model, scenario.speculative
    groups = tuple(
        GroupInfo(i, g.type, g.block_size, g.label, GROUP_TYPES[g.type].holds_null)
        for i, g in enumerate(model.groups)
    )
    if spec is None:
        # Nothing drafts: the contract's lookahead is 0. vLLM's own answer is asked
        # all the same, so that the lookahead check sees a release that reserves more.
        return Trajectory(
            groups,
            0,
            "no speculative decoding",
            model.max_model_len,
            expected_lookahead=0,
            vllm_lookahead=vllm.lookahead(None, 0),
            floor_lookahead=0,
        )
    declared = vllm.declared_methods()
    if spec.method not in declared and method_for(vllm.canonical_method(spec.method)) is not None:
        # A method kvconform knows, from another release: this one does not offer it.
        raise NotOffered(
            vllm.version,
            f"speculative method {spec.method!r}",
            "it declares " + ", ".join(declared),
        )
    if spec.method not in declared:
        where = spec.where or scenario.where.at("speculative.method")
        meant = did_you_mean(spec.method, declared)
        raise ScenarioError(
            where,
            f"unknown speculative method {spec.method!r}"
            + (f" (did you mean {meant!r}?)" if meant else "")
            + f"; vLLM {vllm.version} declares: "
            + ", ".join(declared),
        )
    method = vllm.canonical_method(spec.method)
    k, anchor = spec.num_speculative_tokens, spec.sample_from_anchor
    vllm_value = vllm.lookahead(method, k, anchor)
    expected = expected_lookahead(method, k, anchor)
    if spec.num_lookahead_tokens is not None:
        lookahead, source = spec.num_lookahead_tokens, "scenario override"
    elif vllm_value is not None:
        lookahead, source = vllm_value, "VllmConfig.num_lookahead_tokens"
    elif expected is not None:
        lookahead = expected
        source = f"kvconform's table (vLLM {vllm.version} has no VllmConfig.num_lookahead_tokens)"
    else:
        raise ScenarioError(
            spec.where or scenario.where,
            f"no lookahead for {spec.method!r}: vLLM {vllm.version} has no "
            "VllmConfig.num_lookahead_tokens and kvconform's table lacks the method; "
            "set speculative.num_lookahead_tokens",
        )
    return Trajectory(
        groups,
        lookahead,
        source,
        model.max_model_len,
        method=method,
        num_speculative_tokens=k,
        sample_from_anchor=anchor,
        disable_lookahead_block_hashes=spec.disable_lookahead_block_hashes,
        vllm_lookahead=vllm_value,
        floor_lookahead=(
            spec.num_lookahead_tokens
            if spec.num_lookahead_tokens is not None
            else expected
            if expected is not None
            else lookahead
        ),
        expected_lookahead=expected,
    )
