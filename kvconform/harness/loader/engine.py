"""An engine scenario's ``engine`` section and requests (vLLM's real engine decides every step).

An engine scenario (scenarios/README.md, "Engine scenarios") describes what a
user gives ``vllm.LLM``: the target and draft model shapes, the engine options,
the speculative config and the requests. The ``model`` section keeps its meaning
(block size, ``max_model_len``, prefix caching as ``enable_caching``); its group
list must stay the default, since the engine builds its groups from the model.

What vLLM cannot build is refused here, from kvconform's own data (the method
registry's :class:`~kvconform.model.methods.EngineDraft` and ``engine_refusal``):
a method engine mode cannot run with the targets kvconform writes, a draft
architecture whose drafter class vLLM does not register, a draft size the
drafter must share with the target. The draft kvconform writes by default is the
method's rule applied to the target. What the selected vLLM's own registry
offers is asked at run time (:func:`kvconform.oracles.engine.unbuildable_reason`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields
from kvconform.harness.loader.requests import parse_request_map
from kvconform.model.group_types import DEFAULT_GROUPS
from kvconform.model.kind_specs import ENGINE_RUNNERS, EngineRequest, EngineSpec
from kvconform.model.methods import METHODS, EngineDraft, Method, method_for
from kvconform.model.scenario import ModelSpec, RequestSpec, SpeculativeSpec
from kvconform.model.tiny_model import ENGINE_TARGETS, TinyModel


def draft_model_methods() -> tuple[str, ...]:
    """Methods whose drafter is a model kvconform writes in engine mode (the draft shape
    applies), read from the registry in use (a methods file may add some)."""
    return tuple(name for name, m in METHODS.items() if m.engine_draft is not None)


DTYPES = ("bfloat16", "float16", "float32")


def parse_engine(
    raw: Any, where: Location, at: Location, speculative: SpeculativeSpec | None,
    model: ModelSpec, raw_requests: Any, requests_at: Location,
) -> tuple[EngineSpec, dict[str, RequestSpec]]:  # fmt: skip
    if tuple(g.type for g in model.groups) != DEFAULT_GROUPS:
        raise ScenarioError(
            where.at("model.groups"),
            "an engine scenario takes its KV-cache groups from the model vLLM builds; "
            "remove model.groups",
        )
    if speculative is not None and speculative.num_lookahead_tokens is not None:
        raise ScenarioError(
            speculative.where or where,
            "speculative.num_lookahead_tokens: an engine scenario takes the lookahead from "
            "the engine's own vllm_config; remove the override",
        )
    method = method_for(speculative.method) if speculative is not None else None
    if method is not None and method.engine_refusal is not None:
        assert speculative is not None
        raise ScenarioError(
            speculative.where or where.at("speculative.method"),
            f"engine mode cannot run method {method.name!r}: {method.engine_refusal}",
        )
    fields = Fields(raw, where, "engine")
    runner = fields.text("model_runner", "v2")
    if runner not in ENGINE_RUNNERS:
        raise ScenarioError(
            fields.at("model_runner"), f"must be one of {', '.join(ENGINE_RUNNERS)}, not {runner!r}"
        )
    target, target_fields = _parse_shape(fields.raw("target", None), fields, "target", TinyModel())
    draft = None
    if method is not None and method.engine_draft is not None:
        draft = _parse_draft(fields, method, method.engine_draft, target, target_fields)
    elif fields.raw("draft") is not None:
        raise ScenarioError(
            fields.at("draft"),
            f"only methods with a draft model ({', '.join(draft_model_methods())}) take a draft shape",
        )
    utilization = fields.raw("gpu_memory_utilization", 0.2)
    if not isinstance(utilization, float) or not 0 < utilization < 1:
        raise ScenarioError(
            fields.at("gpu_memory_utilization"),
            f"must be a fraction in (0, 1), not {utilization!r}",
        )
    spec_fields: dict[str, Any] = {
        "max_num_seqs": fields.integer("max_num_seqs", 4),
        "max_num_batched_tokens": fields.optional_int("max_num_batched_tokens", minimum=1),
        "enable_chunked_prefill": _optional_flag(fields, "enable_chunked_prefill"),
        "async_scheduling": _optional_flag(fields, "async_scheduling"),
        "enforce_eager": fields.flag("enforce_eager", True),
        "num_gpu_blocks": fields.optional_int("num_gpu_blocks", minimum=2, limit="blocks"),
    }
    fields.done()
    vocab = target.vocab

    def request(name: str, req: Fields, request_at: Location) -> RequestSpec:
        tokens = req.raw("prompt_token_ids")
        if tokens is not None:
            if (
                not isinstance(tokens, list)
                or not tokens
                or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                    for t in tokens
                )
            ):
                raise ScenarioError(
                    req.at("prompt_token_ids"),
                    f"must be a non-empty list of token ids below {vocab}",
                )
            if "prompt_len" in req.mapping:
                raise ScenarioError(
                    req.at("prompt_len"), "give prompt_len or prompt_token_ids, not both"
                )
            prompt_len = len(tokens)
        else:
            prompt_len = req.integer("prompt_len", limit="tokens")
        max_tokens = req.integer("max_tokens", RequestSpec.max_tokens, limit="tokens")
        if prompt_len + max_tokens > model.max_model_len:
            raise ScenarioError(
                req.at("max_tokens"),
                f"prompt ({prompt_len}) plus max_tokens ({max_tokens}) exceed max_model_len "
                f"{model.max_model_len}: the engine would stop the request early",
            )
        temperature = req.raw("temperature", 0.0)
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or temperature < 0
        ):
            raise ScenarioError(
                req.at("temperature"), f"must be a number >= 0, not {temperature!r}"
            )
        seed = req.optional_int("seed", minimum=0)
        if temperature and seed is None:
            raise ScenarioError(
                req.at("temperature"),
                "sampling with a temperature needs a seed, so the run repeats",
            )
        spec = RequestSpec(
            name=name,
            prompt_len=prompt_len,
            where=request_at,
            arrival=req.integer("arrival", 0, minimum=0),
            max_tokens=max_tokens,
        )
        index = len(engine_requests)
        engine_requests.append(
            EngineRequest(
                name,
                tuple(tokens) if tokens is not None else distinct_prompt(index, prompt_len, vocab),
                max_tokens,
                spec.arrival,
                float(temperature),
                seed,
            )
        )
        return spec

    engine_requests: list[EngineRequest] = []
    requests = parse_request_map(raw_requests, where, requests_at, "an engine scenario", request)
    engine = EngineSpec(target, draft, tuple(engine_requests), runner,
                        where=Location(where.file, fields.mapping.line or at.line, "engine"),
                        **spec_fields)  # fmt: skip
    if engine.max_num_batched_tokens is not None and engine.enable_chunked_prefill is False:
        longest = max(r.prompt_len for r in requests.values())
        if longest > engine.max_num_batched_tokens:
            raise ScenarioError(
                fields.at("max_num_batched_tokens"),
                f"without chunked prefill a {longest}-token prompt needs max_num_batched_tokens "
                f">= {longest}",
            )
    return engine, requests


def distinct_prompt(index: int, length: int, vocab: int) -> tuple[int, ...]:
    """A prompt of ``length`` tokens that no other request of the scenario shares a block of."""
    start = 1 + (index * 7919) % (vocab - 1)
    return tuple(1 + (start + t - 1) % (vocab - 1) for t in range(length))


def _optional_flag(fields: Fields, key: str) -> bool | None:
    return None if fields.mapping.get(key) is None else fields.flag(key, False)


def _parse_draft(parent: Fields, method: Method, rule: EngineDraft, target: TinyModel,
                 target_fields: Fields | None) -> TinyModel:  # fmt: skip
    """The draft kvconform writes for ``method`` and ``target``, with what the scenario states.

    By default a one-layer model of the target's sizes, in the architecture the method's
    rule gives for the target. A draft the selected vLLMs cannot build is refused, naming
    the combination (method, target, draft) and the vLLM code that refuses it.
    """
    default = replace(target, layers=1, architecture=rule.architecture_for(target.architecture),
                      extra=rule.extra(target))  # fmt: skip
    draft, fields = _parse_shape(parent.raw("draft", None), parent, "draft", default)
    combination = (
        f"method {method.name!r} with a {target.architecture} target and a "
        f"{draft.architecture} draft"
    )

    def at(key: str, shape: Fields | None, section: str) -> Location:
        return shape.at(key) if shape is not None else parent.at(f"{section}.{key}")

    if rule.architectures and draft.architecture not in rule.architectures:
        raise ScenarioError(
            at("architecture", fields, "draft"),
            f"{combination}: vLLM would name the drafter "
            f"{rule.drafter_class(draft.architecture)}, which its model registry lacks; "
            f"the draft may be {' or '.join(rule.architectures)} (kvconform writes "
            f"{rule.architectures[0]} when the field is left out): {rule.reason}",
        )
    for size in rule.from_target:
        if getattr(draft, size) != getattr(target, size):
            raise ScenarioError(
                at(size, fields, "draft"),
                f"{combination}: the draft's {size} ({getattr(draft, size)}) must be the "
                f"target's ({getattr(target, size)}): {rule.from_target_reason}",
            )
    if target.layers < rule.min_target_layers:
        raise ScenarioError(
            at("layers", target_fields, "target"),
            f"{combination}: the target needs at least {rule.min_target_layers} layers, not "
            f"{target.layers}: {rule.min_target_layers_reason}",
        )
    return draft


def _parse_shape(
    raw: Any, parent: Fields, key: str, default: TinyModel
) -> tuple[TinyModel, Fields | None]:
    """A model shape (and its fields, for locations), or ``default`` when none is written."""
    if raw is None:
        return default, None
    fields = Fields(raw, parent.where, f"engine.{key}")
    values: dict[str, Any] = {}
    for name in ("layers", "hidden_size", "intermediate_size", "heads", "kv_heads", "vocab"):
        values[name] = fields.integer(name, getattr(default, name))
    values["architecture"] = fields.text("architecture", default.architecture)
    values["dtype"] = fields.text("dtype", default.dtype)
    fields.done()
    if values["architecture"] not in ENGINE_TARGETS:
        raise ScenarioError(
            fields.at("architecture"),
            f"must be one of {', '.join(ENGINE_TARGETS)}, not {values['architecture']!r}",
        )
    if values["dtype"] not in DTYPES:
        raise ScenarioError(fields.at("dtype"), f"must be one of {', '.join(DTYPES)}")
    if values["hidden_size"] % values["heads"] or values["heads"] % values["kv_heads"]:
        raise ScenarioError(
            fields.at("heads"), "hidden_size must divide by heads, and heads by kv_heads"
        )
    return replace(default, **values), fields
