"""Hypothesis strategies that draw legal scenario documents (format v1).

:func:`scenario_documents` draws a model (one to four groups of the types in the
:class:`~kvconform.fuzz.space.FuzzSpace`, block sizes, ``max_model_len``,
pool size), speculative settings (any declared method, ``k``, DSpark's
``sample_from_anchor`` both ways) and a trajectory (several requests, chunked
prefill, spec steps with any acceptance, plain decode, preempt and recompute,
finish), and returns it as the plain dict a scenario file would load into.

**Legal by construction.** Every request's token state is a
:class:`~kvconform.model.tokens.RequestTokens`, the class the loader uses;
:func:`legal_advance` offers only actions it accepts (prefill chunks up to what is
left and up to ``max_model_len - computed - 1``, ``k`` drafts at most, no decode
before the prefill is done), and each drawn action is applied to it. A document
the loader refuses is a bug of this module, not a finding.

**Edges.** ``max_model_len`` is drawn often just below a multiple of the
scheduler block size and prompts often within a few tokens of it, so the
lookahead crosses ``max_model_len`` and the cap decides a block count. The pool
is sized from :mod:`~kvconform.fuzz.pool`'s upper bound plus a slack
that shrinks to 0, so pools run at or near full.

**Shrinking.** Hypothesis shrinks towards the first option and towards zero,
so each choice is laid out with its simplest value there: fewer groups; full
attention; block size 16; speculation on, method eagle; whole-prompt prefill
chunks; all drafts accepted; a request idle in a step (an all-idle step is
dropped); fewer steps. A shrunk reproducer is a few plain steps.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from math import lcm
from typing import Any, NamedTuple

from hypothesis import strategies as st

from kvconform.errors import Location
from kvconform.fuzz.pool import GroupDemand, PoolDemand
from kvconform.fuzz.space import FuzzSpace
from kvconform.model.group_types import GROUP_TYPES, GroupType
from kvconform.model.methods import method_for
from kvconform.model.scenario import Action, RequestSpec
from kvconform.model.tokens import RequestTokens

DrawFn = Callable[[st.SearchStrategy[Any]], Any]

REQUEST_NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")


@cache
def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    # Building a strategy costs more than drawing from it; bounds repeat a lot.
    return st.integers(low, high)


_BOOLS = st.booleans()


@cache
def _one_of(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(options)


_NOWHERE = Location("<fuzz>")


def draw_options(
    draw: DrawFn, group_type: GroupType, block_size: int, space: FuzzSpace
) -> dict[str, Any]:
    """The options of one group of ``group_type``, drawn as its registry entry says.

    An option without a :class:`~kvconform.model.group_types.Draw` keeps its default;
    an ``offered`` option drawn at its default is left out of the document.
    """
    options: dict[str, Any] = {}
    for name, option in group_type.options.items():
        how = option.draw
        if how is None:
            continue
        if how.kind == "tokens":
            options[name] = draw(_ints(how.low, how.high * block_size))
        elif how.kind == "blocks":
            options[name] = block_size * draw(_ints(how.low, how.high))
        elif how.kind == "offered":
            offered = space.offered_choices.get((group_type.name, name), option.choices)
            values = sorted(offered, key=lambda v: (v != option.default, str(v)))
            value = draw(_one_of(tuple(values)))
            if value != option.default:
                options[name] = value
        else:
            raise ValueError(f"{group_type.name}.{name}: unknown draw kind {how.kind!r}")
    return options


class Advance(NamedTuple):
    """How far a request can move now."""

    prefill: int  # the largest prefill chunk; 0: no prefill possible
    decode: bool  # a plain decode step is possible
    spec: int  # the largest spec K; 0: no spec step possible


def legal_advance(
    tokens: RequestTokens, max_model_len: int, num_speculative_tokens: int | None
) -> Advance:
    """The moves :meth:`RequestTokens.apply` accepts for a request, at their largest.

    The scheduler schedules at most ``max_model_len - computed - 1`` tokens: a
    prefill chunk at most that many (and no more than is left to prefill); a
    decode one; a spec step ``1 + K`` with ``K <= num_speculative_tokens``.
    """
    room = max_model_len - 1 - tokens.computed
    if tokens.finished or room < 1:
        return Advance(0, False, 0)
    if tokens.needs_prefill:
        return Advance(min(tokens.pending, room), False, 0)
    return Advance(0, True, max(0, min(num_speculative_tokens or 0, room - 1)))


@st.composite
def scenario_documents(draw: DrawFn, space: FuzzSpace, name: str = "fuzz") -> dict[str, Any]:
    """One legal scenario document drawn from ``space``."""
    groups, block_sizes = _draw_groups(draw, space)
    scheduler_block = lcm(*block_sizes)
    max_model_len = _draw_max_model_len(draw, space, scheduler_block)
    speculative, canonical = _draw_speculative(draw, space)
    k = speculative["num_speculative_tokens"] if speculative else None
    anchor = bool(speculative.get("sample_from_anchor", True)) if speculative else True
    lookahead = space.lookahead(canonical, k or 0, anchor)

    has_cross = any(GROUP_TYPES[_type_of(g)].encoder for g in groups)
    max_encoder_len = draw(_ints(1, space.max_encoder_len)) if has_cross else 0
    requests = _draw_requests(draw, space, max_model_len, max_encoder_len)
    demand = PoolDemand(
        tuple(_demand(g, block_sizes[i], k) for i, g in enumerate(groups)),
        max_model_len,
        lookahead,
    )
    steps = _draw_steps(draw, space, requests, max_model_len, k, demand, max_encoder_len)
    slack = draw(_ints(0, 6))

    model: dict[str, Any] = {
        "block_size": block_sizes[0],
        "max_model_len": max_model_len,
        "num_blocks": 1 + max(demand.peak, 1) + slack,
    }
    if has_cross:
        model["max_encoder_len"] = max_encoder_len
    model["groups"] = groups
    if len(set(block_sizes)) > 1 and any(
        GROUP_TYPES[_type_of(g)].caching_needs_one_block_size for g in groups
    ):
        # vLLM caches such a model only with one block size: prefix caching off, and the
        # options vLLM derives from it as vLLM derives them.
        model["enable_caching"] = False
        model["groups"] = groups = [_without_caching(g) for g in groups]
    doc: dict[str, Any] = {"name": name, "model": model}
    if speculative:
        doc["speculative"] = speculative
    # Requests that never act say nothing; a shrunk reproducer leaves them out.
    acting = {name for step in steps for name in step}
    doc["requests"] = {name: body for name, body in requests.items() if name in acting}
    doc["steps"] = steps
    return doc


def _without_caching(group: Any) -> Any:
    """A drawn group with its caching-following options as vLLM sets them with caching off."""
    if isinstance(group, str):
        return group
    group_type = GROUP_TYPES[group["type"]]
    options = dict(group)
    for name, option in group_type.options.items():
        if option.follows_caching is not None and name in options:
            value = option.follows_caching[False]
            if value == option.default:
                del options[name]
            else:
                options[name] = value
    return options if len(options) > 1 else group["type"]


def _type_of(group: Any) -> str:
    return group if isinstance(group, str) else str(group["type"])


def _draw_groups(draw: DrawFn, space: FuzzSpace) -> tuple[list[Any], list[int]]:
    count = draw(_ints(1, space.max_groups))
    groups: list[Any] = []
    block_sizes: list[int] = []
    for index in range(count):
        drawn_from = space.aimed_types if index == 0 and space.aimed_types else space.group_types
        type_name = draw(_one_of(drawn_from))
        block_size = draw(_one_of(space.block_sizes))
        options = draw_options(draw, GROUP_TYPES[type_name], block_size, space)
        block_sizes.append(block_size)
        if block_sizes[0] != block_size:
            options["block_size"] = block_size
        groups.append({"type": type_name, **options} if options else type_name)
    return groups, block_sizes


def _draw_max_model_len(draw: DrawFn, space: FuzzSpace, scheduler_block: int) -> int:
    longest = space.max_blocks_per_len * max(space.block_sizes)
    if draw(_ints(0, 2)) == 0:
        return int(draw(_ints(2, longest)))
    # At or just below a multiple of the scheduler block: the lookahead crosses the
    # block boundary past max_model_len, so the cap decides a block count.
    blocks = draw(_ints(1, max(1, longest // scheduler_block)))
    return max(2, blocks * scheduler_block - _small(draw, 7))


def _draw_speculative(draw: DrawFn, space: FuzzSpace) -> tuple[dict[str, Any] | None, str | None]:
    """The document's speculative section, and the canonical method it names."""
    if not space.methods or draw(_ints(0, 7)) == 7:
        return None, None
    # Methods whose drafter writes no KV (lookahead 0) all allocate alike: a quarter
    # of the draws is enough for them; the rest go to the methods with a lookahead.
    drafting = tuple(m for m in space.methods if space.lookahead(m, 1, True) > 0)
    others = tuple(m for m in space.methods if m not in drafting)
    choices = others if not drafting or (others and draw(_ints(0, 3)) == 3) else drafting
    canonical = draw(_one_of(choices))
    section: dict[str, Any] = {
        "method": draw(_one_of(space.methods[canonical])),
        "num_speculative_tokens": draw(_ints(1, space.max_speculative_tokens)),
    }
    entry = method_for(canonical)
    if entry is not None and entry.anchor_layouts and draw(_BOOLS):
        section["sample_from_anchor"] = False
    return section, canonical


