"""The ``model`` and ``speculative`` sections: groups, pool, lengths and the method.

Group types and their options come from the group-type registry
(:mod:`kvconform.model.group_types`). A field that is one of vLLM's settings
(:data:`kvconform.model.settings.SETTINGS`: prefix caching, the retention
interval, full-sequence admission) is recorded as stated when the file says it;
left out, it takes vLLM's default for the release under test when the scenario
runs. Every other field left out takes :data:`MODEL_DEFAULTS`.
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import (
    Abandoned,
    Fields,
    as_written,
    attempt,
    empty_mapping,
    suggestion,
)
from kvconform.harness.yamlio import LineList
from kvconform.model.group_types import DEFAULT_GROUPS, GROUP_TYPES, hisparse_layout_error
from kvconform.model.kinds import Kind, entry
from kvconform.model.scenario import (
    GroupSpec,
    ModelSpec,
    SpeculativeSpec,
)
from kvconform.model.settings import SETTINGS

MODEL_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_model_len": 2048,
    "num_blocks": 256,
    "max_encoder_len": 0,
    "dcp_world_size": 1,
    "watermark": 0.0,
}


def parse_model(raw: Any, where: Location) -> ModelSpec:
    fields = Fields(raw, where, "model")
    block_size = fields.integer("block_size", MODEL_DEFAULTS["block_size"])
    max_model_len = fields.integer(
        "max_model_len", MODEL_DEFAULTS["max_model_len"], minimum=2, limit="tokens"
    )
    num_blocks = fields.integer(
        "num_blocks", MODEL_DEFAULTS["num_blocks"], minimum=2, limit="blocks"
    )
    max_encoder_len = fields.integer(
        "max_encoder_len", MODEL_DEFAULTS["max_encoder_len"], minimum=0, limit="tokens"
    )
    # vLLM's settings: read when stated; the placeholders are resolved before a run.
    stated = frozenset(
        s.name
        for s in SETTINGS.values()
        if s.field.startswith("model.") and s.name in fields.mapping
    )
    enable_caching = fields.flag("enable_caching", False)
    reserve_full_isl = fields.flag("scheduler_reserve_full_isl", True)
    dcp_world_size = fields.integer("dcp_world_size", MODEL_DEFAULTS["dcp_world_size"])
    watermark = fields.raw("watermark", MODEL_DEFAULTS["watermark"])
    # vLLM's own bounds (SchedulerConfig.watermark: ge=0.0, lt=1.0).
    if isinstance(watermark, bool) or not isinstance(watermark, (int, float)):
        raise ScenarioError(
            fields.at("watermark"), f"must be a number, not {as_written(watermark)}"
        )
    if not 0.0 <= watermark < 1.0:
        raise ScenarioError(
            fields.at("watermark"),
            f"must be at least 0 and below 1 (a fraction of the pool), not {watermark}",
        )
    max_in_flight_tokens = fields.optional_int("max_in_flight_tokens", minimum=1)
    retention_interval = fields.optional_int("prefix_cache_retention_interval", minimum=0)
    hisparse_host_blocks = fields.optional_int("hisparse_host_blocks", minimum=2, limit="blocks")
    kv_cache_events = fields.flag("kv_cache_events", False)
    log_stats = fields.flag("log_stats", False)
    shared_prefix_checkpoint = fields.flag("mamba_shared_prefix_checkpoint", False)
    raw_groups = fields.raw("groups", list(DEFAULT_GROUPS))
    fields.done()
    if not isinstance(raw_groups, list):
        raise ScenarioError(fields.at("groups"), "must be a list of group types")
    line_of = raw_groups.line_of if isinstance(raw_groups, LineList) else (lambda i: None)
    parsed = [
        attempt(_parse_group, item, where.at(f"model.groups[{i}]", line_of(i)), block_size)
        for i, item in enumerate(raw_groups)
    ]
    if not all(ok for _, ok in parsed):
        raise Abandoned
    groups = tuple(group for group, _ in parsed)
    model = ModelSpec(
        block_size=block_size,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        groups=groups,
        max_encoder_len=max_encoder_len,
        enable_caching=enable_caching,
        dcp_world_size=dcp_world_size,
        watermark=float(watermark),
        max_in_flight_tokens=max_in_flight_tokens,
        prefix_cache_retention_interval=retention_interval,
        scheduler_reserve_full_isl=reserve_full_isl,
        hisparse_host_blocks=hisparse_host_blocks,
        kv_cache_events=kv_cache_events,
        log_stats=log_stats,
        mamba_shared_prefix_checkpoint=shared_prefix_checkpoint,
        stated=stated,
    )
    _check_hisparse_layout(model, fields, line_of)
    if "enable_caching" in stated:
        _check_caching_followers(model)
    if "prefix_cache_retention_interval" in stated and retention_interval is not None:
        _check_retention_interval(model, fields.at("prefix_cache_retention_interval"))
    if shared_prefix_checkpoint and all(GROUP_TYPES[g.type].attention for g in model.groups):
        # vLLM accepts the setting and ignores it (only MambaManager reads it): a scenario
        # stating it without a Mamba group would claim a checkpoint vLLM never takes.
        stateful = " or ".join(name for name, t in GROUP_TYPES.items() if not t.attention)
        raise ScenarioError(
            fields.at("mamba_shared_prefix_checkpoint"),
            f"is true, but the model has no {stateful} group, the only one it applies to",
        )
    return model


def _check_hisparse_layout(model: ModelSpec, fields: Fields, line_of: Any) -> None:
    """vLLM builds HiSparse's groups only together (``vllm/v1/hisparse/layout.py``): the
    host source first, its indexer, then resident and hot groups of the source's block
    size, with a host pool (``KVCacheConfig.hisparse_host_num_blocks``)."""
    kinds = [g.type for g in model.groups]
    hisparse = [i for i, kind in enumerate(kinds) if GROUP_TYPES[kind].hisparse]
    if not hisparse:
        if model.hisparse_host_blocks is not None:
            raise ScenarioError(
                fields.at("hisparse_host_blocks"),
                "is the host pool of HiSparse's source group, and the model has no HiSparse groups",
            )
        return
    first = hisparse[0]
    where = fields.where.at(f"model.groups[{first}]", line_of(first))
    problem = hisparse_layout_error(kinds)
    if problem is not None:
        raise ScenarioError(where, problem)
    sizes = {model.groups[i].block_size for i in hisparse}
    if len(sizes) != 1:
        raise ScenarioError(
            where, f"HiSparse's groups share the source's block size, not {sorted(sizes)}"
        )
    if model.hisparse_host_blocks is None:
        raise ScenarioError(
            where,
            "HiSparse's source group needs its host pool: model.hisparse_host_blocks "
            "(KVCacheConfig.hisparse_host_num_blocks)",
        )


def _check_retention_interval(model: ModelSpec, where: Location) -> None:
    """vLLM's own rule (``_validate_prefix_cache_retention_interval``): retention only
    sparsifies sliding-window and Mamba checkpoints, and a positive interval must land on
    cache-hit boundaries, so be a multiple of the scheduler block size."""
    interval = model.prefix_cache_retention_interval
    assert interval is not None
    if interval and not any(GROUP_TYPES[g.type].retention for g in model.groups):
        retained = " or ".join(name for name, t in GROUP_TYPES.items() if t.retention)
        raise ScenarioError(
            where,
            f"is {interval}, but the model has no {retained} group, "
            "the only ones retention applies to (vLLM accepts only 0 then)",
        )
    if interval % model.scheduler_block_size:
        raise ScenarioError(
            where,
            f"must be a multiple of the scheduler block size "
            f"({model.scheduler_block_size}), not {interval}",
        )


def _parse_group(item: Any, where: Location, default_block_size: int) -> GroupSpec:
    if isinstance(item, str):
        item_map = empty_mapping()
        item_map["type"] = item
        item_map.line = where.line
        item = item_map
    assert where.field is not None
    fields = Fields(item, Location(where.file, where.line), where.field)
    type_name = fields.text("type")
    group_type = GROUP_TYPES.get(type_name)
    if group_type is None:
        raise ScenarioError(
            fields.at("type"),
            f"unknown group type {type_name!r}{suggestion(type_name, GROUP_TYPES)}; known: "
            + ", ".join(GROUP_TYPES),
        )
    block_size = fields.integer("block_size", default_block_size)
    options: dict[str, object] = {}
    for opt_name, opt in group_type.options.items():
        value = fields.raw(opt_name, opt.default)
        if value is None:
            if opt.required:
                raise fields.required(opt_name, f"is required for {type_name} groups")
        elif (opt.kind is bool) != isinstance(value, bool) or not isinstance(value, opt.kind):
            raise ScenarioError(fields.at(opt_name), f"must be {opt.kind.__name__}, not {value!r}")
        elif opt.choices and value not in opt.choices:
            choices = ", ".join(map(str, opt.choices))
            raise ScenarioError(fields.at(opt_name), f"must be one of {choices}, not {value!r}")
        options[opt_name] = value
    eagle_group = fields.flag("eagle_group", False)
    stated = frozenset(name for name in group_type.options if name in fields.mapping)
    fields.done()
    return GroupSpec(type_name, block_size, options, where, eagle_group=eagle_group, stated=stated)


def _check_caching_followers(model: ModelSpec) -> None:
    """A stated option vLLM derives from prefix caching agrees with the stated caching."""
    for group in model.groups:
        for name in sorted(group.stated):
            follows = GROUP_TYPES[group.type].options[name].follows_caching
            value = group.options.get(name)
            if follows is None or value not in follows.values():
                continue
            if follows[model.enable_caching] != value:
                where = group.where or Location("<scenario>")
                raise ScenarioError(
                    where.at(f"{where.field}.{name}"),
                    f"is {value!r}, but vLLM derives it from prefix caching: with "
                    f"enable_caching: {str(model.enable_caching).lower()} it is "
                    f"{follows[model.enable_caching]!r} (leave it out, or change enable_caching)",
                )


def parse_speculative(raw: Any, where: Location, at: Location) -> SpeculativeSpec | None:
    if raw is None:
        return None
    fields = Fields(raw, where, "speculative")
    method = fields.text("method")
    num_speculative_tokens = fields.integer("num_speculative_tokens")
    lookahead = fields.optional_int("num_lookahead_tokens")
    sample_from_anchor = fields.flag("sample_from_anchor", True)
    no_hashes = fields.flag("disable_lookahead_block_hashes", False)
    fields.done()
    return SpeculativeSpec(
        method,
        num_speculative_tokens,
        lookahead,
        sample_from_anchor,
        fields.at("method"),
        disable_lookahead_block_hashes=no_hashes,
    )


def check_extra_retained(model: ModelSpec, speculative: SpeculativeSpec | None, kind: str) -> None:
    """A sliding window's ``extra_retained_tokens`` only as vLLM 0.33.0's planner sets it.

    ``get_global_kv_cache_groups`` gives every sliding-window spec
    ``max(0, num_prefill_lookahead_tokens - 1)``, and ``num_prefill_lookahead_tokens``
    is ``num_speculative_tokens`` for multi-module MTP (1 for other EAGLE-family
    methods): so k - 1, with k >= 2, on every sliding-window group alike. (That the
    method is MTP is checked where vLLM's method aliases are known, oracles/resolve.py.)
    Kinds other than trajectories build their groups from vLLM's own config.
    """
    builds_manager = entry(kind).builds_manager
    if not builds_manager:
        # The other kinds build their KV-cache groups and speculative config from vLLM's.
        flagged = [g for g in model.groups if g.eagle_group]
        if flagged:
            where = flagged[0].where or Location("<scenario>")
            raise ScenarioError(
                where.at(f"{where.field}.eagle_group"), "only in trajectory scenarios"
            )
        if (
            speculative is not None
            and speculative.disable_lookahead_block_hashes
            and kind != Kind.SCHEDULER
        ):
            raise ScenarioError(
                (speculative.where or Location("<scenario>")).at(
                    "speculative.disable_lookahead_block_hashes"
                ),
                "only in trajectory and scheduler scenarios",
            )
    windowed = [g for g in model.groups if "extra_retained_tokens" in GROUP_TYPES[g.type].options]
    for group in windowed:
        value = group.options.get("extra_retained_tokens")
        if value is None:
            continue
        where = group.where or Location("<scenario>")
        at = where.at(f"{where.field}.extra_retained_tokens")
        if not builds_manager:
            raise ScenarioError(
                at, "only in trajectory scenarios (the other kinds build groups from vLLM's config)"
            )
        k = speculative.num_speculative_tokens if speculative is not None else 0
        if value != k - 1 or k < 2:
            raise ScenarioError(
                at,
                f"must be num_speculative_tokens - 1 ({k - 1 if k >= 2 else 'needs k >= 2'}), "
                f"not {value}: vLLM sets it only for multi-module MTP, to "
                "num_prefill_lookahead_tokens - 1 (kv_cache_planning.get_global_kv_cache_groups)",
            )
        unset = [g for g in windowed if g.options.get("extra_retained_tokens") is None]
        if unset:
            raise ScenarioError(
                unset[0].where or at,
                f"extra_retained_tokens: {value} must be set on every sliding-window group "
                "(vLLM's planner tags all of them alike)",
            )
