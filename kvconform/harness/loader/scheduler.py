"""A scheduler scenario's ``scheduler`` section and requests (vLLM's scheduler decides the steps).

vLLM's own ``SchedulerConfig`` rules are checked here, before vLLM is imported.
Group types come from the registry's scheduler mode (``GroupType.modes``).
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields, as_written
from kvconform.harness.loader.model import MODEL_DEFAULTS
from kvconform.harness.loader.requests import parse_acceptance, parse_request_map
from kvconform.harness.yamlio import LineDict
from kvconform.model.group_types import types_for
from kvconform.model.methods import METHODS
from kvconform.model.scenario import (
    KV_LOAD_FAILURE_POLICIES,
    MODEL_RUNNERS,
    SCHEDULER_CONNECTORS,
    SCHEDULER_MODES,
    SCHEDULER_POLICIES,
    SPEC_DECODE_METRICS,
    STOP_TOKENS,
    MmInput,
    ModelSpec,
    PrefixReset,
    RequestSpec,
    SchedulerPause,
    SchedulerSpec,
    SpeculativeSpec,
    StreamChunk,
)
from kvconform.model.settings import SETTINGS

# Group types a scheduler scenario may use: the tiny model kvconform builds for
# vLLM's scheduler is a plain decoder, so types that need an encoder-decoder or
# context-parallel model configuration (cross-attention, ...) would be scheduled
# without the model-driven behaviour they exist for. Mamba is taken: the scheduler
# reads it from the KV-cache and cache configs, which kvconform builds.
SCHEDULER_GROUP_TYPES = types_for("scheduler")


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
        policy=_choice(fields, "policy", defaults.policy, SCHEDULER_POLICIES),
        kv_connector=(
            _choice(fields, "kv_connector", "", SCHEDULER_CONNECTORS)
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
    _check_log_stats(spec, fields)
    _check_log_iteration_details(spec, fields)
    _check_adaptive_threshold(spec, fields)
    return spec


def _parse_spec_decode_metrics(fields: Fields, speculative: SpeculativeSpec | None) -> str:
    """``spec_decode_metrics``: vLLM's per-request speculative-decoding metrics level; a level
    other than none needs drafts to count."""
    level = _choice(fields, "spec_decode_metrics", "none", SPEC_DECODE_METRICS)
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
    policy = _choice(fields, "kv_load_failure_policy", "", KV_LOAD_FAILURE_POLICIES)
    if fields.raw("kv_connector") is not None:
        raise ScenarioError(
            fields.at("kv_load_failure_policy"),
            f"cannot go with scheduler.kv_connector: {fields.raw('kv_connector')}: the policy "
            "is judged for the asynchronous loads of remote_prefill requests only",
        )
    return policy


def check_load_failure_policy(scheduler: SchedulerSpec, requests: dict[str, RequestSpec]) -> None:
    """A stated ``kv_load_failure_policy`` needs a request whose KV load can fail."""
    if scheduler.kv_load_failure_policy is None or any(r.remote_prefill for r in requests.values()):
        return
    where = scheduler.where
    assert where is not None
    raise ScenarioError(
        where.at("scheduler.kv_load_failure_policy"),
        "needs a remote_prefill request: the policy decides what becomes of a request whose "
        "asynchronous KV load fails",
    )


def _choice(fields: Fields, key: str, default: str, choices: tuple[str, ...]) -> str:
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
            mode=_choice(one, "mode", "wait", ("wait", "abort")),
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


def parse_scheduler_requests(
    raw: Any,
    where: Location,
    at: Location,
    model: ModelSpec,
    speculative: SpeculativeSpec | None,
    scheduler: SchedulerSpec,
) -> dict[str, RequestSpec]:
    # The length of each multimodal identifier seen so far (one item, one length).
    mm_lengths: dict[str, int] = {}

    def request(name: str, fields: Fields, request_at: Location) -> RequestSpec:
        prompt_len = fields.integer("prompt_len", limit="tokens")
        if prompt_len >= model.max_model_len:
            raise ScenarioError(
                fields.at("prompt_len"),
                f"must be below max_model_len {model.max_model_len}: vLLM rejects a prompt "
                "that leaves no room for one output token",
            )
        mm_inputs = parse_mm_inputs(fields, name, prompt_len, scheduler, mm_lengths)
        return RequestSpec(
            name=name,
            prompt_len=prompt_len,
            prefix_from=fields.optional_text("prefix_from"),
            prefix_len=fields.integer("prefix_len", 0, minimum=0),
            where=request_at,
            arrival=fields.integer("arrival", 0, minimum=0),
            max_tokens=fields.integer("max_tokens", RequestSpec.max_tokens, limit="tokens"),
            acceptance=parse_acceptance(fields, speculative),
            remote_prefill=_parse_remote_prefill(fields, scheduler),
            expect_hit=_parse_expect_hit(fields, model, prompt_len),
            abort_at=_parse_abort_at(fields, scheduler),
            priority=_parse_priority(fields, scheduler),
            load_failure=_parse_load_failure(fields, model, prompt_len),
            expect_loaded=_parse_expect_loaded(fields, prompt_len),
            mm_inputs=mm_inputs,
            expect_chunks=_parse_expect_chunks(fields, prompt_len),
            **_parse_stop(fields, scheduler),
            stream=_parse_stream(fields, model, scheduler, prompt_len),
            close_at=_parse_close_at(fields),
            expect_rejected=_parse_expect_rejected(fields, mm_inputs, mm_lengths),
        )

    requests = parse_request_map(raw, where, at, "a scheduler scenario", request)
    check_load_failure_policy(scheduler, requests)
    return requests


def _parse_expect_chunks(fields: Fields, prompt_len: int) -> tuple[int, ...] | None:
    """``expect_chunks``: the prompt's prefill chunks from the first admission, in order."""
    raw = fields.raw("expect_chunks")
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or not raw
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in raw)
    ):
        raise ScenarioError(
            fields.at("expect_chunks"),
            f"must be a non-empty list of token counts (integers >= 1), not {as_written(raw)}",
        )
    hit = fields.raw("expect_hit")
    left = prompt_len - (hit if isinstance(hit, int) and not isinstance(hit, bool) else 0)
    if sum(raw) > left or (hit is not None and sum(raw) != left):
        raise ScenarioError(
            fields.at("expect_chunks"),
            f"the chunks add up to {sum(raw)}, but the prompt has {left} tokens to compute "
            f"(prompt_len {prompt_len}" + (f" less expect_hit {hit})" if hit is not None else ")"),
        )
    return tuple(raw)


