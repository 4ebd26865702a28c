"""A trajectory scenario's ``steps``: each step's actions, checked against the token state.

Every action is applied to the request's :class:`~kvconform.model.tokens.RequestTokens`,
so an impossible step (a prefill past the prompt, a spec step before the
prefill ends, a step past ``max_model_len``) is reported with its line and field.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.budget import check_count
from kvconform.harness.loader.fields import Fields, as_written, attempt, report, suggestion
from kvconform.harness.yamlio import LineDict, LineList
from kvconform.model.scenario import (
    NO_CHUNK_OPTIONS,
    STEP_OPERATIONS,
    Action,
    ChunkOptions,
    ModelSpec,
    RequestSpec,
    SpeculativeSpec,
    Step,
)
from kvconform.model.tokens import RequestTokens


def parse_steps(
    raw: Any,
    where: Location,
    at: Location,
    requests: dict[str, RequestSpec],
    model: ModelSpec,
    speculative: SpeculativeSpec | None,
) -> tuple[Step, ...]:
    if not isinstance(raw, LineList) or not raw:
        raise ScenarioError(at, "a trajectory needs a non-empty list of steps")
    # Counted before unrolling: repeat: 1000000000 must not be walked to be refused.
    count, line, field = _count_steps(raw)
    check_count(count, at.at(field, line), "the steps after repeat", "steps")
    tokens = {name: RequestTokens(spec) for name, spec in requests.items()}
    num_spec = speculative.num_speculative_tokens if speculative else None
    steps: list[Step] = []
    # A request whose call had a problem: its later calls would only repeat it.
    broken: set[str] = set()
    for line, body in _unroll(raw, where, "steps"):
        step_where = Location(where.file, line, f"steps[{len(steps)}]")
        if body is None:
            report(
                ScenarioError(
                    step_where,
                    "an empty step: a '-' with nothing after it; write {request: action} "
                    "there, or delete the line",
                )
            )
            steps.append(Step(len(steps), (), line))
            continue
        if not isinstance(body, LineDict) or not body:
            report(
                ScenarioError(
                    step_where,
                    f"a step maps request names to actions, e.g. {{a: decode}}, not {as_written(body)}",
                )
            )
            steps.append(Step(len(steps), (), line))
            continue
        calls = []
        reset, evict = _step_operations(body, step_where, tokens)
        for request, action_raw in body.items():
            if request in STEP_OPERATIONS:
                continue
            call_where = step_where.at(f"{step_where.field}.{request}", body.line_of(request))
            if request in broken:
                # Its token state is unknown after its broken call: what follows is not
                # applied (that would repeat the one mistake as its consequences), but a
                # mistake of its own (an unknown action, a wrong type) is still reported.
                attempt(_parse_written_action, action_raw, call_where)
                continue
            if request not in tokens:
                report(
                    ScenarioError(
                        call_where,
                        f"unknown request {request!r}{suggestion(request, tokens)}; requests: "
                        + ", ".join(tokens),
                    )
                )
                broken.add(request)
                continue

            def call(request: str, action_raw: Any, call_where: Location) -> Any:
                refused = isinstance(action_raw, LineDict) and "refused" in action_raw
                if refused:
                    wrapper = Fields(action_raw, call_where, call_where.field or "")
                    action_raw = wrapper.raw("refused")
                    wrapper.done()
                    call_where = wrapper.at("refused")
                action, count, accepted, options = _parse_action(action_raw, call_where)
                deferred = isinstance(action_raw, LineDict) and "finish" in action_raw
                return tokens[request].apply(
                    action,
                    call_where,
                    count=count,
                    accepted=accepted,
                    max_model_len=model.max_model_len,
                    num_speculative_tokens=num_spec,
                    refused=refused,
                    options=options,
                    deferred_free=deferred,
                )

            made, ok = attempt(call, request, action_raw, call_where)
            if ok:
                calls.append(made)
            else:
                broken.add(request)
        steps.append(Step(len(steps), tuple(calls), line, reset, evict))
    return tuple(steps)


def check_written_steps(raw: Any, where: Location, at: Location) -> None:
    """The steps as written, when a part they need (the model, the speculation) is broken:
    each call's action is read, nothing is applied, a repeat's steps are read once.
    Reports every mistake of their own (an unknown action, a wrong type)."""
    if not isinstance(raw, LineList) or not raw:
        raise ScenarioError(at, "a trajectory needs a non-empty list of steps")
    count, line, field = _count_steps(raw)
    check_count(count, at.at(field, line), "the steps after repeat", "steps")
    _check_written(raw, where, "steps")


def _check_written(steps: LineList, where: Location, path: str) -> None:
    for i, body in enumerate(steps):
        if not isinstance(body, LineDict):
            continue  # parse_steps' own messages need the request state; left to it
        if "repeat" in body:
            inner = body.get("steps")
            if isinstance(inner, LineList):
                _check_written(inner, where, f"{path}[{i}].steps")
            elif isinstance(body.get("step"), LineDict):
                _check_written_calls(body["step"], where, body.line_of("step"), f"{path}[{i}].step")
            continue
        _check_written_calls(body, where, steps.line_of(i), f"{path}[{i}]")


def _check_written_calls(body: LineDict, where: Location, line: int | None, path: str) -> None:
    for request, action in body.items():
        if request not in STEP_OPERATIONS:
            call_where = Location(where.file, body.line_of(request) or line, f"{path}.{request}")
            attempt(_parse_written_action, action, call_where)


def _parse_written_action(raw: Any, where: Location) -> None:
    """A call as written, with no token state: its ``refused`` wrapper and its action."""
    if isinstance(raw, LineDict) and "refused" in raw:
        wrapper = Fields(raw, where, where.field or "")
        raw = wrapper.raw("refused")
        wrapper.done()
        where = wrapper.at("refused")
    _parse_action(raw, where)


def _step_operations(
    body: LineDict, step_where: Location, tokens: dict[str, RequestTokens]
) -> tuple[bool | None, tuple[tuple[str, int], ...]]:
    """The step's ``reset_prefix_cache`` (the answer stated) and ``evict_cached`` (request
    -> columns of its group-0 table), what the engine does before the step's calls."""
    reset: bool | None = None
    evict: list[tuple[str, int]] = []
    if "reset_prefix_cache" in body:
        at = step_where.at(
            f"{step_where.field}.reset_prefix_cache", body.line_of("reset_prefix_cache")
        )
        value = body["reset_prefix_cache"]
        if not isinstance(value, bool):
            report(
                ScenarioError(
                    at,
                    "states what KVCacheManager.reset_prefix_cache answers: true (no request "
                    f"holds a block) or false, not {as_written(value)}",
                )
            )
        else:
            reset = value
    if "evict_cached" in body:
        at = step_where.at(f"{step_where.field}.evict_cached", body.line_of("evict_cached"))
        value = body["evict_cached"]
        if not isinstance(value, LineDict) or not value:
            report(
                ScenarioError(
                    at,
                    "maps request names to columns of their group-0 tables, e.g. {a: [1, 2]}, "
                    f"not {as_written(value)}",
                )
            )
            return reset, ()
        for name, columns in value.items():
            where = at.at(f"{at.field}.{name}", value.line_of(name))
            if name not in tokens:
                report(
                    ScenarioError(
                        where,
                        f"unknown request {name!r}{suggestion(name, tokens)}; requests: "
                        + ", ".join(tokens),
                    )
                )
                continue
            if (
                not isinstance(columns, list)
                or not columns
                or not all(type(c) is int and c >= 0 for c in columns)
            ):
                report(
                    ScenarioError(
                        where,
                        "must be a non-empty list of column indices (integers from 0) of the "
                        f"request's group-0 table, not {as_written(columns)}",
                    )
                )
                continue
            evict.extend((name, column) for column in columns)
    return reset, tuple(evict)


