"""A startup scenario's ``startup`` section: what vLLM's startup KV-cache planning is handed.

A ``kind: startup`` scenario has no requests and no steps: its model's groups are
the layers of a model, and the section says what the engine core hands vLLM's
planning besides (the profiled memory, ``num_gpu_blocks_override``, auto-fit of
``max_model_len``) and, where the scenario derives it by hand, what vLLM must
decide. Group types come from the registry's startup mode (``GroupType.modes``).
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields
from kvconform.harness.loader.model import MODEL_DEFAULTS
from kvconform.harness.yamlio import LineDict
from kvconform.model.group_types import GROUP_TYPES, types_for
from kvconform.model.kind_specs import STARTUP_OUTCOMES, StartupSpec
from kvconform.model.kinds import Kind
from kvconform.model.scenario import ModelSpec, SpeculativeSpec

STARTUP_GROUP_TYPES = types_for(Kind.STARTUP)

# Mamba's cache mode whose one-request demand the floor states as pool blocks: its
# running state plus its speculative blocks ("align" keeps null columns between states).
_MAMBA_MODE = "mamba_cache_mode"


def check_startup_model(
    model: ModelSpec, speculative: SpeculativeSpec | None, doc: LineDict, top: Fields
) -> None:
    """The model a startup scenario may hand the planner."""
    raw_model = doc.get("model")
    if isinstance(raw_model, LineDict) and "num_blocks" in raw_model:
        raise ScenarioError(
            top.where.at("model.num_blocks", raw_model.line_of("num_blocks")),
            "a startup scenario's pool is what vLLM's planning chooses: state the memory "
            "(startup.available_blocks) or startup.num_gpu_blocks_override instead",
        )
    if speculative is not None:
        raise ScenarioError(
            speculative.where or top.at("speculative"),
            "a startup scenario takes no speculative section (a Mamba group states its "
            "num_speculative_blocks itself)",
        )
    for name in ("max_encoder_len", "dcp_world_size"):
        if getattr(model, name) != MODEL_DEFAULTS[name]:
            raise ScenarioError(
                top.at(f"model.{name}"),
                f"must be {MODEL_DEFAULTS[name]} in a startup scenario (a decoder on one rank)",
            )
    for group in model.groups:
        where = group.where or top.at("model.groups")
        if group.type not in STARTUP_GROUP_TYPES:
            raise ScenarioError(
                where,
                f"group type {group.type!r} is not available in startup scenarios (its floor "
                "counts block-table columns, some of them null, not the pool blocks one "
                "request holds); use " + ", ".join(STARTUP_GROUP_TYPES),
            )
        option = GROUP_TYPES[group.type].options.get(_MAMBA_MODE)
        if option is not None and group.options.get(_MAMBA_MODE) not in (None, option.default):
            raise ScenarioError(
                where.at(f"{where.field}.{_MAMBA_MODE}"),
                f"must be {option.default!r} in a startup scenario: the floor of mode "
                f"{group.options.get(_MAMBA_MODE)!r} counts columns, some of them null, not "
                "the state blocks one request holds",
            )
        if option is not None and _MAMBA_MODE not in group.stated:
            raise ScenarioError(
                where,
                f"state {_MAMBA_MODE}: {option.default} (left out, it follows prefix "
                "caching, and vLLM's default for a hybrid model turns it to 'align', whose "
                "floor counts columns, not the state blocks one request holds)",
            )


def parse_startup(raw: Any, where: Location, model: ModelSpec) -> StartupSpec:
    fields = Fields(raw, where, "startup")
    override = fields.optional_int("num_gpu_blocks_override", minimum=1, limit="blocks")
    available = fields.optional_int("available_blocks", minimum=1, limit="blocks")
    if available is None and override is None:
        raise fields.required(
            "available_blocks",
            "is required without num_gpu_blocks_override: the KV-cache memory the engine's "
            "profiler reports, in pool blocks",
        )
    auto_fit = fields.flag("auto_fit", False)
    expect = fields.raw("expect")
    if expect is not None and expect not in STARTUP_OUTCOMES:
        raise ScenarioError(
            fields.at("expect"),
            f"must be one of {', '.join(STARTUP_OUTCOMES)}, not {expect!r}",
        )
    expect_len = fields.optional_int("expect_max_model_len", minimum=1)
    if expect_len is not None and not auto_fit:
        raise ScenarioError(
            fields.at("expect_max_model_len"),
            "needs auto_fit: true (without it max_model_len stays model.max_model_len)",
        )
    if expect_len is not None and expect_len > model.max_model_len:
        raise ScenarioError(
            fields.at("expect_max_model_len"),
            f"must be at most model.max_model_len ({model.max_model_len}): auto-fit only "
            "lowers the model's length",
        )
    if expect_len is not None and expect == "refuse":
        raise ScenarioError(
            fields.at("expect_max_model_len"), "states a length vLLM fits, but expect is refuse"
        )
    spec = StartupSpec(
        # Left out with an override: the profiler reports exactly the override's memory.
        available_blocks=available if available is not None else int(override or 0),
        num_gpu_blocks_override=override,
        auto_fit=auto_fit,
        expect=expect,
        expect_max_model_len=expect_len,
        where=Location(where.file, fields.mapping.line, "startup"),
    )
    fields.done()
    return spec