def parse_mm_inputs(
    fields: Fields,
    request: str,
    prompt_len: int,
    scheduler: SchedulerSpec,
    lengths: dict[str, int],
) -> tuple[MmInput, ...]:
    """``mm_inputs``: ``[{offset: 8, length: 40, id: cat}, ...]``, the placeholder ranges of
    the prompt's multimodal inputs (vLLM's ``PlaceholderRange``), in prompt order.

    ``id`` is the item's identifier (its mm hash; default ``<request>-<index>``, unique, as
    vLLM's own scheduler tests name theirs): one id is one item, so it has one length.
    ``lengths`` holds the ids of the requests read before, and takes this one's.
    """
    raw = fields.raw("mm_inputs")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(
            fields.at("mm_inputs"),
            f"must be a non-empty list of {{offset, length, id}}, not {as_written(raw)}",
        )
    if fields.raw("remote_prefill", False):
        raise ScenarioError(
            fields.at("mm_inputs"),
            "cannot go with remote_prefill: encoder inputs of a remotely prefilled request are "
            "not modelled",
        )
    inputs: list[MmInput] = []
    for index, item in enumerate(raw):
        path = f"{fields.path}.mm_inputs[{index}]"
        if not isinstance(item, LineDict):
            raise ScenarioError(
                fields.at("mm_inputs"),
                f"item {index} must be a mapping {{offset, length, id}}, not {as_written(item)}",
            )
        one = Fields(item, fields.where, path)
        offset = one.integer("offset", minimum=0)
        length = one.integer("length", minimum=1)
        identifier = one.text("id", f"{request}-{index}")
        one.done()
        if offset + length > prompt_len:
            raise ScenarioError(
                one.at("length"),
                f"the input's placeholders {offset}..{offset + length - 1} must lie inside the "
                f"prompt (prompt_len {prompt_len})",
            )
        if inputs and offset < inputs[-1].end:
            raise ScenarioError(
                one.at("offset"),
                f"must be at least {inputs[-1].end}, where the input before ends: inputs come "
                "in prompt order and do not overlap (vLLM keeps mm_features sorted by offset)",
            )
        known = lengths.setdefault(identifier, length)
        if known != length and not fields.raw("expect_rejected", False):
            raise ScenarioError(
                one.at("length"),
                f"id {identifier!r} is one item with {known} placeholders elsewhere, not "
                f"{length}: give a different item another id (or state expect_rejected: true, "
                "what vLLM answers an identifier reused with another length)",
            )
        if scheduler.disable_chunked_mm_input and length > scheduler.max_num_batched_tokens:
            raise ScenarioError(
                one.at("length"),
                f"must be at most scheduler.max_num_batched_tokens "
                f"({scheduler.max_num_batched_tokens}) with disable_chunked_mm_input, as vLLM "
                "requires (compute_mm_encoder_budget)",
            )
        inputs.append(MmInput(offset, length, identifier))
    return tuple(inputs)


