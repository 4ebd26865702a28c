"""A scheduler scenario's requests: what each asks of vLLM's scheduler, and what it must see.

The ``scheduler`` section is read first (:mod:`kvconform.harness.loader.scheduler`): a
request's options (priority, aborts, remote prefills, streaming input) depend on it.
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields, as_written
from kvconform.harness.loader.requests import parse_acceptance, parse_request_map
from kvconform.harness.loader.scheduler import choice
from kvconform.harness.yamlio import LineDict
from kvconform.model.kind_specs import STOP_TOKENS, SchedulerSpec
from kvconform.model.scenario import MmInput, ModelSpec, RequestSpec, SpeculativeSpec, StreamChunk


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
            **_parse_stop(fields, model, prompt_len),
            stream=_parse_stream(fields, model, scheduler, prompt_len),
            close_at=_parse_close_at(fields),
            expect_rejected=_parse_expect_rejected(fields, mm_inputs, mm_lengths),
        )

    requests = parse_request_map(raw, where, at, "a scheduler scenario", request)
    check_load_failure_policy(scheduler, requests)
    return requests


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


def _parse_stop(fields: Fields, model: ModelSpec, prompt_len: int) -> dict[str, Any]:
    """``stop_at``: the output token that stops the request; ``stop_with``: what stops it."""
    stop_at = fields.optional_int("stop_at", minimum=1)
    stop_with = choice(fields, "stop_with", RequestSpec.stop_with, STOP_TOKENS)
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
    # check_stop ends a request at max_model_len tokens (FINISHED_LENGTH_CAPPED) after it
    # looks for the stop token: output max_model_len - prompt_len can stop it, no later one.
    room = model.max_model_len - prompt_len
    if stop_at > room:
        raise ScenarioError(
            fields.at("stop_at"),
            f"must be at most {room} (max_model_len {model.max_model_len} less prompt_len "
            f"{prompt_len}): vLLM ends the request at max_model_len tokens regardless",
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
