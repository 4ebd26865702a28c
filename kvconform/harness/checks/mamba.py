"""``sanity``, the Mamba family: where a Mamba "align" request's state lives.

A Mamba "align" request's state blocks are real, its own, and its table only grows or
nulls columns; a prefill chunk vLLM's scheduler starts inside a block stops at its
boundary or leaves that block's column null.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import failure_at
from kvconform.model.floors import MAMBA_ALIGNED_STATE
from kvconform.model.observations import Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure


def _mamba_align_groups(trajectory: Trajectory) -> dict[int, tuple[int, int]]:
    """group index -> (num_speculative_blocks, num_prefill_checkpoint_blocks) of its
    Mamba "align" groups."""
    return {
        g.index: (
            int(g.floor_args.get("num_speculative_blocks", 0)),
            int(g.floor_args.get("num_prefill_checkpoint_blocks", 0)),
        )
        for g in trajectory.groups
        if g.floor_rule is MAMBA_ALIGNED_STATE
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


def _state_problem(
    obs: Observation,
    before: list[int] | None,
    tables: dict[str, dict[int, list[int]]],
    align: dict[int, tuple[int, int]],
    null: int,
    shared_reported: set[int],
) -> tuple[str, str] | None:
    """What is wrong with where one row's Mamba "align" state lives (:func:`state_blocks`),
    given every live request's tables after the row's step. A shared block is reported
    once (``shared_reported``), by the first row of the two that holds it."""
    shape = align.get(obs.group)
    if shape is None or obs.block_ids is None:
        return None
    ids = list(obs.block_ids)
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
            shared = sorted(
                ({b for t in other_tables.values() for b in t} & set(tail)) - shared_reported
            )
            if shared:
                shared_reported.add(shared[0])
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
    return problem


def state_blocks(trajectory: Trajectory) -> Iterator[Failure]:
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
    tables are read; the rows of one step are applied together before they are judged
    (a state block a running request nulls may go to a request admitted in that step).
    """
    align = _mamba_align_groups(trajectory)
    if not align:
        return
    null = trajectory.null_block
    tables: dict[str, dict[int, list[int]]] = {}
    reported: set[tuple[str, int, str]] = set()
    shared_reported: set[int] = set()
    observations = trajectory.observations
    events = list(trajectory.events)
    next_event = 0
    index = 0
    while index < len(observations):
        while next_event < len(events) and events[next_event].seq <= index:
            tables.pop(events[next_event].request, None)
            next_event += 1
        # The rows of one step, applied together before they are judged: within one
        # schedule() vLLM allocates for the running requests before it admits waiting
        # ones, so a state block a running request nulls may go to a new request in the
        # same step, while the scheduler oracle records the new requests' rows first
        # (as for "puts one block in two groups' tables", checks/sanity.py).
        call = [observations[index]]
        index += 1
        while (
            index < len(observations)
            and observations[index].step == call[0].step
            and not (next_event < len(events) and events[next_event].seq <= index)
        ):
            call.append(observations[index])
            index += 1
        befores = []
        for obs in call:
            befores.append(tables.get(obs.request, {}).get(obs.group))
            tables.setdefault(obs.request, {})[obs.group] = list(obs.block_ids or ())
        for obs, before in zip(call, befores, strict=True):
            problem = _state_problem(obs, before, tables, align, null, shared_reported)
            if problem is None:
                continue
            key = (obs.request, obs.group, problem[0])
            if key in reported:
                continue
            reported.add(key)
            yield failure_at(
                "sanity",
                trajectory,
                obs,
                problem[1],
                {"invariant": f"mamba align {problem[0]}"},
                Party.LIVE,
            )


def chunk_columns(trajectory: Trajectory) -> Iterator[Failure]:
    """A Mamba "align" prefill chunk that starts inside a block stops at its boundary.

    vLLM's worker keeps a request's running state in the column of the last token it
    computed: a chunk reads its initial state from the column holding its start and
    writes its final state into the column of its end. ``cache_blocks`` then hashes
    column ``p`` as the state after exactly ``(p + 1) * block_size`` tokens once the
    request has computed that far (vLLM's invariant "slot p holds the state after
    exactly (p + 1) * block_size tokens"). A chunk that starts at ``s`` inside block
    ``p`` and runs past the boundary ``(p + 1) * block_size`` leaves column ``p``
    holding the state after ``s`` tokens, which vLLM caches as the state after the
    boundary: a later hit resumes from the wrong state. So where the column is still a
    real block after such a chunk, the chunk layout broke the rule (vLLM's scheduler
    ends a chunk that starts mid-block at the boundary, ``_mamba_block_aligned_split``).
    Only the prefill chunks vLLM's scheduler chose (``Trajectory.prefill_rows``, scheduler
    mode) are judged: a trajectory's chunks are its scenario's. The first position a chunk
    computes is past its prefix-cache hit. A group with a prefill checkpoint column is
    not judged: there the worker exports the boundary state mid-chunk
    (``is_mamba_prefill_checkpoint_valid``) and the scheduler lets the prompt's last chunk
    run past the boundary.
    """
    align = {
        g.index: g.block_size
        for g in trajectory.groups
        if g.floor_rule is MAMBA_ALIGNED_STATE
        and not g.floor_args.get("num_prefill_checkpoint_blocks")
    }
    if not align or not trajectory.prefill_rows:
        return
    null = trajectory.null_block
    reported: set[tuple[str, int]] = set()
    for index in sorted(trajectory.prefill_rows):
        obs = trajectory.observations[index]
        size = align.get(obs.group)
        if size is None or (obs.request, obs.group) in reported:
            continue
        start, end = obs.computed + obs.cached, obs.computed + obs.scheduled
        column = start // size
        boundary = (column + 1) * size
        ids = obs.block_ids or ()
        if start % size == 0 or end <= boundary or column >= len(ids) or ids[column] == null:
            continue
        reported.add((obs.request, obs.group))
        yield failure_at(
            "sanity",
            trajectory,
            obs,
            f"the prefill chunk from position {start} to {end} starts inside block {column} "
            f"and runs past its boundary {boundary}, so column {column} (block {ids[column]}) "
            f"keeps the state after {start} tokens, which vLLM caches as the state after "
            f"{boundary} (slot p holds the state after exactly (p + 1) * {size} tokens); "
            f"the chunk must stop at {boundary}",
            {"invariant": "mamba align state in the wrong column", "column": column},
            Party.LIVE,
        )