def _parse_expect_rejected(
    fields: Fields, mm_inputs: tuple[MmInput, ...], lengths: dict[str, int]
) -> bool:
    """``expect_rejected``: one of the request's inputs reuses a multimodal identifier with
    another length than the one it first came with (``parse_mm_inputs`` allows it only
    here), which vLLM rejects (``Scheduler._reject_on_encoder_cache_embed_mismatch``); not
    with what ends a request otherwise."""
    if not fields.flag("expect_rejected", False):
        return False
    if all(lengths[m.identifier] == m.length for m in mm_inputs):
        raise ScenarioError(
            fields.at("expect_rejected"),
            "needs an mm_inputs id that an earlier input has with another length: vLLM "
            "rejects a request only for such an identifier",
        )
    for other in ("stream", "abort_at", "stop_at", "expect_chunks"):
        if fields.raw(other) is not None:
            raise ScenarioError(
                fields.at("expect_rejected"),
                f"cannot go with {other}: the request ends at its rejection",
            )
    return True


def _parse_expect_hit(fields: Fields, model: ModelSpec, prompt_len: int) -> int | None:
    """``expect_hit``: the prefix-cache hit the request must adopt at its first admission."""
    hit = fields.optional_int("expect_hit")
    if hit is None:
        return None
    if not model.enable_caching:
        raise ScenarioError(
            fields.at("expect_hit"), "needs model.enable_caching: true (a prefix-cache hit)"
        )
    if hit >= prompt_len:
        raise ScenarioError(
            fields.at("expect_hit"),
            f"must be below prompt_len {prompt_len}: vLLM always computes the prompt's last "
            "token, so a hit never covers the whole prompt",
        )
    if fields.raw("remote_prefill", False):
        raise ScenarioError(
            fields.at("expect_hit"),
            "is not judged for a remote_prefill request (its local hit is folded into the load)",
        )
    return hit


