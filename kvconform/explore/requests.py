"""The requests of an explored scheduler workload: how many, their prompts and outputs, when
they arrive (over time with ``arrivals``; a conversation's next turn once its source can have
ended with ``follow_ups``), which prefix each shares, their acceptance patterns, priorities,
remote loads and failures, multimodal inputs, aborts and stops. Drawn by
:func:`kvconform.explore.strategies.workload` after the model and the scheduler settings,
whose features (``on``) say what may be drawn; docs/explore.md says why each is drawn so.
"""

from __future__ import annotations

from typing import Any

from kvconform.explore.draws import BOOLS, DrawFn, cdiv, ints, one_of
from kvconform.model.group_types import GROUP_TYPES

REQUEST_NAMES = ("a", "b", "c", "d", "e", "f")

# Steps a follow-up waits past its source's prefill and decode, besides two per other request
# drawn before it and a drawn pause (finish_bound): two batches in flight under asynchronous
# scheduling, up to three steps of an asynchronous KV load, two to spare. Not derived: slack.
FOLLOW_UP_SLACK = 7


def draw_requests(
    draw: DrawFn,
    on: dict[str, bool],
    scheduler: dict[str, Any],
    max_model_len: int,
    block_size: int,
    k: int,
    groups: int,
    opening: int,
) -> dict[str, Any]:
    """The requests, in arrival order of their drawing. With ``follow_ups``, each request after
    the first is, with even odds, a conversation's next turn (:func:`_draw_follow_up`), and a
    request of its own (an opening turn) has a prompt of at least ``opening`` tokens (two
    blocks past the widest window or chunk, where ``max_model_len`` allows)."""
    count = draw(ints(1, len(REQUEST_NAMES)))
    sync = scheduler["mode"] == "sync"
    requests: dict[str, Any] = {}
    mm_ids: dict[str, int] = {}  # one item, one length
    mm_limit = (
        scheduler["max_num_batched_tokens"]
        if scheduler.get("disable_chunked_mm_input")
        else max_model_len
    )
    for index, name in enumerate(REQUEST_NAMES[:count]):
        follows = on["follow_ups"] and bool(requests) and draw(BOOLS)
        body: dict[str, Any]
        if follows:
            body = _draw_follow_up(draw, scheduler, requests, max_model_len)
            prompt_len = body["prompt_len"]
        else:
            low = opening if on["follow_ups"] else 1
            prompt_len = draw(ints(low, max_model_len - 1))
            body = {"prompt_len": prompt_len}
            body["max_tokens"] = draw(ints(1, 24))
        if on["arrivals"] and not follows:
            arrival = draw(ints(0, 8))
            if arrival:
                body["arrival"] = arrival
        if on["prefix_caching"] and requests and not follows and draw(BOOLS):
            source = draw(one_of(tuple(requests)))
            limit = min(prompt_len, requests[source]["prompt_len"])
            body["prefix_from"] = source
            body["prefix_len"] = draw(ints(0, limit))
        if k and on["acceptance"]:
            body["accept"] = _draw_acceptance(draw, k, index)
        if on["priority"]:
            body["priority"] = draw(ints(-2, 2))
        loads = on["remote_kv"] and draw(BOOLS)
        if loads:
            body["remote_prefill"] = draw(one_of((True, 1, 2, 3)))
            failure = draw(ints(0, 2))
            if failure == 1:
                body["remote_load_fails"] = True
            elif failure == 2 and groups == 1:
                body["remote_load_fails"] = draw(ints(0, cdiv(prompt_len, block_size) - 1))
        if on["multimodal"] and not loads:
            inputs = _draw_mm_inputs(draw, name, prompt_len, mm_limit, mm_ids)
            if inputs:
                body["mm_inputs"] = inputs
        aborts = on["aborts"] and sync and draw(BOOLS)
        if aborts:
            body["abort_at"] = body.get("arrival", 0) + draw(ints(0, 10))
        elif on["stops"] and not loads and draw(BOOLS):
            # The loader's range: vLLM ends a request at max_model_len tokens regardless.
            room = min(body["max_tokens"], max_model_len - prompt_len)
            body["stop_at"] = draw(ints(1, room))
            if draw(BOOLS):
                body["stop_with"] = "eos"
        requests[name] = body
    return requests