def _draw_requests(
    draw: DrawFn, space: FuzzSpace, max_model_len: int, max_encoder_len: int
) -> dict[str, dict[str, int]]:
    count = draw(_ints(1, space.max_requests))
    near = min(max_model_len - 2, 2 * space.max_speculative_tokens + 4)
    requests: dict[str, dict[str, int]] = {}
    # Every slot is drawn, used or not, so that dropping a request while shrinking
    # does not shift what the draws after it mean (see _draw_steps).
    for name in REQUEST_NAMES[: space.max_requests]:
        if draw(_BOOLS):
            prompt_len = max_model_len - 1 - _small(draw, near)  # near the edge
        else:
            prompt_len = draw(_ints(1, max_model_len - 1))
        body = {"prompt_len": prompt_len}
        encoder_len = draw(_ints(0, max_encoder_len)) if max_encoder_len else 0
        if encoder_len:  # 0: the model's max_encoder_len
            body["encoder_len"] = encoder_len
        if len(requests) < count:
            requests[name] = body
    return requests


def _small(draw: DrawFn, high: int) -> int:
    """A number in 0..high, mostly 0..3."""
    return int(draw(_ints(0, min(3, high)) if draw(_BOOLS) else _ints(0, high)))


def _demand(group: Any, block_size: int, k: int | None) -> GroupDemand:
    group_type = GROUP_TYPES[_type_of(group)]
    options = {} if isinstance(group, str) else group
    # Speculative state blocks default to k (vLLM's MambaBase does the same).
    option = group_type.speculative_blocks
    extra = int(options.get(option) or k or 0) if option is not None else 0
    return GroupDemand(group_type.floor_for(options), block_size, extra)


