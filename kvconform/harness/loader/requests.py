"""Requests: the ``requests`` map every kind with requests reads, and acceptance patterns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.budget import check_count
from kvconform.harness.loader.fields import Abandoned, Fields, attempt
from kvconform.harness.yamlio import LineDict
from kvconform.model.scenario import (
    ACCEPT_ALL,
    STEP_OPERATIONS,
    Acceptance,
    RequestSpec,
    SpeculativeSpec,
)


def parse_request_map(
    raw: Any,
    where: Location,
    at: Location,
    what: str,
    parse_one: Callable[[str, Fields, Location], RequestSpec],
) -> dict[str, RequestSpec]:
    """Requests by name, each read by ``parse_one``; prefixes must name an earlier request."""
    if not isinstance(raw, LineDict) or not raw:
        raise ScenarioError(at, f"{what} needs a mapping of request names to requests")
    check_count(len(raw), at, "the requests", "requests")
    requests: dict[str, RequestSpec] = {}
    broken = False
    for name, body in raw.items():
        request_at = Location(where.file, raw.line_of(name), f"requests.{name}")

        def read(name: str, body: Any, request_at: Location) -> tuple[RequestSpec, Fields]:
            fields = Fields(body, Location(where.file, raw.line_of(name)), f"requests.{name}")
            request = parse_one(name, fields, request_at)
            fields.done()
            return request, fields

        (request, fields), ok = attempt(read, name, body, request_at, fallback=(None, None))
        if not ok:
            broken = True
            continue
        prefix_from = request.prefix_from
        if prefix_from is not None and prefix_from not in requests:
            raise ScenarioError(
                fields.at("prefix_from"), f"must name a request defined above, not {prefix_from!r}"
            )
        if prefix_from is not None:
            limit = min(request.prompt_len, requests[prefix_from].prompt_len)
            if request.prefix_len > limit:
                raise ScenarioError(fields.at("prefix_len"), f"must be at most {limit}")
        requests[name] = request
    if broken:
        raise Abandoned  # the steps would name a request that is not there
    return requests


_ACCEPT_FORMS = "all, none, a list [a1, a2, ...], {repeat: [...]} or {rate: R, seed: S}"


def parse_acceptance(fields: Fields, speculative: SpeculativeSpec | None) -> Acceptance:
    raw = fields.raw("accept")
    at = fields.at("accept")
    if raw is None or raw == "all":
        return ACCEPT_ALL
    if speculative is None:
        raise ScenarioError(at, "an acceptance pattern needs a 'speculative' section")
    k = speculative.num_speculative_tokens
    if raw == "none":
        return Acceptance("repeat", (0,))
    if isinstance(raw, list):
        return Acceptance("list", _accepted_counts(raw, at, k))
    if isinstance(raw, LineDict) and len(raw) >= 1:
        inner = Fields(raw, Location(at.file, at.line), at.field or "accept")
        if "repeat" in raw:
            values = inner.raw("repeat")
            inner.done()
            if not isinstance(values, list) or not values:
                raise ScenarioError(inner.at("repeat"), "must be a non-empty list of counts")
            return Acceptance("repeat", _accepted_counts(values, inner.at("repeat"), k))
        if "rate" in raw:
            rate = inner.raw("rate")
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ScenarioError(inner.at("rate"), f"must be a number in 0..1, not {rate!r}")
            seed = inner.integer("seed", 0, minimum=0)
            inner.done()
            return Acceptance("rate", rate=float(rate), seed=seed)
    raise ScenarioError(at, f"must be {_ACCEPT_FORMS}, not {raw!r}")


def _accepted_counts(values: list[Any], at: Location, k: int) -> tuple[int, ...]:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= k:
            raise ScenarioError(
                at,
                f"accepted drafts must be integers in 0..{k} (num_speculative_tokens), "
                f"not {value!r}",
            )
    return tuple(values)


def parse_requests(raw: Any, where: Location, at: Location) -> dict[str, RequestSpec]:
    def request(name: str, fields: Fields, request_at: Location) -> RequestSpec:
        if name in ("repeat", "step", "steps", *STEP_OPERATIONS):
            raise ScenarioError(
                fields.at("prompt_len"), f"{name!r} is reserved in steps; rename the request"
            )
        return RequestSpec(
            name=name,
            prompt_len=fields.integer("prompt_len", limit="tokens"),
            encoder_len=fields.integer("encoder_len", 0, minimum=0, limit="tokens"),
            prefix_from=fields.optional_text("prefix_from"),
            prefix_len=fields.integer("prefix_len", 0, minimum=0),
            where=request_at,
            kv_cache_report_full=_report_mode(fields),
            skip_reading_prefix_cache=fields.flag("skip_reading_prefix_cache", False),
        )

    return parse_request_map(raw, where, at, "a trajectory", request)


def _report_mode(fields: Fields) -> bool:
    """``kv_cache_report``: ``incremental`` (vLLM's default) or ``full``, the request's
    ``kv_cache_report_mode`` (``SamplingParams.extra_args``)."""
    mode = fields.raw("kv_cache_report", "incremental")
    if mode not in ("incremental", "full"):
        raise ScenarioError(
            fields.at("kv_cache_report"),
            f"must be incremental or full (the request's kv_cache_report_mode), not {mode!r}",
        )
    return bool(mode == "full")