def _parse_load_failure(fields: Fields, model: ModelSpec, prompt_len: int) -> str | int | None:
    """``remote_load_fails``: true (the whole load) or K (the K-th block is left unwritten)."""
    raw = fields.raw("remote_load_fails")
    if raw is None or raw is False:
        return None
    if not fields.raw("remote_prefill", False):
        raise ScenarioError(fields.at("remote_load_fails"), "needs remote_prefill (a KV load)")
    if raw is True:
        return "request"
    if not isinstance(raw, int) or raw < 0:
        raise ScenarioError(
            fields.at("remote_load_fails"),
            f"must be true or a block index (an integer >= 0), not {as_written(raw)}",
        )
    if len(model.groups) != 1:
        raise ScenarioError(
            fields.at("remote_load_fails"),
            "a failed block needs one KV-cache group: vLLM maps invalid block ids back to "
            "requests only then (Scheduler._handle_invalid_blocks)",
        )
    blocks = -(-prompt_len // model.scheduler_block_size)
    if raw >= blocks:
        raise ScenarioError(
            fields.at("remote_load_fails"),
            f"block {raw} is past the {blocks} blocks the load fills",
        )
    return raw


def _parse_expect_loaded(fields: Fields, prompt_len: int) -> int | None:
    """``expect_loaded``: the computed tokens a remote prefill is first scheduled with once
    its KV load is done (0 .. prompt_len - 1)."""
    if fields.raw("expect_loaded") is None:
        return None
    if not fields.raw("remote_prefill", False):
        raise ScenarioError(fields.at("expect_loaded"), "needs remote_prefill (a KV load)")
    loaded = fields.integer("expect_loaded", minimum=0)
    if loaded >= prompt_len:
        raise ScenarioError(
            fields.at("expect_loaded"),
            f"must be below prompt_len {prompt_len}: vLLM computes at least the prompt's last "
            f"token itself, not {loaded}",
        )
    return loaded


def _parse_priority(fields: Fields, scheduler: SchedulerSpec) -> int:
    """``priority``: Request.priority (lower is served first), under the priority policy."""
    value = fields.raw("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(fields.at("priority"), f"must be an integer, not {as_written(value)}")
    if value and scheduler.policy != "priority":
        raise ScenarioError(
            fields.at("priority"),
            "needs scheduler.policy: priority (vLLM ignores priorities under fcfs)",
        )
    return value


def _parse_abort_at(fields: Fields, scheduler: SchedulerSpec) -> int | None:
    """``abort_at``: the schedule() call before which the client aborts the request."""
    step = fields.optional_int("abort_at", minimum=0)
    if step is None:
        return None
    arrival = fields.integer("arrival", 0, minimum=0)
    if step < arrival:
        raise ScenarioError(
            fields.at("abort_at"),
            f"must be at least the request's arrival ({arrival}): the engine aborts a request "
            "it has added (at its arrival: from the waiting queue, before its first schedule())",
        )
    if scheduler.mode != "sync":
        # An abort between overlapped steps (a batch of the request still in flight) is
        # not modelled: its output would be applied to a request that is gone.
        raise ScenarioError(
            fields.at("abort_at"),
            f"needs scheduler.mode: sync, not {scheduler.mode!r}: an abort while a batch of "
            "the request is in flight is not modelled yet",
        )
    return step


def _parse_remote_prefill(fields: Fields, scheduler: SchedulerSpec) -> int:
    """``remote_prefill``: false, true (one step) or the schedule() calls the KV load takes."""
    raw = fields.raw("remote_prefill", False)
    steps = int(raw) if isinstance(raw, bool) else raw
    if not isinstance(steps, int) or steps < 0:
        raise ScenarioError(
            fields.at("remote_prefill"),
            "must be true, false or the number of schedule() calls the asynchronous KV load "
            f"takes (an integer >= 1), not {as_written(raw)}",
        )
    if steps and scheduler.kv_connector is not None:
        raise ScenarioError(
            fields.at("remote_prefill"),
            f"cannot go with scheduler.kv_connector: {scheduler.kv_connector} (an instance has "
            "one KV connector; a remote prefill brings vLLM's NixlConnector)",
        )
    return steps


def _parse_stop(fields: Fields, scheduler: SchedulerSpec) -> dict[str, Any]:
    """``stop_at``: the output token that stops the request; ``stop_with``: what stops it."""
    stop_at = fields.optional_int("stop_at", minimum=1)
    stop_with = _choice(fields, "stop_with", RequestSpec.stop_with, STOP_TOKENS)
    if stop_at is None:
        if fields.raw("stop_with") is not None:
            raise ScenarioError(fields.at("stop_with"), "needs stop_at (the stopping output)")
        return {}
    max_tokens = fields.integer("max_tokens", RequestSpec.max_tokens, limit="tokens")
    if stop_at > max_tokens:
        raise ScenarioError(
            fields.at("stop_at"),
            f"must be at most max_tokens ({max_tokens}): the request ends there regardless",
        )
    if fields.raw("remote_prefill", False):
        raise ScenarioError(
            fields.at("stop_at"), "is not offered with remote_prefill (a KV load's own finish)"
        )
    if fields.raw("abort_at") is not None:
        raise ScenarioError(
            fields.at("stop_at"), "cannot go with abort_at: the request ends one way or the other"
        )
    return {"stop_at": stop_at, "stop_with": stop_with}


def _parse_stream(
    fields: Fields, model: ModelSpec, scheduler: SchedulerSpec, prompt_len: int
) -> tuple[StreamChunk, ...]:
    """``stream``: a list of ``{at, prompt_len, max_tokens}``, the session's later chunks."""
    raw = fields.raw("stream")
    if raw is None:
        return ()
    at = fields.at("stream")
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(
            at, f"must be a non-empty list of {{at, prompt_len, max_tokens}}, not {as_written(raw)}"
        )
    if scheduler.mode != "sync":
        # A turn that ends with a batch of the session in flight makes vLLM drop that
        # batch's output (drop_stale_output), which the fabricated output does not model.
        raise ScenarioError(
            at,
            f"needs scheduler.mode: sync, not {scheduler.mode!r}: a turn that ends with a batch "
            "in flight is not modelled yet",
        )
    for other in ("stop_at", "abort_at", "remote_prefill"):
        if fields.raw(other) not in (None, False):
            raise ScenarioError(at, f"cannot go with {other} (a session ends when its stream does)")
    max_tokens = fields.integer("max_tokens", RequestSpec.max_tokens, limit="tokens")
    previous = fields.integer("arrival", 0, minimum=0)
    # vLLM keeps every token of a turn but its last sampled one (_update_request_as_session).
    tokens = prompt_len + max_tokens - 1
    parts = [f"{prompt_len} + {max_tokens} - 1"]
    chunks = []
    for index, item in enumerate(raw):
        one = Fields(item, Location(at.file, at.line), f"{at.field}[{index}]")
        chunk = StreamChunk(
            at=one.integer("at", minimum=0),
            prompt_len=one.integer("prompt_len", minimum=1, limit="tokens"),
            max_tokens=one.integer("max_tokens", max_tokens, minimum=1, limit="tokens"),
            line=one.mapping.line or at.line,
        )
        one.done()
        if chunk.at <= previous:
            raise ScenarioError(
                one.at("at"),
                f"must come after {previous} (the request's arrival or the chunk before)",
            )
        previous = chunk.at
        tokens += chunk.prompt_len + chunk.max_tokens - 1
        parts.append(f"{chunk.prompt_len} + {chunk.max_tokens} - 1")
        chunks.append(chunk)
    if tokens + 1 > model.max_model_len:
        parts[-1] = parts[-1].removesuffix(" - 1")  # the last turn drops nothing
        raise ScenarioError(
            at,
            f"the session's turns reach {tokens + 1} tokens ({' + '.join(parts)}: each turn "
            "keeps all its tokens but its last sampled one), past max_model_len "
            f"{model.max_model_len}",
        )
    return tuple(chunks)


def _parse_close_at(fields: Fields) -> int | None:
    """``close_at``: when a session's input stream closes (after its last chunk)."""
    close_at = fields.optional_int("close_at", minimum=0)
    if close_at is None:
        return None
    stream = fields.raw("stream")
    if not isinstance(stream, list) or not stream:
        raise ScenarioError(fields.at("close_at"), "needs stream (a streaming-input session)")
    last = stream[-1].get("at") if hasattr(stream[-1], "get") else None
    if isinstance(last, int) and close_at <= last:
        raise ScenarioError(fields.at("close_at"), f"must come after the last chunk's at ({last})")
    return close_at