# A request's move in a step, from one integer: Hypothesis shrinks it towards idle.
_IDLE, _ADVANCE, _PREEMPT, _FINISH = range(4)
_MOVES = (_IDLE,) * 3 + (_ADVANCE,) * 19 + (_PREEMPT, _FINISH)


def _draw_steps(
    draw: DrawFn,
    space: FuzzSpace,
    requests: dict[str, dict[str, int]],
    max_model_len: int,
    k: int | None,
    demand: PoolDemand,
    max_encoder_len: int,
) -> list[dict[str, Any]]:
    tokens = {
        name: RequestTokens(RequestSpec(name, body["prompt_len"]))
        for name, body in requests.items()
    }
    encoder = {name: body.get("encoder_len") or max_encoder_len for name, body in requests.items()}
    steps: list[dict[str, Any]] = []
    for _ in range(draw(_ints(1, space.max_steps))):
        step: dict[str, Any] = {}
        # A move is drawn for every request slot, also for absent and finished
        # requests (and ignored): the shrinker can then turn a request's finish
        # into idling, or drop a request, without shifting every later draw.
        for name in REQUEST_NAMES[: space.max_requests]:
            move = _MOVES[draw(_ints(0, len(_MOVES) - 1))]
            state = tokens.get(name)
            if state is None or state.finished:
                continue
            action = _move(draw, move, state, max_model_len, k)
            if action is None:
                continue
            step[name] = action
            _apply(state, action, max_model_len, k, demand, encoder[name])
        if step:
            steps.append(step)
    if draw(_BOOLS):
        last = {name: "finish" for name, state in tokens.items() if not state.finished}
        for name in last:
            _apply(tokens[name], "finish", max_model_len, k, demand, encoder[name])
        if last:
            steps.append(last)
    if not steps:  # every request idled: run the first one's prompt
        name, state = next(iter(tokens.items()))
        action = {"prefill": legal_advance(state, max_model_len, k).prefill}
        _apply(state, action, max_model_len, k, demand, encoder[name])
        steps.append({name: action})
    return steps


