"""The checks: floor, agree, lookahead and sanity (the contract: scenarios/README.md).

Each check is a function from a recorded :class:`Trajectory` to the
:class:`Failure` objects it finds, registered in :data:`CHECKS`. Checks never
call vLLM; they read what the driver recorded, so they can be selected,
re-run and tested on recorded trajectories alone.

* **floor** -- every party holds at least the reference floor of its group type.
* **agree** -- the predictor and the live allocator (and the recorded warmup,
  where there is one) hold the same number of blocks. Blocks are not returned
  when drafts are rejected, so the comparison is with the running maximum of
  the prediction since the request last (re)started.
* **lookahead** -- kvconform's table of methods agrees with
  ``VllmConfig.num_lookahead_tokens``; a method the table lacks is a failure,
  so a new method gets a deliberate row instead of a silent pass. While a
  request's KV loads asynchronously (scheduler mode, ``remote_prefill``) the
  lookahead is 0: it holds exactly the blocks of the tokens being loaded.
* **sanity** -- allocator invariants: no block in two live requests' tables
  (without prefix caching), nothing held after ``finish``/``preempt`` and every
  block back in the pool, the null block only where the group type allows it,
  and never in a column a windowed group's step still reads (its sliding window
  or local chunk); a call the scenario marks ``refused`` is refused, and a first
  chunk (in scheduler mode, a request's first admission) gets the prefix-cache
  hit the scenario states (``expect_hit``);
  in engine mode, every request finished with its ``max_tokens``.
* **slots** -- every position the target or the drafter writes lands, through
  vLLM's own slot-mapping kernel, in a block its request holds. The kernel
  runs in the slots party (:mod:`kvconform.oracles.slots`), which the engine
  runs after the driver only when this check is selected; the check reads what
  it recorded. Not in :data:`DEFAULT_CHECKS`: on a machine without CUDA the
  kernel runs under Triton's interpreter, which costs time (docs/benchmarks.md).

A check that cannot run raises :class:`CheckSkipped`; :func:`judge` reports it
as skipped with the reason, never as passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from kvconform.model.floors import FLOORS, READ_SPAN_REASONS, first_position_read, token_columns
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.lookahead import rule_for
from kvconform.model.observations import (
    BLOCK_ID_PARTIES,
    FreeEvent,
    Observation,
    Trajectory,
    party_block_ids,
)
from kvconform.model.results import Failure

PARTY_NAMES = {
    "live": "the live KVCacheManager",
    "predicted": "the warmup predictor _reserved_block_count",
    "warmup": "the recorded warmup",
}


class CheckSkipped(Exception):
    """Raised by a check that could not run; the reason is reported, never a pass."""


def _failure(
    check: str,
    run: Trajectory,
    obs: Observation,
    message: str,
    detail: dict | None = None,
    party: str | None = None,
) -> Failure:
    group = run.groups[obs.group]
    where = f"line {obs.line}, " if obs.line is not None else ""
    encoder_len = run.encoder_lens.get(obs.request, 0)
    # What the floor is made of, for the root-cause groups (harness.grouping): the same
    # step's floor without the lookahead, and whether max_model_len capped the writes.
    without_lookahead = group.step_floor()(obs.computed, obs.scheduled, 0, encoder_len)
    capped = 0 < run.max_model_len < obs.computed + obs.scheduled + obs.lookahead
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
        detail=detail,
    )


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def check_floor(run: Trajectory) -> Iterator[Failure]:
    for obs in run.observations:
        floor, live, predicted, warmup = obs.floor, obs.live, obs.predicted, obs.warmup
        # The common case, every party at or above the floor, without a loop.
        if (
            (live is None or live >= floor)
            and (predicted is None or predicted >= floor)
            and (warmup is None or warmup >= floor)
        ):
            continue
        for party in ("live", "predicted", "warmup"):
            held = getattr(obs, party)
            if held is None or held >= obs.floor:
                continue
            group = run.groups[obs.group]
            rule = FLOORS[group.type]
            floor_input = group.floor_input(
                obs.computed, obs.scheduled, obs.lookahead, run.encoder_lens.get(obs.request, 0)
            )
            consequence = ""
            if rule.blocks is token_columns:
                per_block = group.block_size * floor_input.dcp_world_size
                consequence = "; " + uncovered_positions(obs, held, per_block, run.max_model_len)
            yield _failure(
                "floor",
                run,
                obs,
                f"{PARTY_NAMES[party]} holds {_blocks(held)}, below the floor of "
                f"{obs.floor} = {rule.formula(floor_input)}{consequence} (why: {rule.reason})",
                party=party,
            )


def uncovered_positions(
    obs: Observation, held: int, columns_per_block: int, max_model_len: int
) -> str:
    """Which written positions have no block: the drafter's only, or the target's too."""
    covered = held * columns_per_block
    end = min(obs.computed + obs.scheduled + obs.lookahead, max_model_len) - 1
    if covered >= obs.computed + obs.scheduled:
        return f"the drafter's positions {covered}..{end} have no block"
    return f"positions {covered}..{end} have no block, the target's own among them"


def check_agree(run: Trajectory) -> Iterator[Failure]:
    for obs in run.observations:
        reference, live = obs.predicted_max, obs.live
        if obs.warmup is None and (live is None or live == reference):
            continue  # the common case: no recorded warmup, and live agrees or is absent
        if reference is None:
            # Without a predictor the recorded warmup and the live replay must agree.
            if obs.warmup is not None and obs.live is not None and obs.warmup != obs.live:
                yield _failure(
                    "agree",
                    run,
                    obs,
                    f"{PARTY_NAMES['warmup']} holds {_blocks(obs.warmup)} but "
                    f"{PARTY_NAMES['live']} holds {_blocks(obs.live)} for the same steps",
                    party="warmup",
                )
            continue
        for party in ("live", "warmup"):
            held = getattr(obs, party)
            if held is None or held == reference:
                continue
            rolled = (
                f" (running maximum; {obs.predicted} for this step alone)"
                if obs.predicted != reference
                else ""
            )
            yield _failure(
                "agree",
                run,
                obs,
                f"{PARTY_NAMES[party]} holds {_blocks(held)} but {PARTY_NAMES['predicted']} "
                f"predicts {reference}{rolled} for {obs.computed} + {obs.scheduled} tokens with "
                f"lookahead {run.lookahead}",
                {"predicted_max": reference},
                party=party,
            )


def _async_load_lookahead(run: Trajectory) -> Iterator[Failure]:
    """No lookahead slots while a request's KV loads asynchronously.

    vLLM's scheduler admits such a request with ``num_lookahead_tokens`` limited
    to 0 (``limit_lookahead_tokens``: no forward pass runs, so nothing drafts;
    the lookahead is allocated when the request is scheduled after the load),
    so that the blocks the connector fills match the remote's block for block.
    The request then holds the blocks of its loaded tokens, no more, no fewer.
    """
    for index in sorted(run.async_loads):
        obs = run.observations[index]
        if obs.live is None or obs.live == obs.floor:
            continue
        extra = obs.live - obs.floor
        yield _failure(
            "lookahead",
            run,
            obs,
            f"{PARTY_NAMES['live']} holds {_blocks(obs.live)} while the request's KV loads "
            f"asynchronously, but its {obs.computed} loaded tokens take exactly "
            f"{_blocks(obs.floor)}: "
            + (
                f"{_blocks(extra)} more, lookahead slots reserved during the load (vLLM limits "
                "the lookahead to 0 until the KV has arrived, so that the local blocks match "
                "the remote's)"
                if extra > 0
                else "fewer than the connector writes into"
            ),
            {"invariant": "async KV load holds exactly its tokens' blocks"},
            party="live",
        )


def check_lookahead(run: Trajectory) -> Iterator[Failure]:
    yield from _async_load_lookahead(run)
    if run.method is None:
        if run.vllm_lookahead:  # None: this release has no num_lookahead_tokens
            yield Failure(
                "lookahead",
                f"VllmConfig.num_lookahead_tokens is {run.vllm_lookahead} without speculative "
                "decoding, where nothing drafts and the lookahead is 0",
            )
        return
    k = run.num_speculative_tokens
    if run.expected_lookahead is None:
        yield Failure(
            "lookahead",
            f"method {run.method!r} is not in kvconform's lookahead table; vLLM reserves "
            f"{run.vllm_lookahead} slots for k={k}. Add a row to "
            "kvconform/model/lookahead.py saying what its drafter writes.",
        )
        return
    if run.vllm_lookahead is None or run.vllm_lookahead == run.expected_lookahead:
        return
    rule = rule_for(run.method)
    assert rule is not None
    yield Failure(
        "lookahead",
        f"VllmConfig.num_lookahead_tokens is {run.vllm_lookahead} for method {run.method!r} "
        f"with k={k}, but the drafter needs {rule.formula} = {run.expected_lookahead} "
        f"({rule.reason})",
    )


def _warmup_blocks_in_pool(run: Trajectory) -> Iterator[Failure]:
    """The recorded warmup hands out only blocks the pool has, and never the null block.

    The warmup numbers its blocks itself (from 1, block 0 being the null block);
    an id at or past ``num_blocks`` indexes past the KV-cache tensor on a GPU. Not
    when the warmup's writes are redirected to the null block (the elastic-EP
    re-warm): then no id it hands out is written.
    """
    if run.warmup_writes_redirected:
        return
    null, size = run.null_block, run.num_blocks
    reported: set[tuple[str, int]] = set()
    for obs in run.observations:
        ids = obs.warmup_block_ids
        if not ids or (obs.request, obs.group) in reported:
            continue
        outside = [b for b in ids if b >= size or b < 0]
        if outside or (null in ids and not run.groups[obs.group].holds_null):
            reported.add((obs.request, obs.group))
            what = (
                f"block {outside[0]}, which a pool of {size} blocks does not have"
                if outside
                else f"the null block (id {null})"
            )
            yield _failure("sanity", run, obs, f"{PARTY_NAMES['warmup']} hands out {what}")


def _read_span_blocks_real(run: Trajectory) -> Iterator[Failure]:
    """Windowed groups: the blocks a step's attention reads are real, not the null block.

    The first token a step computes (past its prefix-cache hit) attends back to
    ``first_position_read`` (a sliding window, or its own local chunk); every column
    from there through the last column the step writes must hold a real block. A null
    column there is KV the step reads that vLLM already freed (and may have handed to
    another request). The floor counts columns, so it cannot see this.
    Where vLLM bounds the read (SWA bounded replay, ``Trajectory.read_bounds``), the
    span starts no lower than that bound.
    """
    null, groups, bounds = run.null_block, run.groups, run.read_bounds
    for index, obs in enumerate(run.observations):
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
        if run.max_model_len:
            end = min(end, run.max_model_len)
        last_column = min(len(ids), -(-end // per_column)) - 1
        for column in range(first_read // per_column, last_column + 1):
            if ids[column] != null:
                continue
            yield _failure(
                "sanity",
                run,
                obs,
                f"block-table column {column} (positions {column * per_column}.."
                f"{(column + 1) * per_column - 1}) is the null block, but the token at "
                f"position {first_computed} attends to positions {first_read}.."
                f"{first_computed} ({READ_SPAN_REASONS[kind]}; {kind} {size}): the step "
                "reads KV that was freed",
                {"invariant": "frees a block the attention still reads", "column": column},
                party="live",
            )
            break


def _refusals_refused(run: Trajectory) -> Iterator[Failure]:
    """A call the scenario marks ``refused`` got no blocks from ``allocate_slots``.

    The scenario derives by hand that the pool cannot hold what the call needs; an
    allocator that grants it counted the step's demand short (and hands out blocks
    the pool does not have, or overcommits the pool another request relies on).
    """
    for refusal in run.refusals:
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
            party="live",
            detail={"invariant": "grants a call the pool cannot hold"},
        )


def _warmup_blocks_distinct(run: Trajectory) -> Iterator[Failure]:
    """No block the recorded warmup hands out is in two tables at once.

    The warmup numbers its blocks itself ("Assign distinct block IDs per request per
    group"); a block in two requests' tables, or in two groups of one request, is KV
    that two writers overwrite. A request's blocks are free again once it finishes:
    the finish events are the live replay's, so only rows the live replay mirrors
    (warmup scenarios; not engine mode's GPU warmup rows) are judged. Not when the
    warmup's writes are redirected to the null block.
    """
    if run.warmup_writes_redirected:
        return
    owner: dict[int, tuple[str, int]] = {}
    held: dict[str, set[int]] = {}
    reported: set[tuple[str, int]] = set()
    events = iter(run.events)
    pending = next(events, None)
    for seq, obs in enumerate(run.observations):
        while pending is not None and pending.seq <= seq:
            for block in held.pop(pending.request, ()):
                owner.pop(block, None)
            pending = next(events, None)
        ids = obs.warmup_block_ids
        if not ids or obs.live is None:
            continue
        here = (obs.request, obs.group)
        for block in ids:
            other = owner.setdefault(block, here)
            if other != here and here not in reported:
                reported.add(here)
                whose = f"request {other[0]}" if other[0] != obs.request else "this request"
                yield _failure(
                    "sanity",
                    run,
                    obs,
                    f"{PARTY_NAMES['warmup']} hands out block {block}, which {whose} holds "
                    f"in group {other[1]}",
                    {"invariant": "hands one block to two tables"},
                    party="warmup",
                )
        held.setdefault(obs.request, set()).update(ids)


def _warmup_passes(run: Trajectory) -> Iterator[Failure]:
    """warmup_kernels makes the passes the scenario derives from the runner's limits.

    Each pass prefills one batch, as many requests as max_num_seqs, the token
    budget and the pool allow (the null block kept out), and samples randomly or
    greedily; a pass missing, or a batch smaller or larger than the limits give,
    leaves batch shapes unwarmed or hands out blocks the pool does not have.
    """
    expected = run.expected_warmup_passes
    if expected is None or tuple(run.warmup_passes) == expected:
        return
    made = "; ".join(str(p) for p in run.warmup_passes) or "none"
    wanted = "; ".join(str(p) for p in expected)
    yield Failure(
        "sanity",
        f"warmup_kernels made {_passes(len(run.warmup_passes))} ({made}), but "
        f"{run.expected_warmup_passes_at} derives {_passes(len(expected))} ({wanted})",
        party="warmup",
        detail={"invariant": "warms other batches than its limits give"},
    )


def _stated_hits(run: Trajectory) -> Iterator[Failure]:
    """A first chunk gets the prefix-cache hit the scenario states (``expect_hit``).

    The scenario derives the hit by hand (the full blocks a request shares with
    blocks another request computed and allocate_slots cached), so a different hit
    is the allocator caching too little, or caching tokens nobody computed yet.
    """
    for miss in run.misses:
        where = f"line {miss.line}, " if miss.line is not None else ""
        yield Failure(
            "sanity",
            f"step {miss.step} ({where}{miss.label}) request {miss.request}: {miss.message}",
            step=miss.step,
            line=miss.line,
            request=miss.request,
            action=miss.label,
            party="live",
            detail={"invariant": "gets a prefix-cache hit other than the one derived"},
        )


def _mamba_align_groups(run: Trajectory) -> dict[int, tuple[int, int]]:
    """group index -> (num_speculative_blocks, num_prefill_checkpoint_blocks) of its
    Mamba "align" groups."""
    return {
        g.index: (
            int(g.floor_args.get("num_speculative_blocks", 0)),
            int(g.floor_args.get("num_prefill_checkpoint_blocks", 0)),
        )
        for g in run.groups
        if g.type == "mamba" and g.floor_args.get("mamba_cache_mode") == "align"
    }


def _mamba_align_rewritten_column(
    before: list[int] | None, ids: list[int], null: int
) -> tuple[str, str] | None:
    """A running request's table changed other than by appending or nulling a column.

    The worker keeps its own copy of a running request's block table and only appends
    the block ids each step hands it (vLLM's MambaManager: "The worker block table of a
    running request is append-only"). So between two allocations of a live request a
    column may keep its block or become the null block (a state the worker no longer
    reads), and the table may grow; a column that turns into another real block, or a
    table that shrinks, is one the worker would still read from the old block.
    """
    if before is None:
        return None
    if len(ids) < len(before):
        return (
            "rewritten table",
            f"its table shrank from {len(before)} to {len(ids)} columns while it ran "
            f"(before {before}, now {ids}); the worker's copy only grows",
        )
    # ids is at least as long as before here; its appended columns are new.
    for column, (old, new) in enumerate(zip(before, ids, strict=False)):
        if new != old and new != null:
            return (
                "rewritten table",
                f"column {column} changed from block {old} to block {new} while it ran "
                f"(before {before}, now {ids}); the worker's copy only appends, so it "
                "would still use the old block there",
            )
    return None


def _mamba_align_state_blocks(run: Trajectory) -> Iterator[Failure]:
    """Where a Mamba "align" request's state lives, after every allocation.

    vLLM's ``MambaManager`` (align) keeps the running state in the last
    ``1 + num_speculative_blocks`` columns of the request's table ("We always save
    the running state at the last (1 + num_speculative_blocks) block"): the kernel
    writes the step's final state and each draft's state there, so each must be a
    real block (not the null block) that no other live request holds, prefix caching
    or not (a cache hit shares a block a request reads from, never one it writes).
    Every older state is nulled once the next one exists, so a request holds at most
    ``2 + num_speculative_blocks + num_prefill_checkpoint_blocks`` real blocks plus
    one private copy-on-write tail (the previous state, the running and speculative
    ones, the checkpoint column): what ``MambaSpec.max_memory_usage_bytes`` sizes
    the pool for in align mode. Between two allocations a live request's table only
    grows or nulls columns (``_mamba_align_rewritten_column``). Only the live party's
    tables are read.
    """
    align = _mamba_align_groups(run)
    if not align:
        return
    null = run.null_block
    tables: dict[str, dict[int, list[int]]] = {}
    reported: set[tuple[str, int, str]] = set()
    events = list(run.events)
    next_event = 0
    for seq, obs in enumerate(run.observations):
        while next_event < len(events) and events[next_event].seq <= seq:
            tables.pop(events[next_event].request, None)
            next_event += 1
        ids = list(obs.block_ids or ())
        before = tables.get(obs.request, {}).get(obs.group)
        tables.setdefault(obs.request, {})[obs.group] = ids
        shape = align.get(obs.group)
        if shape is None or obs.block_ids is None:
            continue
        speculative, checkpoint = shape
        state_columns = 1 + speculative
        tail = ids[-state_columns:] if len(ids) >= state_columns else ids
        problem = _mamba_align_rewritten_column(before, ids, null)
        if problem is None and (len(ids) < state_columns or null in tail):
            column = len(ids) - state_columns + (tail.index(null) if null in tail else 0)
            problem = (
                "null state",
                f"column {column} of the last {state_columns} (the running state and "
                f"{speculative} speculative state blocks the kernel writes) is the null block "
                f"(table {ids})",
            )
        elif problem is None:
            for other, other_tables in tables.items():
                if other == obs.request:
                    continue
                shared = sorted({b for t in other_tables.values() for b in t} & set(tail))
                if shared:
                    problem = (
                        "shared state",
                        f"the state block {shared[0]} it writes is also in the table of "
                        f"live request {other}",
                    )
                    break
        if problem is None:
            real = len({b for b in ids if b != null})
            bound = 2 + speculative + checkpoint + 1
            if real > bound:
                problem = (
                    "state blocks held",
                    f"holds {real} real blocks, more than the {bound} a Mamba align request "
                    f"ever needs (2 states + {speculative} speculative + {checkpoint} checkpoint "
                    "+ 1 copy-on-write tail): an older state was not nulled",
                )
        if problem is None:
            continue
        key = (obs.request, obs.group, problem[0])
        if key in reported:
            continue
        reported.add(key)
        yield _failure(
            "sanity", run, obs, problem[1], {"invariant": f"mamba align {problem[0]}"}, "live"
        )


def check_sanity(run: Trajectory) -> Iterator[Failure]:
    yield from _warmup_blocks_in_pool(run)
    yield from _read_span_blocks_real(run)
    yield from _refusals_refused(run)
    yield from _warmup_blocks_distinct(run)
    yield from _warmup_passes(run)
    yield from _stated_hits(run)
    yield from _mamba_align_state_blocks(run)
    null = run.null_block
    owner: dict[int, str] = {}
    # Per request and group, the block table last seen. A step usually appends
    # to it, so only the appended columns are new: the check stays linear in a
    # trajectory's length instead of rescanning every table at every step.
    last: dict[str, dict[int, list[int]]] = {}
    # Tables whose last state held the null block where their group must not.
    null_seen: set[tuple[str, int]] = set()
    events = iter(run.events)
    pending: FreeEvent | None = next(events, None)

    def release(request: str) -> None:
        for ids in last.pop(request, {}).values():
            for block in ids:
                if owner.get(block) == request:
                    del owner[block]

    groups, exclusive = run.groups, run.exclusive_blocks
    next_event = pending.seq if pending is not None else -1
    for seq, obs in enumerate(run.observations):
        if seq == next_event:
            while pending is not None and pending.seq <= seq:
                yield from _free_event(run, pending, null)
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
                yield _failure(
                    "sanity",
                    run,
                    obs,
                    f"the block table holds the null block (id {null}), which a {group.type} "
                    "group must never point at",
                    {"invariant": "holds the null block"},
                    party="live",
                )
            else:
                null_seen.discard(key)
        elif null_seen and not group.holds_null:
            null_seen.discard((request, group_index))
        if not exclusive:
            continue
        if prev is not None and not appended:
            for block in prev:
                if owner.get(block) == request:
                    del owner[block]
        for block in new:
            if block == null:
                continue
            other = owner.get(block)
            if other is not None and other != request:
                yield _failure(
                    "sanity",
                    run,
                    obs,
                    f"block {block} is also in the table of live request {other}, without "
                    "prefix caching to share it",
                    {"invariant": "shares a block between live requests"},
                    party="live",
                )
            owner[block] = request
    while pending is not None:
        yield from _free_event(run, pending, null)
        pending = next(events, None)
    for message in run.unfinished:
        yield Failure(
            "sanity", message, party="live", detail={"invariant": "leaves requests unfinished"}
        )
    if run.all_finished and run.final_free_blocks is not None:
        usable = run.num_blocks - 1
        if run.final_free_blocks != usable:
            yield Failure(
                "sanity",
                f"after every request finished the pool has {run.final_free_blocks} free blocks, "
                f"not all {usable} (num_blocks minus the null block): blocks leaked",
                party="live",
                detail={"invariant": "leaks blocks"},
            )


def _free_event(run: Trajectory, event: FreeEvent, null: int) -> Iterator[Failure]:
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
            party="live",
            detail={"invariant": f"still holds blocks after {event.kind}"},
        )
    if run.exclusive_blocks:
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
                party="live",
                detail={"invariant": f"returns fewer blocks than it held at {event.kind}"},
            )


def check_slots(run: Trajectory) -> Iterator[Failure]:
    recording = run.slots
    if recording is None:
        raise CheckSkipped("the slots party did not run for this scenario")
    if recording.skipped is not None:
        raise CheckSkipped(recording.skipped)
    owners = _owners(run)
    # One failure per run of consecutive positions of one row that land alike.
    for _, run_of in groupby(
        recording.escapes,
        key=lambda e: (e.observation, e.party, e.role, e.block, e.fresh_block),
    ):
        escapes = list(run_of)
        first = escapes[0]
        obs = run.observations[first.observation]
        held = _party_ids(obs, first.party)
        whose = _whose(first.block, run, obs, first.party, held, owners)
        positions = _span([e.position for e in escapes])
        columns = _span(sorted({e.column for e in escapes}))
        many = len(escapes) > 1
        column_word = "columns" if "," in columns or ".." in columns else "column"
        message = (
            f"{first.role} position{'s' if many else ''} {positions} ({column_word} {columns}) "
            f"{'fall' if many else 'falls'} outside the {_blocks(len(held))} "
            f"{PARTY_NAMES[first.party]} holds: vLLM's slot-mapping kernel read {whose}"
        )
        fresh = None
        if first.fresh_block is not None and first.fresh_block != first.block:
            fresh = _whose(first.fresh_block, run, obs, first.party, held, owners)
            message += (
                f"; through the row as vLLM's BlockTables leaves it (zero past the held "
                f"columns) {'they go' if many else 'it goes'} to {fresh}"
            )
        detail = {
            "party": first.party,
            "role": first.role,
            "positions": [e.position for e in escapes],
            "columns": sorted({e.column for e in escapes}),
            "slots": [e.slot for e in escapes],
            "block": first.block,
            "whose": whose,
            "vllm_block": first.fresh_block,
            "vllm_whose": fresh or whose,
            "held": len(held),
        }
        yield _failure("slots", run, obs, message, detail, party=first.party)


def _party_ids(obs: Observation, party: str) -> list[int]:
    return list(party_block_ids(obs, party) or ())


def _owners(run: Trajectory) -> dict[tuple[int, str, int], dict[int, str]]:
    """(step, party, group) -> {block: request} for every block a request held then."""
    owners: dict[tuple[int, str, int], dict[int, str]] = {}
    for obs in run.observations:
        for party in BLOCK_ID_PARTIES:
            table = owners.setdefault((obs.step, party, obs.group), {})
            for block in _party_ids(obs, party):
                table.setdefault(block, obs.request)
    return owners


def _whose(
    block: int,
    run: Trajectory,
    obs: Observation,
    party: str,
    held: list[int],
    owners: dict[tuple[int, str, int], dict[int, str]],
) -> str:
    recording = run.slots
    assert recording is not None
    if block == recording.poison:
        return "kvconform's poison past the held columns (no block)"
    if block == recording.guard:
        return "the guard past the end of the row (no block)"
    if block == run.null_block:
        return f"block {block}, the null block"
    other = owners.get((obs.step, party, obs.group), {}).get(block)
    if other is not None and other != obs.request:
        return f"block {block} of request {other}"
    return f"block {block}, which no request of {PARTY_NAMES[party]} holds at this step"


def _span(values: list[int]) -> str:
    """``32..35`` for a consecutive run, else the values listed."""
    if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return ", ".join(str(v) for v in values)


# In reporting order: a wrong lookahead is the cause of the floor failures it brings,
# so it is reported first.
CHECKS: dict[str, Callable[[Trajectory], Iterator[Failure]]] = {
    "lookahead": check_lookahead,
    "floor": check_floor,
    "agree": check_agree,
    "sanity": check_sanity,
    "slots": check_slots,
}
# What a plain run checks. `slots` runs vLLM's kernel (under Triton's interpreter
# on a machine without CUDA) and is chosen with --checks (all, or default,slots).
DEFAULT_CHECKS = ("lookahead", "floor", "agree", "sanity")


def parse_checks(text: str | None) -> tuple[str, ...]:
    """A ``--checks`` value: names, ``default`` (the default checks) and ``all``.

    Raises ``ValueError`` naming the first unknown check.
    """
    if not text:
        return DEFAULT_CHECKS
    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        expanded = {"all": tuple(CHECKS), "default": DEFAULT_CHECKS}.get(item, (item,))
        for name in expanded:
            if name not in CHECKS:
                raise ValueError(
                    f"unknown check {name!r}; known: {', '.join(CHECKS)}, all, default"
                )
            if name not in names:
                names.append(name)
    return tuple(name for name in CHECKS if name in names)  # always in reporting order


@dataclass
class Judgement:
    failures: list[Failure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not run


def judge(run: Trajectory, names: tuple[str, ...] = DEFAULT_CHECKS) -> Judgement:
    """Run the named checks; a check that raises :class:`CheckSkipped` is skipped, not passed."""
    judgement = Judgement()
    for name in names:
        try:
            found = list(CHECKS[name](run))
        except CheckSkipped as exc:
            judgement.skipped[name] = str(exc)
            continue
        judgement.failures.extend(found)
    return judgement


def run_checks(run: Trajectory, names: tuple[str, ...] = DEFAULT_CHECKS) -> list[Failure]:
    return judge(run, names).failures