def _count_steps(raw: LineList, path: str = "steps") -> tuple[int, int | None, str]:
    """The steps ``raw`` unrolls to, with the line and field of its largest repeat (the
    one to lower); a malformed repeat counts once, for :func:`_unroll` to report."""
    total, line, field, largest = 0, raw.line, path, 0
    for i, body in enumerate(raw):
        if isinstance(body, LineDict) and "repeat" in body:
            times = body.get("repeat")
            times = times if type(times) is int and times > 0 else 1
            inner = body.get("steps")
            if not isinstance(inner, LineList):
                inner = LineList([body.get("step")])
            inner_count, _, _ = _count_steps(inner, f"{path}[{i}].steps")
            count = times * inner_count
            if count > largest:
                largest, line, field = count, body.line_of("repeat"), f"{path}[{i}].repeat"
            total += count
        else:
            total += 1
    return total, line, field


def _unroll(raw: LineList, where: Location, path: str) -> Iterable[tuple[int | None, Any]]:
    for i, body in enumerate(raw):
        line = raw.line_of(i)
        if isinstance(body, LineDict) and "repeat" in body:
            fields = Fields(body, Location(where.file, line), f"{path}[{i}]")
            times = fields.integer("repeat")
            inner = fields.raw("steps")
            if inner is None:
                single = fields.raw("step")
                if single is None:
                    raise ScenarioError(fields.at("step"), "repeat needs 'step' or 'steps'")
                inner = LineList([single])
                inner.line, inner.item_lines = body.line_of("step"), [body.line_of("step") or 0]
            fields.done()
            if not isinstance(inner, LineList) or not inner:
                raise ScenarioError(fields.at("steps"), "must be a non-empty list of steps")
            for _ in range(times):
                yield from _unroll(inner, where, f"{path}[{i}].steps")
        else:
            yield line, body