# An advancing request draws exactly three numbers, whatever it does with them, so
# that a step turning from a chunk into the whole prompt (or from prefill into spec)
# while shrinking does not shift the meaning of every later draw. 0 is the simplest.
_SHAPE = 64


def _move(draw: DrawFn, move: int, state: RequestTokens, max_model_len: int, k: int | None) -> Any:
    if move == _FINISH:
        return "finish"
    if move == _PREEMPT:
        return "preempt" if state.holds_blocks else None
    if move == _IDLE:
        return None
    shape, size, rejected = (draw(_ints(0, _SHAPE - 1)) for _ in range(3))
    advance = legal_advance(state, max_model_len, k)
    if advance.prefill:
        # Half the time the rest of the prompt in one chunk, else a cut of any size.
        half = _SHAPE // 2
        if shape < half or advance.prefill == 1:
            return {"prefill": advance.prefill}
        cut = 1 + (shape - half) * (advance.prefill - 1) // half
        return {"prefill": advance.prefill - cut}
    if not advance.decode:
        return None
    if not advance.spec or shape >= 3 * _SHAPE // 4:  # a quarter plain decode
        return "decode"
    count = advance.spec - size * advance.spec // _SHAPE
    accepted = count - rejected * (count + 1) // _SHAPE
    return {"spec": count} if accepted == count else {"spec": count, "accepted": accepted}


def _apply(
    state: RequestTokens,
    action: Any,
    max_model_len: int,
    k: int | None,
    demand: PoolDemand,
    encoder_len: int,
) -> None:
    if isinstance(action, str):
        kind, count, accepted = Action(action), 0, None
    elif "prefill" in action:
        kind, count, accepted = Action.PREFILL, action["prefill"], None
    else:
        kind, count, accepted = Action.SPEC, action["spec"], action.get("accepted")
    call = state.apply(
        kind,
        _NOWHERE,
        count=count,
        accepted=accepted,
        max_model_len=max_model_len,
        num_speculative_tokens=k,
    )
    if call.allocates:
        admission = state.num_tokens if call.first_chunk else 0
        demand.schedule(state.spec.name, call.computed, call.scheduled, encoder_len, admission)
    else:
        demand.release(state.spec.name)