def _draw_follow_up(
    draw: DrawFn, scheduler: dict[str, Any], earlier: dict[str, Any], max_model_len: int
) -> dict[str, Any]:
    """A conversation's next turn: the prompt of an earlier request (its source), whole with
    even odds (else a drawn part of it), then 0 or more new tokens, arriving once the source
    can have finished (at least :func:`finish_bound` of it, plus 0-4 steps).

    The format copies prompt tokens only (``prefix_from``), not the source's output, so the
    turn shares the source's prompt where a chat's would share its prompt and answer: the
    same reuse, one answer shorter."""
    source = draw(one_of(tuple(earlier)))
    whole = earlier[source]["prompt_len"]
    prefix_len = whole if draw(BOOLS) else draw(ints(1, whole))
    prompt_len = prefix_len + draw(ints(0, max(max_model_len - 1 - prefix_len, 0)))
    body: dict[str, Any] = {"prompt_len": prompt_len, "max_tokens": draw(ints(1, 24))}
    body["arrival"] = finish_bound(scheduler, earlier, source) + draw(ints(0, 4))
    body["prefix_from"] = source
    body["prefix_len"] = prefix_len
    return body


def finish_bound(scheduler: dict[str, Any], earlier: dict[str, Any], source: str) -> int:
    """The step by which ``source`` can have finished, from what is drawn (an estimate from
    above where nothing preempts it): its arrival, its prefill's steps at the step's token
    budget (or the long-prefill threshold, if lower), one step per output token (a
    speculative step emits at least one), :data:`FOLLOW_UP_SLACK`, two steps for each other
    request drawn before (``earlier`` holds the source and those), and a drawn pause."""
    body = earlier[source]
    chunk = int(scheduler["max_num_batched_tokens"])
    threshold = scheduler.get("long_prefill_token_threshold")
    if threshold:
        chunk = min(chunk, int(threshold))
    prefill = cdiv(int(body["prompt_len"]), chunk)
    pause = sum(int(p["resume_at"]) - int(p["at"]) for p in scheduler.get("pause", ()))
    others = 2 * (len(earlier) - 1)
    arrival = int(body.get("arrival", 0))
    return arrival + prefill + int(body["max_tokens"]) + FOLLOW_UP_SLACK + others + pause


def follow_ups(doc: dict[str, Any]) -> list[str]:
    """The requests of a drawn scheduler document that are follow-ups: a ``prefix_from``
    arriving at least :func:`finish_bound` of its source, counted over the requests before it
    (``arrivals`` alone draws arrivals of at most 8 steps, below every such bound)."""
    requests = doc["requests"]
    names = list(requests)
    found = []
    for index, name in enumerate(names):
        body = requests[name]
        source = body.get("prefix_from")
        if source is None or source not in names[:index]:
            continue
        earlier = {n: requests[n] for n in names[:index]}
        if int(body.get("arrival", 0)) >= finish_bound(doc["scheduler"], earlier, source):
            found.append(name)
    return found


def widest_reach(groups: list[Any]) -> int:
    """The widest window or chunk (tokens) of the drawn groups: what a prompt must pass for
    a hit to need its window's blocks (0: no group reads one)."""
    widest = 0
    for group in groups:
        if isinstance(group, str):
            continue
        reads = GROUP_TYPES[str(group["type"])].reads
        if reads is not None and group.get(reads[1]) is not None:
            widest = max(widest, int(group[reads[1]]))
    return widest


def _draw_acceptance(draw: DrawFn, k: int, index: int) -> Any:
    form = draw(ints(0, 3))
    if form == 0:
        return "none"
    if form == 1:
        return [draw(ints(0, k)) for _ in range(draw(ints(1, 4)))]
    if form == 2:
        return {"repeat": [draw(ints(0, k)) for _ in range(draw(ints(1, 3)))]}
    return {"rate": draw(one_of((0.3, 0.5, 0.8))), "seed": index}


def _draw_mm_inputs(
    draw: DrawFn, request: str, prompt_len: int, limit: int, known: dict[str, int]
) -> list[dict[str, Any]]:
    """Placeholder ranges in prompt order; an item may repeat one drawn before (same length)."""
    inputs: list[dict[str, Any]] = []
    position = 0
    for index in range(draw(ints(1, 3))):
        offset = position + draw(ints(0, 16))
        room = min(prompt_len - offset, limit)
        if room < 1:
            break
        reuse = [item for item, length in known.items() if length <= room]
        if reuse and draw(BOOLS):
            identifier = draw(one_of(tuple(sorted(reuse))))
            length = known[identifier]
        else:
            length = draw(ints(1, min(room, 64)))
            identifier = f"{request}-{index}"
            known[identifier] = length
        inputs.append({"offset": offset, "length": length, "id": identifier})
        position = offset + length
    return inputs
