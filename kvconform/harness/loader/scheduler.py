"""A scheduler scenario's ``scheduler`` section (vLLM's scheduler decides the steps; its
requests: :mod:`kvconform.harness.loader.scheduler_requests`).

vLLM's own ``SchedulerConfig`` rules are checked here, before vLLM is imported.
Group types come from the registry's scheduler mode (``GroupType.modes``).
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields, as_written
from kvconform.harness.loader.model import MODEL_DEFAULTS
from kvconform.model.group_types import GROUP_TYPES, types_for
from kvconform.model.kind_specs import (
    KV_LOAD_FAILURE_POLICIES,
    MODEL_RUNNERS,
    SCHEDULER_CONNECTORS,
    SCHEDULER_MODES,
    SCHEDULER_POLICIES,
    SPEC_DECODE_METRICS,
    PrefixReset,
    SchedulerPause,
    SchedulerSpec,
)
from kvconform.model.kinds import Kind
from kvconform.model.methods import METHODS
from kvconform.model.scenario import ModelSpec, SpeculativeSpec
from kvconform.model.settings import SETTINGS

# Group types a scheduler scenario may use: the tiny model kvconform builds for
# vLLM's scheduler is a plain decoder, so types that need an encoder-decoder or
# context-parallel model configuration (cross-attention, ...) would be scheduled
# without the model-driven behaviour they exist for. Mamba is taken: the scheduler
# reads it from the KV-cache and cache configs, which kvconform builds.
SCHEDULER_GROUP_TYPES = types_for(Kind.SCHEDULER)


def check_scheduler_model(
    model: ModelSpec, speculative: SpeculativeSpec | None, top: Fields
) -> None:
    for group in model.groups:
        if group.type not in SCHEDULER_GROUP_TYPES:
            raise ScenarioError(
                group.where or top.at("model.groups"),
                f"group type {group.type!r} is not available in scheduler scenarios (the model "
                "kvconform builds for the scheduler is a plain decoder); use "
                + ", ".join(SCHEDULER_GROUP_TYPES)
                + ", or a kind: trajectory scenario",
            )
    for name in ("max_encoder_len", "dcp_world_size"):
        default = MODEL_DEFAULTS[name]
        if getattr(model, name) != default:
            raise ScenarioError(
                top.at(f"model.{name}"),
                f"must be {default} in a scheduler scenario (the scheduler's model is a plain "
                "decoder on one rank)",
            )
    if speculative is not None and speculative.num_lookahead_tokens is not None:
        raise ScenarioError(
            speculative.where or top.at("speculative"),
            "speculative.num_lookahead_tokens: a scheduler scenario takes the lookahead from "
            "vLLM's scheduler; remove the override",
        )
    _check_one_replay_window(model, top)
    _check_no_chunk_beside_replay(model, top)
    _check_not_only_replay_groups(model, top)


def _check_one_replay_window(model: ModelSpec, top: Fields) -> None:
    """Bounded-replay groups share one window, as every model vLLM builds them for has.

    vLLM's only source of ``bounded_replay`` groups is DeepSeek V4.1's SWA cache
    (``models/deepseek_v41/attention.py``: ``DeepseekV4SWACache(window_size=self.window_size,
    bounded_replay=...)``, the window being the model config's one ``sliding_window``), and
    ``Scheduler.__init__`` asserts that the replay windows agree (one rewind for every group).
    A scenario with two would be a model no vLLM config produces, crashing in that assert.
    """
    replaying = [g for g in model.groups if g.options.get("bounded_replay")]
    for group in replaying[1:]:
        first = replaying[0]
        option = _window_option(group.type)
        window, first_window = group.options[option], first.options[_window_option(first.type)]
        if window != first_window:
            where = group.where or top.at("model.groups")
            raise ScenarioError(
                where.at(f"{where.field}.{option}"),
                f"{window} differs from the {first_window} of the first bounded_replay group "
                f"({first.where.field if first.where else 'above'}): bounded-replay groups "
                "share one window (vLLM builds them only for DeepSeek V4.1, from its config's "
                "one sliding_window, and its scheduler keeps one replay window)",
            )


def _check_no_chunk_beside_replay(model: ModelSpec, top: Fields) -> None:
    """Bounded replay and chunked local attention are never in one model.

    vLLM builds bounded-replay groups only for DeepSeek V4.1 (``_check_one_replay_window``),
    whose KV cache has no chunked local attention. Together, the scheduler rewinds an
    admission by the replay window into a chunk whose columns the chunked group has already
    made null: a model no vLLM config produces (the explorer's reproducer read a null column).
    """
    if not any(g.options.get("bounded_replay") for g in model.groups):
        return
    chunked = [g for g in model.groups if (GROUP_TYPES[g.type].reads or ("",))[0] == "chunk"]
    if chunked:
        where = chunked[0].where or top.at("model.groups")
        raise ScenarioError(
            where,
            f"a {chunked[0].type} group cannot go with a bounded_replay group: vLLM builds "
            "bounded replay only for DeepSeek V4.1, which has no chunked local attention",
        )


def _check_not_only_replay_groups(model: ModelSpec, top: Fields) -> None:
    """Two or more groups are never all bounded-replay ones.

    DeepSeek V4.1, vLLM's only source of bounded-replay groups (``_check_one_replay_window``),
    builds them from its SWA caches, all of one spec (one window); every other layer it has
    (compress ratio 1 or 2) owns an ``MLAAttentionSpec`` cache, which is prefix-cacheable.
    vLLM puts layers of one spec in one group (``get_kv_cache_groups``,
    ``vllm/v1/core/kv_cache_utils.py``), so a model of SWA layers only has one group, and a
    model of several groups has a cacheable one. Several groups all left out of prefix
    caching is a model no vLLM config produces: with caching on,
    ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups`` asserts "requires at least
    one cacheable group" (the explorer's reproducer, seed 0). One such group alone loads.
    """
    groups = model.groups
    if len(groups) < 2 or not all(g.options.get("bounded_replay") for g in groups):
        return
    where = groups[-1].where or top.at("model.groups")
    raise ScenarioError(
        where.at(f"{where.field}.bounded_replay"),
        f"all {len(groups)} groups are bounded_replay groups: vLLM builds bounded replay only "
        "for DeepSeek V4.1, whose SWA layers share one spec (one group) and whose other "
        "layers are a prefix-cacheable MLA group; make one group cacheable (e.g. a plain mla "
        "group) or keep a single group",
    )


def _window_option(type_name: str) -> str:
    """The option holding a windowed group type's window (``GroupType.reads``)."""
    reads = GROUP_TYPES[type_name].reads
    assert reads is not None, f"{type_name} reads no window"
    return reads[1]


def parse_scheduler(
    raw: Any,
    where: Location,
    at: Location,
    speculative: SpeculativeSpec | None,
    model: ModelSpec,
) -> SchedulerSpec:
    fields = Fields(raw, where, "scheduler")
    defaults = SchedulerSpec()
    mode = fields.text("mode", defaults.mode)
    if mode not in SCHEDULER_MODES:
        raise ScenarioError(
            fields.at("mode"), f"must be one of {', '.join(SCHEDULER_MODES)}, not {mode!r}"
        )
    layers = fields.integer("num_nextn_predict_layers", defaults.num_nextn_predict_layers)
    if layers != 1 and (speculative is None or not _stacks_mtp_modules(speculative.method)):
        raise ScenarioError(
            fields.at("num_nextn_predict_layers"), "applies to MTP only (speculative.method: mtp)"
        )
    if speculative is not None and speculative.num_speculative_tokens % layers:
        raise ScenarioError(
            fields.at("num_nextn_predict_layers"),
            f"vLLM needs num_speculative_tokens ({speculative.num_speculative_tokens}) to be a "
            f"multiple of the MTP modules ({layers})",
        )
    runner = fields.text("model_runner", defaults.model_runner)
    if runner not in MODEL_RUNNERS:
        raise ScenarioError(
            fields.at("model_runner"), f"must be one of {', '.join(MODEL_RUNNERS)}, not {runner!r}"
        )
    spec = SchedulerSpec(
        mode=mode,
        model_runner=runner,
        max_num_seqs=fields.integer("max_num_seqs", defaults.max_num_seqs),
        max_num_batched_tokens=fields.integer(
            "max_num_batched_tokens", defaults.max_num_batched_tokens
        ),
        enable_chunked_prefill=fields.flag(
            "enable_chunked_prefill", defaults.enable_chunked_prefill
        ),
        long_prefill_token_threshold=fields.integer(
            "long_prefill_token_threshold", defaults.long_prefill_token_threshold, minimum=0
        ),
        num_nextn_predict_layers=layers,
        max_steps=fields.integer("max_steps", defaults.max_steps),
        resets=_parse_resets(fields),
        policy=choice(fields, "policy", defaults.policy, SCHEDULER_POLICIES),
        kv_connector=(
            choice(fields, "kv_connector", "", SCHEDULER_CONNECTORS)
            if fields.raw("kv_connector", None) is not None
            else None
        ),
        disable_chunked_mm_input=fields.flag(
            "disable_chunked_mm_input", defaults.disable_chunked_mm_input
        ),
        max_num_encoder_input_tokens=fields.optional_int("max_num_encoder_input_tokens", minimum=1),
        encoder_cache_size=fields.optional_int("encoder_cache_size", minimum=1),
        log_stats=fields.flag("log_stats", defaults.log_stats),
        spec_decode_metrics=_parse_spec_decode_metrics(fields, speculative),
        log_iteration_details=fields.flag("log_iteration_details", defaults.log_iteration_details),
        long_prefill_token_threshold_adaptive=fields.flag(
            "long_prefill_token_threshold_adaptive", defaults.long_prefill_token_threshold_adaptive
        ),
        prefill_schedule_interval=fields.integer(
            "prefill_schedule_interval", defaults.prefill_schedule_interval, minimum=1
        ),
        pauses=_parse_pauses(fields),
        kv_load_failure_policy=_parse_kv_load_failure_policy(fields),
        # vLLM's settings this section states (the mode states async scheduling).
        stated=frozenset(
            s.name
            for s in SETTINGS.values()
            if s.field.startswith("scheduler.")
            and s.field.removeprefix("scheduler.") in fields.mapping
        ),
        where=Location(where.file, fields.mapping.line or at.line, "scheduler"),
    )
    fields.done()
    _check_scheduler_limits(spec, model, fields)
    _check_mamba_caching_chunks(spec, model, fields)
    _check_log_stats(spec, fields)
    _check_log_iteration_details(spec, fields)
    _check_adaptive_threshold(spec, fields)
    return spec


def _check_mamba_caching_chunks(spec: SchedulerSpec, model: ModelSpec, fields: Fields) -> None:
    """A Mamba group with prefix caching needs chunked prefill and chunked multimodal input,
    as vLLM requires.

    vLLM refuses the configuration when it builds any model with Mamba layers
    (``MambaModelConfig.verify_and_update_config`` in
    ``vllm/model_executor/models/config.py``: "Chunked prefill is required for Mamba
    prefix caching."); kvconform's scheduler is built without a model, so the rule is kept
    here. Without it the "align" chunk split (``Scheduler._mamba_block_aligned_split``)
    cuts a prompt that chunked prefill off may not cut, and a request with encoder inputs
    is then never scheduled: a stall no vLLM deployment can reach.
    """
    recurrent = [g.type for g in model.groups if not GROUP_TYPES[g.type].attention]
    if not recurrent or not model.enable_caching:
        return
    if not spec.enable_chunked_prefill:
        raise ScenarioError(
            fields.at("enable_chunked_prefill"),
            f"is false, but the model has a {recurrent[0]} group and enable_caching: true: vLLM "
            "requires chunked prefill for Mamba prefix caching (MambaModelConfig); drop the "
            "field, or set model.enable_caching: false",
        )
    # VllmConfig's "Mamba cache align-mode constraints" (vllm/config/vllm.py): the align split
    # must be free to cut a chunk at a block boundary inside a multimodal input.
    if spec.disable_chunked_mm_input:
        raise ScenarioError(
            fields.at("disable_chunked_mm_input"),
            f"is true, but the model has a {recurrent[0]} group and enable_caching: true "
            "(Mamba 'align'): vLLM requires chunked multimodal input there (VllmConfig: 'Chunked "
            "MM input is required'); drop the field, or set model.enable_caching: false",
        )


def _parse_spec_decode_metrics(fields: Fields, speculative: SpeculativeSpec | None) -> str:
    """``spec_decode_metrics``: vLLM's per-request speculative-decoding metrics level; a level
    other than none needs drafts to count."""
    level = choice(fields, "spec_decode_metrics", "none", SPEC_DECODE_METRICS)
    if level != "none" and speculative is None:
        raise ScenarioError(
            fields.at("spec_decode_metrics"),
            f"{level!r} needs a speculative section: without drafts vLLM counts nothing",
        )
    return level


def _check_adaptive_threshold(spec: SchedulerSpec, fields: Fields) -> None:
    """``long_prefill_token_threshold_adaptive`` floors a threshold, so it needs one: vLLM
    applies it "only when long_prefill_token_threshold is nonzero" (``SchedulerConfig``)."""
    if spec.long_prefill_token_threshold_adaptive and not spec.long_prefill_token_threshold:
        raise ScenarioError(
            fields.at("long_prefill_token_threshold_adaptive"),
            "needs scheduler.long_prefill_token_threshold above 0 (the threshold it floors)",
        )


def _check_log_iteration_details(spec: SchedulerSpec, fields: Fields) -> None:
    """``log_iteration_details``: vLLM makes the per-step encoder input stats only for a
    scheduler built with ``log_stats`` (``Scheduler.schedule``); without it the field would
    change nothing."""
    if spec.log_iteration_details and not spec.log_stats:
        raise ScenarioError(
            fields.at("log_iteration_details"),
            "needs scheduler.log_stats: true (vLLM makes the step's encoder input stats only "
            "for a scheduler that logs stats)",
        )


def _check_log_stats(spec: SchedulerSpec, fields: Fields) -> None:
    """``log_stats``: SchedulerStats judged against the recorded steps; not with
    ``kv_connector`` (its synchronous load is not told apart from the local hit yet)."""
    if spec.log_stats and spec.kv_connector is not None:
        raise ScenarioError(
            fields.at("log_stats"),
            f"cannot go with scheduler.kv_connector: {spec.kv_connector}: the stats of its "
            "synchronous loads are not judged yet",
        )


def _parse_kv_load_failure_policy(fields: Fields) -> str | None:
    """``kv_load_failure_policy``: fail or recompute, for the remote prefills' connector."""
    if fields.raw("kv_load_failure_policy") is None:
        return None
    policy = choice(fields, "kv_load_failure_policy", "", KV_LOAD_FAILURE_POLICIES)
    if fields.raw("kv_connector") is not None:
        raise ScenarioError(
            fields.at("kv_load_failure_policy"),
            f"cannot go with scheduler.kv_connector: {fields.raw('kv_connector')}: the policy "
            "is judged for the asynchronous loads of remote_prefill requests only",
        )
    return policy


def choice(fields: Fields, key: str, default: str, choices: tuple[str, ...]) -> str:
    value = fields.text(key, default)
    if value not in choices:
        raise ScenarioError(fields.at(key), f"must be one of {', '.join(choices)}, not {value!r}")
    return value


def _parse_resets(fields: Fields) -> tuple[PrefixReset, ...]:
    """``reset_prefix_cache``: a list of ``{at: N, running: bool, succeeds: bool,
    connector: bool}``."""
    raw = fields.raw("reset_prefix_cache", [])
    if not isinstance(raw, list):
        raise ScenarioError(
            fields.at("reset_prefix_cache"),
            f"must be a list of {{at, running, succeeds}}, not {as_written(raw)}",
        )
    resets = []
    for index, item in enumerate(raw):
        one = Fields(item, fields.where, f"scheduler.reset_prefix_cache[{index}]")
        resets.append(
            PrefixReset(
                at=one.integer("at", minimum=0),
                running=one.flag("running", False),
                succeeds=one.flag("succeeds", True),
                line=one.mapping.line,
                connector=one.flag("connector", False),
            )
        )
        one.done()
    return tuple(sorted(resets, key=lambda r: r.at))


def _parse_pauses(fields: Fields) -> tuple[SchedulerPause, ...]:
    """``pause``: a list of ``{at: N, resume_at: M}``, in order and apart."""
    raw = fields.raw("pause", [])
    if not isinstance(raw, list):
        raise ScenarioError(
            fields.at("pause"), f"must be a list of {{at, resume_at}}, not {as_written(raw)}"
        )
    pauses: list[SchedulerPause] = []
    for index, item in enumerate(raw):
        one = Fields(item, fields.where, f"scheduler.pause[{index}]")
        pause = SchedulerPause(
            at=one.integer("at", minimum=0),
            resume_at=one.integer("resume_at", minimum=1),
            line=one.mapping.line,
            mode=choice(one, "mode", "wait", ("wait", "abort")),
        )
        if pause.mode == "abort" and fields.text("mode", "overlapped") != "sync":
            raise ScenarioError(
                one.at("mode"),
                "abort needs scheduler.mode: sync (an abort while a batch is in flight is not "
                "modelled yet)",
            )
        one.done()
        if pause.resume_at <= pause.at:
            raise ScenarioError(one.at("resume_at"), f"must come after at ({pause.at})")
        if pauses and pause.at < pauses[-1].resume_at:
            raise ScenarioError(
                one.at("at"),
                f"must come at or after the pause before resumes ({pauses[-1].resume_at})",
            )
        pauses.append(pause)
    return tuple(pauses)


def _stacks_mtp_modules(method: str) -> bool:
    """The scenario's method (or a vLLM alias of it, such as ``mimo_mtp``) stacks MTP modules."""
    return any(m.mtp_modules and m.name in method for m in METHODS.values())


def _check_scheduler_limits(spec: SchedulerSpec, model: ModelSpec, fields: Fields) -> None:
    """vLLM's own SchedulerConfig rules, checked before vLLM is imported.

    Whatever else vLLM refuses to build is reported as unsupported by that
    release (a method or mode it does not run), not as a bad scenario.
    """
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        raise ScenarioError(
            fields.at("max_num_batched_tokens"),
            f"must be at least max_num_seqs ({spec.max_num_seqs}), as vLLM requires",
        )
    if not spec.enable_chunked_prefill and spec.max_num_batched_tokens < model.max_model_len:
        raise ScenarioError(
            fields.at("max_num_batched_tokens"),
            f"must be at least max_model_len ({model.max_model_len}) without chunked prefill, "
            "as vLLM requires",
        )
    if spec.long_prefill_token_threshold > model.max_model_len:
        raise ScenarioError(
            fields.at("long_prefill_token_threshold"),
            f"must be at most max_model_len ({model.max_model_len}), as vLLM requires",
        )
