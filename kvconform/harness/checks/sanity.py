"""``sanity``: allocator invariants that hold whatever the floor.

* no block in two live requests' tables (without prefix caching), nothing held
  after ``finish`` / ``preempt``, every block back in the pool at the end;
* no block in two KV-cache groups' tables at once (prefix caching or not);
* the null block only where the group type allows it, and never in a column a
  windowed group's step still reads (its sliding window or local chunk);
* a call the scenario marks ``refused`` is refused, and a first chunk (in
  scheduler mode, a request's first admission) gets the prefix-cache hit the
  scenario states (``expect_hit``);
* where vLLM zeroes new blocks (Mamba layers, mixed precision), every block new in a
  recording group's table is on the worker's zeroing list and no block of valid KV
  (a prefix hit's, one an asynchronous load writes) is;
* where a Mamba "align" group is prefix-cached, every boundary state a step caches is
  handed to a KV connector by block id, and no block that no longer holds it is;
* with KV-cache events on, each step's events leave a router knowing exactly what the
  prefix cache holds;
* a single-type manager declares the defaults its coordinator declares for the
  arguments it forwards;
* the recorded warmup hands out only blocks of the pool (and, where its KV cache grows on
  demand, only committed ones), each to one table, in
  the passes its limits give;
* a Mamba "align" request's state blocks are real, its own, and its table only
  grows or nulls columns; a prefill chunk vLLM's scheduler starts inside a block
  stops at its boundary or leaves that block's column null;
* in engine mode, every request finished with its ``max_tokens``;
* in scheduler mode, no first admission's prefix-cache hit is shorter than the least hit
  the earlier requests its prompt begins with guarantee while their blocks are still
  cached (:mod:`kvconform.model.prefix_hits`);
* in scheduler mode, no block a KV connector's asynchronous load still writes into
  is in another request's table before the load reports done (an abort while the
  KV loads keeps the blocks until then).

The invariants that need more than the recorded tables are judged by one module per
family, over the facts the oracles record (:mod:`kvconform.model.facts`): ``allocator``
(stated hits and resets, retained hits, evictions, prefix-cache stats, declared
defaults), ``conservation`` (free + held = the pool, reference counts, no writable block
shared, after every step), ``bookkeeping`` (vLLM's per-request state of ended requests
dropped), ``zeroing``, ``handoffs``, ``kv_events``, ``encoder`` (scheduler mode's
multimodal inputs), ``lifecycle`` (in-flight finishes, stops, rejections,
``SchedulerStats``, streaming sessions, pauses and aborts), ``liveness`` (progress, no
preemption cycle, a bound on a finite workload) and ``fairness`` (the policy's order:
no passing, no running request skipped) and ``hits`` (no lookup below the least hit the
blocks cached before it guarantee); ``warmup`` and ``mamba``
read the recorded tables. This module runs them in a fixed order, the facts' failures
in the order the run met them.

Each failure names its invariant (``detail["invariant"]``): the root causes
gather by it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvconform.harness.checks import (
    allocator,
    bookkeeping,
    conservation,
    encoder,
    fairness,
    handoffs,
    hits,
    kv_events,
    lifecycle,
    liveness,
    mamba,
    warmup,
    zeroing,
)
from kvconform.harness.checks.records import failure_at, named
from kvconform.model.checks import Check, always
from kvconform.model.floors import READ_SPAN_REASONS, first_position_read
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import HIT_MISSED, FreeEvent, Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame

# The invariant of a call the scenario marks refused and vLLM granted.
GRANTED = "grants a call the pool cannot hold"


def _read_span_blocks_real(trajectory: Trajectory) -> Iterator[Failure]:
    """Windowed groups: the blocks a step's attention reads are real, not the null block.

    The first token a step computes (past its prefix-cache hit) attends back to
    ``first_position_read`` (a sliding window, or its own local chunk); every column
    from there through the last column the step writes must hold a real block. A null
    column there is KV the step reads that vLLM already freed (and may have handed to
    another request). The floor counts columns, so it cannot see this.
    Where vLLM bounds the read (SWA bounded replay, ``Trajectory.read_bounds``), the
    span starts no lower than that bound.
    """
    null, groups, bounds = trajectory.null_block, trajectory.groups, trajectory.read_bounds
    for index, obs in enumerate(trajectory.observations):
        span = groups[obs.group].read_span
        ids = obs.block_ids
        if span is None or not ids or obs.scheduled <= 0:
            continue
        kind, size = span
        per_column = groups[obs.group].block_size * int(
            groups[obs.group].floor_args.get("dcp_world_size", 1)
        )
        first_computed = obs.computed + obs.cached
        first_read = first_position_read(kind, size, first_computed)
        if bounds:
            first_read = min(max(first_read, bounds.get(index, 0)), first_computed)
        end = obs.computed + obs.scheduled + obs.lookahead
        if trajectory.max_model_len:
            end = min(end, trajectory.max_model_len)
        last_column = min(len(ids), -(-end // per_column)) - 1
        for column in range(first_read // per_column, last_column + 1):
            if ids[column] != null:
                continue
            yield failure_at(
                "sanity",
                trajectory,
                obs,
                f"block-table column {column} (positions {column * per_column}.."
                f"{(column + 1) * per_column - 1}) is the null block, but the token at "
                f"position {first_computed} attends to positions {first_read}.."
                f"{first_computed} ({READ_SPAN_REASONS[kind]}; {kind} {size}): the step "
                "reads KV that was freed",
                {"invariant": "frees a block the attention still reads", "column": column},
                party=Party.LIVE,
            )
            break


def _refusals_refused(trajectory: Trajectory) -> Iterator[Failure]:
    """A call the scenario marks ``refused`` got no blocks from ``allocate_slots``.

    The scenario derives by hand that the pool cannot hold what the call needs; an
    allocator that grants it counted the step's demand short (and hands out blocks
    the pool does not have, or overcommits the pool another request relies on).
    """
    for refusal in trajectory.refusals:
        if not refusal.granted:
            continue
        where = f"line {refusal.line}, " if refusal.line is not None else ""
        yield Failure(
            "sanity",
            f"step {refusal.step} ({where}{refusal.label}) request {refusal.request}: "
            f"allocate_slots granted a call the scenario says the pool cannot hold "
            f"({refusal.free_blocks} free blocks before it); the driver stopped there",
            step=refusal.step,
            line=refusal.line,
            request=refusal.request,
            action=refusal.label,
            party=Party.LIVE,
            detail={"invariant": GRANTED},
        )


# The families that judge the facts the live oracle records (kvconform.model.facts).
FACT_FAMILIES = (
    allocator,
    conservation,
    bookkeeping,
    zeroing,
    handoffs,
    kv_events,
    encoder,
    lifecycle,
    liveness,
    fairness,
    hits,
)


def _recorded_facts(trajectory: Trajectory) -> Iterator[Failure]:
    """What each family finds in the recorded facts (what vLLM answered, zeroed, handed
    over, announced, freed, against the scenario's statements: a first chunk's stated
    hit, ``expect_hit``, among them), in the order the facts were recorded."""
    if not trajectory.facts:
        return
    found = [pair for family in FACT_FAMILIES for pair in family.judge(trajectory)]
    found.sort(key=lambda pair: pair[0])
    for _, failure in found:
        yield failure


def _loads_keep_their_blocks(trajectory: Trajectory) -> Iterator[Failure]:
    """A block a KV load writes into is in no other request's table until the load is done.

    The connector's worker writes the remote KV into the blocks the scheduler gave the
    loading request, from the step that began the load through the step whose output
    reports it received (``finished_recving``). vLLM keeps those blocks with the
    request all that time, also when the client aborts it meanwhile
    (``Scheduler.finish_requests`` delays the free; ``_update_from_kv_xfer_finished``
    frees them when the load reports done). A block of a pending load in another
    request's table is KV two writers fill: the other request's, corrupted.
    """
    for load in trajectory.kv_loads:
        loading = [set(ids) for ids in load.blocks]
        reported: set[str] = set()
        for obs in trajectory.observations:
            if (
                obs.request == load.request
                or obs.request in reported
                or obs.step < load.started
                or (load.done is not None and obs.step > load.done)
                or not obs.block_ids
            ):
                continue
            taken = sorted(loading[obs.group].intersection(obs.block_ids))
            if not taken:
                continue
            reported.add(obs.request)
            freed = next(
                (
                    e
                    for e in trajectory.events
                    if e.request == load.request and e.step >= load.started
                ),
                None,
            )
            until = (
                f"reports it received at step {load.done}"
                if load.done is not None
                else "has not reported it received by the end of the run"
            )
            cause = ""
            if load.aborted is not None and freed is not None and freed.step < load.aborted:
                cause = (
                    f"; vLLM returned {load.request}'s blocks to the pool when the client "
                    f"aborted it, before step {load.aborted}"
                )
            elif freed is not None and (load.done is None or freed.step < load.done):
                cause = (
                    f"; vLLM returned {load.request}'s blocks at step {freed.step} ({freed.kind})"
                )
            yield failure_at(
                "sanity",
                trajectory,
                obs,
                f"holds block{'s' if len(taken) > 1 else ''} {', '.join(map(str, taken))}, which "
                f"request {load.request}'s asynchronous KV load (begun at step {load.started}) "
                f"still writes into: the connector {until}{cause}",
                {
                    "invariant": "hands out a block a KV load still writes into",
                    "load": load.request,
                    "blocks": taken,
                },
                party=Party.LIVE,
            )


def _blocks_in_one_group(trajectory: Trajectory) -> Iterator[Failure]:
    """No physical block sits in two KV-cache groups' tables at once.

    vLLM's groups of a hybrid model share one ``BlockPool``, but a block holds one
    group's KV (one page layout; a cached block's hash carries its group id,
    ``BlockHashWithGroupId``), so what vLLM shares is a block between requests of the
    *same* group, through the prefix cache, never between groups. A block in the
    tables of two groups at once, of one request or of two live ones, prefix caching
    or not, is KV two layers' kernels overwrite (and, freed twice, a ref-count drift).

    One allocation frees and allocates in every group of the request (a sliding
    window's block may go to full attention in the same call), and one step's
    allocations may hand a block one request freed to another (a running request's
    window frees it, a waiting one admitted after it takes it), so the rows of one step
    are applied together before they are judged: the tables "at once" are those after
    the step. Only the live party's tables are read; a request's tables go at its
    ``finish`` / ``preempt``.
    """
    if len(trajectory.groups) < 2:
        return
    null = trajectory.null_block
    # A group with a pool of its own (HiSparse's host source) numbers its blocks itself.
    own_pool = {g.index for g in trajectory.groups if GROUP_TYPES[g.type].own_pool}
    # (request, group) -> the table last seen; block -> {group: tables holding it}
    tables: dict[tuple[str, int], list[int]] = {}
    holders: dict[int, dict[int, int]] = {}
    reported: set[int] = set()

    def drop(key: tuple[str, int]) -> None:
        for block in tables.pop(key, ()):
            if block == null:
                continue
            groups = holders[block]
            groups[key[1]] -= 1
            if not groups[key[1]]:
                del groups[key[1]]
                if not groups:
                    del holders[block]

    observations = trajectory.observations
    events = trajectory.events
    next_event = 0
    index = 0
    while index < len(observations):
        while next_event < len(events) and events[next_event].seq <= index:
            gone = events[next_event].request
            for key in [k for k in tables if k[0] == gone]:
                drop(key)
            next_event += 1
        first = observations[index]
        call = [first]
        index += 1
        # The rows of one step, every request's: within one schedule() vLLM allocates for
        # the running requests before it admits waiting ones, so a block a running
        # request's window frees may go to a new request in the same step, while the
        # scheduler oracle records the new requests' rows first.
        while (
            index < len(observations)
            and observations[index].step == first.step
            and not (next_event < len(events) and events[next_event].seq <= index)
        ):
            call.append(observations[index])
            index += 1
        changed = []
        for obs in call:
            if obs.block_ids is None or obs.group in own_pool:
                continue
            key = (obs.request, obs.group)
            ids = list(obs.block_ids)
            if tables.get(key) == ids:
                continue
            drop(key)
            tables[key] = ids
            for block in ids:
                if block != null:
                    groups = holders.setdefault(block, {})
                    groups[obs.group] = groups.get(obs.group, 0) + 1
            changed.append(obs)
        for obs in changed:
            for block in tables[(obs.request, obs.group)]:
                if block == null or block in reported or len(holders.get(block, ())) < 2:
                    continue
                reported.add(block)
                others = sorted(
                    f"request {r}'s group {g}"
                    for (r, g), ids in tables.items()
                    if g != obs.group and block in ids
                )
                yield failure_at(
                    "sanity",
                    trajectory,
                    obs,
                    f"block {block} is in this group's table and in {', '.join(others)} at "
                    "once: one physical block holds one group's KV (the groups share the pool, "
                    "never a block), so two groups' layers write into it",
                    {"invariant": "puts one block in two groups' tables", "block": block},
                    party=Party.LIVE,
                )


def find(trajectory: Trajectory) -> Iterator[Failure]:
    yield from warmup.blocks_in_pool(trajectory)
    yield from _loads_keep_their_blocks(trajectory)
    yield from _blocks_in_one_group(trajectory)
    yield from _read_span_blocks_real(trajectory)
    yield from _refusals_refused(trajectory)
    yield from warmup.blocks_distinct(trajectory)
    yield from warmup.passes_made(trajectory)
    yield from _recorded_facts(trajectory)
    yield from mamba.state_blocks(trajectory)
    yield from mamba.chunk_columns(trajectory)
    null = trajectory.null_block
    owner: dict[int, str] = {}
    # Per request and group, the block table last seen. A step usually appends
    # to it, so only the appended columns are new: the check stays linear in a
    # trajectory's length instead of rescanning every table at every step.
    last: dict[str, dict[int, list[int]]] = {}
    # Tables whose last state held the null block where their group must not.
    null_seen: set[tuple[str, int]] = set()
    events = iter(trajectory.events)
    pending: FreeEvent | None = next(events, None)

    def release(request: str) -> None:
        for ids in last.pop(request, {}).values():
            for block in ids:
                if owner.get(block) == request:
                    del owner[block]

    groups, exclusive = trajectory.groups, trajectory.exclusive_blocks
    own_pool = {g.index for g in groups if GROUP_TYPES[g.type].own_pool}
    # The new blocks of the current step's rows, judged once all its rows are applied:
    # within one schedule() vLLM allocates for the running requests (whose windows free
    # blocks) before it admits waiting ones, which may take those blocks, while the
    # scheduler oracle records the admissions' rows first.
    claims: list[tuple[Observation, int]] = []
    claims_step: int | None = None

    def settle() -> Iterator[Failure]:
        for claim, block in claims:
            other = owner.get(block)
            if other is not None and other != claim.request:
                yield failure_at(
                    "sanity",
                    trajectory,
                    claim,
                    f"block {block} is also in the table of live request {other}, without "
                    "prefix caching to share it",
                    {"invariant": "shares a block between live requests"},
                    party=Party.LIVE,
                )
            owner[block] = claim.request
        claims.clear()

    next_event = pending.seq if pending is not None else -1
    for seq, obs in enumerate(trajectory.observations):
        if claims and (seq == next_event or obs.step != claims_step):
            yield from settle()
        if seq == next_event:
            while pending is not None and pending.seq <= seq:
                yield from _free_event(trajectory, pending, null)
                release(pending.request)
                pending = next(events, None)
            next_event = pending.seq if pending is not None else -1
        raw = obs.block_ids
        ids = raw if isinstance(raw, list) else list(raw or ())
        request, group_index = obs.request, obs.group
        tables = last.get(request)
        if tables is None:
            tables = last[request] = {}
        prev = tables.get(group_index)
        tables[group_index] = ids
        new: Sequence[int]
        if prev is None:
            new, appended = ids, False
        elif len(ids) == len(prev):  # most steps add no block: no slices to build
            appended = ids == prev
            new = () if appended else ids
        else:
            appended = ids[: len(prev)] == prev
            new = ids[len(prev) :] if appended else ids
        group = groups[group_index]
        if not group.holds_null and (null in new or (null_seen and appended)):
            key = (request, group_index)
            if null in new or key in null_seen:
                null_seen.add(key)
                yield failure_at(
                    "sanity",
                    trajectory,
                    obs,
                    f"the block table holds the null block (id {null}), which a {group.type} "
                    "group must never point at",
                    {"invariant": "holds the null block"},
                    party=Party.LIVE,
                )
            else:
                null_seen.discard(key)
        elif null_seen and not group.holds_null:
            null_seen.discard((request, group_index))
        if not exclusive or group_index in own_pool:
            continue
        if prev is not None and not appended:
            for block in prev:
                if owner.get(block) == request:
                    del owner[block]
        claims.extend((obs, block) for block in new if block != null)
        claims_step = obs.step
    yield from settle()
    while pending is not None:
        yield from _free_event(trajectory, pending, null)
        pending = next(events, None)
    if trajectory.all_finished and trajectory.final_free_blocks is not None:
        usable = trajectory.num_blocks - 1
        if trajectory.final_free_blocks != usable:
            yield Failure(
                "sanity",
                f"after every request finished the pool has {trajectory.final_free_blocks} free blocks, "
                f"not all {usable} (num_blocks minus the null block): blocks leaked",
                party=Party.LIVE,
                detail={"invariant": "leaks blocks"},
            )


def _free_event(trajectory: Trajectory, event: FreeEvent, null: int) -> Iterator[Failure]:
    where = f"step {event.step} ({event.kind}) request {event.request}"
    still = [g for g, ids in enumerate(event.held_after) if ids]
    if still:
        yield Failure(
            "sanity",
            f"{where}: still holds blocks in groups {still} after {event.kind}",
            step=event.step,
            line=event.line,
            request=event.request,
            action=event.kind,
            party=Party.LIVE,
            detail={"invariant": f"still holds blocks after {event.kind}"},
        )
    if trajectory.exclusive_blocks:
        held = {b for ids in event.held for b in ids if b != null}
        returned = event.free_after - event.free_before
        if returned != len(held):
            yield Failure(
                "sanity",
                f"{where}: held {len(held)} distinct blocks but {returned} went back to the pool",
                step=event.step,
                line=event.line,
                request=event.request,
                action=event.kind,
                party=Party.LIVE,
                detail={"invariant": f"returns fewer blocks than it held at {event.kind}"},
            )


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    invariant = str((failure.detail or {}).get("invariant", "breaks an allocator invariant"))
    live = named(result, Party.LIVE)
    # A call granted that the floor says the pool cannot hold: the step's demand was
    # counted short (its own, or another request's that left the pool more free blocks
    # than derived). A prefix-cache hit other than derived: blocks a short request never
    # held were never cached. Each follows the live side's shortfall where there is one.
    follows = live if invariant in (GRANTED, HIT_MISSED) else None
    return Blame(live, invariant, follows=follows)


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(spec class, invariant): each spec class has its own manager; "-" for a failure of
    no group (a leak over the whole pool). The invariant the failure names
    (``detail["invariant"]``) splits one manager's findings by the rule broken, so that a
    triaged bug of one rule (``scenarios/explore-known.yaml``) does not hide another's;
    a failure that names none keeps the coarser (spec class). A failure whose recording
    names its cause (``detail["cause"]``: the hits family's
    :data:`~kvconform.model.prefix_hits.ONE_TOKEN_WINDOW`) splits by it too."""
    detail = failure.detail or {}
    invariant = str(detail.get("invariant") or "")
    cause = detail.get("cause")
    return failure.spec_type or "-", f"{invariant}: {cause}" if invariant and cause else invariant


CHECK = Check(
    "sanity",
    "allocator invariants: no block shared without prefix caching, none in two groups, all "
    "returned, the null block only where allowed, stated refusals and hits, warmup and Mamba "
    "align tables, no block a KV connector's load still writes into in another request's "
    "table",
    find,
    blame,
    signature,
    always(
        "allocator invariants that hold whatever the floor: no block in two live "
        "requests' tables without prefix caching nor in two groups' tables, everything back "
        "in the pool after finish "
        "or preempt, the null block only where the group type keeps placeholders"
    ),
)