def _parse_action(raw: Any, where: Location) -> tuple[Action, int, int | None, ChunkOptions]:
    if raw is None:
        raise ScenarioError(
            where,
            "no action after the request's name; use decode, finish, preempt, "
            "{prefill: N} or {spec: K}",
        )
    if isinstance(raw, str):
        try:
            action = Action(raw)
        except ValueError:
            action = None
        if action in (Action.DECODE, Action.FINISH, Action.PREEMPT):
            return action, 0, None, NO_CHUNK_OPTIONS
        hint = suggestion(raw, ("decode", "finish", "preempt"))
        raise ScenarioError(
            where,
            f"unknown action {raw!r}{hint}; use decode, finish, preempt, {{prefill: N}} or "
            "{spec: K}",
        )
    if isinstance(raw, LineDict):
        fields = Fields(raw, Location(where.file, where.line), where.field or "")
        if "prefill" in raw:
            count = fields.integer("prefill")
            options = _parse_chunk_options(fields)
            fields.done()
            return Action.PREFILL, count, None, options
        if "finish" in raw:
            how = fields.raw("finish")
            fields.done()
            if how != "in_flight":
                raise ScenarioError(
                    fields.at("finish"),
                    "a finish says only in_flight ({finish: in_flight}: its last step is "
                    f"still running, so its blocks go back after it), not {as_written(how)}",
                )
            return Action.FINISH, 0, None, NO_CHUNK_OPTIONS
        if "spec" in raw:
            count = fields.integer("spec")
            accepted = fields.optional_int("accepted")
            fields.done()
            return Action.SPEC, count, accepted, NO_CHUNK_OPTIONS
    shown = as_written(raw) if not isinstance(raw, LineDict) else "{" + ", ".join(raw) + "}"
    hint = (
        suggestion(next(iter(raw)), ("prefill", "spec"))
        if isinstance(raw, LineDict) and raw
        else ""
    )
    raise ScenarioError(
        where,
        f"unknown action {shown}{hint}; use decode, finish, preempt, {{prefill: N}} or {{spec: K}}",
    )


def _parse_chunk_options(fields: Fields) -> ChunkOptions:
    """A prefill's scheduler arguments, stated outcomes and tokens in flight (scenarios/README.md)."""
    options = ChunkOptions(
        external=fields.integer("external", 0, minimum=0),
        load_async=fields.flag("load_async", False),
        full_sequence_must_fit=(
            None
            if fields.raw("full_sequence_must_fit") is None
            else fields.flag("full_sequence_must_fit", False)
        ),
        reserved_blocks=fields.integer("reserved_blocks", 0, minimum=0),
        expect_hit=fields.optional_int("expect_hit"),
        in_flight=fields.integer("in_flight", 0, minimum=0),
        connector=fields.optional_int("connector"),
    )
    return options if options != NO_CHUNK_OPTIONS else NO_CHUNK_OPTIONS
