"""What every check shares: the failure record at one observation, and the shape of a miss.

:func:`failure_at` builds a :class:`~kvconform.model.results.Failure` at one
observation with every number a reader needs and what the floor was made of
(its lookahead, the floor the same step would have without it, whether
``max_model_len`` capped it, the decode-context-parallel factor); the root
causes read the shape of a miss from those numbers (:func:`below_floor`,
:func:`above`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain

from kvconform.model.facts import Fact
from kvconform.model.floors import cdiv
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kinds import entry
from kvconform.model.observations import Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Shortfall, describe_shortfalls

# The parties whose holdings an observation records, as a check's message names them.
PARTY_NAMES: dict[str, str] = {
    Party.LIVE: "the live KVCacheManager",
    Party.PREDICTED: "the warmup predictor _reserved_block_count",
    Party.WARMUP: "the recorded warmup",
}


def failure_at(
    check: str,
    trajectory: Trajectory,
    obs: Observation,
    message: str,
    detail: dict | None = None,
    party: str | None = None,
) -> Failure:
    """A failure of ``check`` at one observation (step, request, group)."""
    group = trajectory.groups[obs.group]
    where = f"line {obs.line}, " if obs.line is not None else ""
    encoder_len = trajectory.encoder_lens.get(obs.request, 0)
    # What the floor is made of, for the root causes: the same step's floor without
    # the lookahead, and whether max_model_len capped the writes.
    without_lookahead = group.step_floor()(obs.computed, obs.scheduled, 0, encoder_len)
    written = obs.computed + obs.scheduled + obs.lookahead
    capped = 0 < trajectory.max_model_len < written
    rule = group.floor_rule
    block_tokens = (
        group.block_size * int(group.floor_args.get("dcp_world_size", 1))
        if rule.counts_token_columns
        else None
    )
    return Failure(
        check=check,
        message=f"step {obs.step} ({where}{obs.label}) request {obs.request}, group {obs.group} "
        f"({group.label}): {message}",
        step=obs.step,
        line=obs.line,
        request=obs.request,
        group=obs.group,
        spec_type=GROUP_TYPES[group.type].vllm_class,
        live=obs.live,
        predicted=obs.predicted,
        warmup=obs.warmup,
        floor=obs.floor,
        action=obs.label,
        party=party,
        lookahead=obs.lookahead,
        floor_without_lookahead=without_lookahead,
        capped=capped,
        dcp=int(group.floor_args.get("dcp_world_size", 1)),
        computed=obs.computed,
        scheduled=obs.scheduled,
        written_end=min(written, trajectory.max_model_len) if capped else written,
        block_tokens=block_tokens,
        detail=detail,
    )


def blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def live_party(result: ScenarioResult) -> Party:
    """The live side of a scenario: the allocator, or vLLM's scheduler or engine that
    decided the steps (``KindEntry.live_party``)."""
    return entry(result.kind).live_party


def named(result: ScenarioResult, party: str | None) -> str:
    """A record's party, with the live one named as the live side of the scenario's kind."""
    return live_party(result) if party is None or party == Party.LIVE else party


def count(failure: Failure, party: str) -> int | None:
    value = getattr(failure, party, None)
    return value if isinstance(value, int) else None


def shortfall(held: int, floor: int, failure: Failure) -> Shortfall:
    """The shape of one count below the floor, from the numbers the record carries."""
    uncovered: int | None = None
    target_short = False
    if failure.written_end is not None and failure.block_tokens:
        covered = held * failure.block_tokens
        uncovered = max(0, failure.written_end - covered)
        target_end = (failure.computed or 0) + (failure.scheduled or 0)
        target_short = covered < min(target_end, failure.written_end)
    return Shortfall(
        held=held,
        floor=floor,
        lookahead=failure.lookahead or 0,
        uncovered=uncovered,
        target_short=target_short,
        without_lookahead=bool(failure.lookahead) and held == failure.floor_without_lookahead,
        capped=failure.capped,
        dcp_factor=failure.dcp > 1 and held == cdiv(floor, failure.dcp),
    )


def below_floor(held: int, floor: int, failure: Failure) -> str:
    """How one count below the floor falls short: the sentence of its shape."""
    return describe_shortfalls([shortfall(held, floor, failure)])[1]


def above(larger: int, smaller: int, failure: Failure) -> str:
    """How much more one party holds than the other, both at or above the floor."""
    if failure.capped and larger - smaller == 1:
        return "by one block at the max_model_len cap"
    if failure.dcp > 1 and smaller == cdiv(larger, failure.dcp):
        return "by the DCP factor"
    return "by one block" if larger - smaller == 1 else "by several blocks"


def fact_failure(fact: Fact, message: str, invariant: str, check: str = "sanity") -> Failure:
    """A failure of ``check`` at the place a fact was recorded (kvconform.model.facts),
    blamed on the live party and named by its ``invariant``."""
    where = f"line {fact.line}, " if fact.line is not None else ""
    return Failure(
        check,
        f"step {fact.step} ({where}{fact.label}) request {fact.request}: {message}",
        step=fact.step,
        line=fact.line,
        request=fact.request,
        action=fact.label,
        party=Party.LIVE,
        detail={"invariant": invariant},
    )


def at_request(trajectory: Trajectory, fact: Fact, request: str) -> Fact:
    """``fact`` as a fact of ``request``, at its line in the scenario (scheduler mode)."""
    return fact._replace(request=request, line=trajectory.request_lines.get(request))


def facts_of(trajectory: Trajectory, *kinds: type) -> Iterator[tuple[int, Fact]]:
    """(index, fact) of the trajectory's facts whose payload is one of ``kinds``, in
    recording order."""
    index = _fact_index if _fact_index is not None and _fact_index[0] is trajectory.facts else None
    if index is None:
        for pair in enumerate(trajectory.facts):
            if isinstance(pair[1].what, kinds):
                yield pair
        return
    chosen = [facts for what, facts in index[1].items() if issubclass(what, kinds)]
    if len(chosen) == 1:
        yield from chosen[0]
    elif chosen:
        yield from sorted(chain.from_iterable(chosen), key=_first)


def _first(pair: tuple[int, Fact]) -> int:
    return pair[0]


# While one trajectory is judged (:func:`indexed_facts`), its facts by payload type: every
# family reads its own kinds of facts, and one pass sorts them for all (a scan per family
# cost as much as the families' own work).
_fact_index: tuple[list[Fact], dict[type, list[tuple[int, Fact]]]] | None = None


@contextmanager
def indexed_facts(trajectory: Trajectory) -> Iterator[None]:
    """Index the trajectory's facts for :func:`facts_of` while the checks judge it."""
    global _fact_index
    by_type: dict[type, list[tuple[int, Fact]]] = {}
    for pair in enumerate(trajectory.facts):
        what = type(pair[1].what)
        found = by_type.get(what)
        if found is None:
            by_type[what] = [pair]
        else:
            found.append(pair)
    before, _fact_index = _fact_index, (trajectory.facts, by_type)
    try:
        yield
    finally:
        _fact_index = before
