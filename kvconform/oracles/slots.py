"""The slots party: where vLLM's own slot-mapping kernel puts every written position.

A held-block count is a proxy; the harm of holding too few blocks is where the
KV of a position is written. vLLM's V2 model runner turns positions into slots
with ``BlockTables.compute_slot_mappings`` (a Triton kernel), which loads
``block_table[row, position // block_size]`` with no bound on the column and
never reads how many blocks the row holds. The drafter calls it for the
lookahead positions past the scheduled ones. This party replays every step of a
recorded :class:`Trajectory` through that kernel:

1. Each party that recorded block ids (the live allocator: ``block_ids``; the
   recorded warmup: ``warmup_block_ids``) gets one row per request scheduled in
   the step, in a real ``BlockTables`` of the loaded vLLM (one per scenario),
   written through vLLM's staged writer. The row holds the request's block ids; every column past them
   holds a *poison* id and the row's last column a *guard* id, both above any
   real block id, so nothing past the held blocks can pass for a real block
   (and a position can never run past its row into the next one).
2. For every row, the positions its step writes (:func:`positions_written`):
   the target model's scheduled positions, then the drafter's lookahead
   positions, clamped as the speculators clamp them. The kernel is a pure
   function of a row's contents and a position, so the whole scenario is one
   batch: each distinct holding is one row carrying every position written
   through it, and one kernel launch maps them all, for every step, request,
   party and group.
3. Every position whose slot falls outside a real block of its own row is an
   escape (:class:`SlotEscape`). Escaped positions are mapped a second time
   (one more launch) through rows as vLLM's ``BlockTables`` leaves them
   (zero-filled past the held columns), so the report says where vLLM itself
   would write: in a fresh row, block 0, the null block.

Only token-indexed groups are mapped (the group types whose reference floor is
a :attr:`~kvconform.model.floors.FloorRule.counts_token_columns` rule); the others, and groups
sharded by decode context parallelism, are listed with the reason in
:attr:`SlotRecording.groups_skipped`. The party records; ``check_slots`` in
:mod:`kvconform.harness.checks` judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvconform.errors import VllmUnavailable
from kvconform.model.methods import method_for
from kvconform.model.observations import (
    BLOCK_ID_PARTIES,
    Observation,
    SlotEscape,
    SlotRecording,
    Trajectory,
    party_block_ids,
)
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.dflash_kernel import DflashKernel, dflash_kernel_of
from kvconform.oracles.vllm.slot_kernel import SlotKernel, slot_kernel_of

if TYPE_CHECKING:
    import numpy as np

Writes = tuple[Sequence[int], Sequence[int]]
PositionsWritten = Callable[[Observation, int], Writes]


def positions_written(obs: Observation, max_model_len: int) -> Writes:
    """(target positions, drafter positions) written at one step of one request.

    The target writes the scheduled positions ``computed .. computed + scheduled
    - 1``, less the first ``cached`` of them, which a prefix-cache hit supplied
    (computed, not written; a sliding window may already have nulled their
    column). The drafter writes the ``lookahead`` positions past them, each
    clamped to ``max_model_len - 1`` as the speculators clamp their positions
    (``spec_decode/standalone_ar/speculator.py``: ``tl.minimum(start_pos + j,
    max_model_len - 1)``; ``dflash/speculator.py``: ``clamped_query_pos``). It
    is the range the allocator reserves for (``computed + scheduled +
    lookahead``): with rejected drafts the drafter writes a prefix of it.
    """
    end = obs.computed + obs.scheduled
    target = range(obs.computed + obs.cached, end)
    last = max_model_len - 1
    drafter = [min(p, last) for p in range(end, end + obs.lookahead)]
    return target, drafter


def skipped_groups(trajectory: Trajectory) -> dict[int, str]:
    """Groups the kernel check does not map, with why."""
    skipped = {}
    for group in trajectory.groups:
        if not group.floor_rule.counts_token_columns:
            skipped[group.index] = (
                f"{group.type}: its block table is not indexed by token position "
                f"({group.floor_rule.reason})"
            )
        elif int(group.floor_args.get("dcp_world_size", 1)) > 1:
            skipped[group.index] = (
                f"{group.type}: sharded by decode context parallelism (dcp_world_size "
                f"{group.floor_args['dcp_world_size']}); kvconform maps single-rank tables only"
            )
    return skipped


def unmapped_reason(trajectory: Trajectory, skipped: dict[int, str]) -> str:
    """Why no group is mapped, in one short line: the group types by reason, the figures
    kept (each group's whole reason is ``SlotRecording.groups_skipped``, in report.json)."""
    if not trajectory.groups:
        return "no KV-cache group to map: the scenario's model has none"
    by_reason: dict[str, list[str]] = {}
    for group in trajectory.groups:
        why = skipped.get(group.index, "")
        if not group.floor_rule.counts_token_columns:
            short = "not indexed by token position"
        elif why:
            dcp = group.floor_args.get("dcp_world_size", 1)
            short = f"sharded by decode context parallelism (dcp_world_size {dcp})"
        else:
            continue
        types = by_reason.setdefault(short, [])
        if group.type not in types:
            types.append(group.type)
    reasons = "; ".join(f"{', '.join(types)} {why}" for why, types in by_reason.items())
    return f"no token-indexed group to map: {reasons or 'none of the groups is mapped'}"


@dataclass(frozen=True)
class _Row:
    party: str
    request: str
    observations: tuple[int, ...]  # one per mapped group, in mapped-group order
    held: tuple[tuple[int, ...], ...]  # block ids per mapped group
    target: Sequence[int]
    positions: tuple[int, ...]  # the target's, then the drafter's
    end: int = 0  # computed + scheduled: the drafter's first position, unclamped
    lookahead: int = 0  # how many positions the drafter writes from `end`


def _steps(
    trajectory: Trajectory, mapped: Sequence[int], writes: PositionsWritten
) -> list[list[_Row]]:
    """Rows per step: one per party and request, in the order the driver recorded them."""
    steps: dict[int, dict[tuple[str, str], dict[int, tuple[int, Sequence[int]]]]] = {}
    first: dict[tuple[int, str, str], Observation] = {}
    for index, obs in enumerate(trajectory.observations):
        if obs.group not in mapped:
            continue
        for party in BLOCK_ID_PARTIES:
            ids = party_block_ids(obs, party)
            if ids is None:
                continue
            key = (party, obs.request)
            steps.setdefault(obs.step, {}).setdefault(key, {})[obs.group] = (index, ids)
            first.setdefault((obs.step, party, obs.request), obs)
    out = []
    for step, requests in steps.items():
        rows = []
        for (party, request), by_group in requests.items():
            if len(by_group) != len(mapped):
                continue  # a party that recorded only some groups: nothing to align
            obs = first[(step, party, request)]
            target, drafter = writes(obs, trajectory.max_model_len)
            rows.append(
                _Row(
                    party,
                    request,
                    tuple(by_group[g][0] for g in mapped),
                    tuple(tuple(int(b) for b in by_group[g][1]) for g in mapped),
                    target,
                    (*target, *drafter),
                    obs.computed + obs.scheduled,
                    len(drafter),
                )
            )
        out.append(rows)
    return out


def record_slots(
    trajectory: Trajectory, vllm: Vllm, writes: PositionsWritten = positions_written
) -> SlotRecording:
    """Map every step of ``run`` through vLLM's kernel; the result is also ``run.slots``."""
    if trajectory.slots is not None:  # the driver recorded the real mappings (engine mode)
        return trajectory.slots
    started = time.perf_counter()
    recording = SlotRecording()
    trajectory.slots = recording
    skipped = skipped_groups(trajectory)
    recording.groups_skipped = skipped
    mapped = [g.index for g in trajectory.groups if g.index not in skipped]
    recording.groups_mapped = tuple(mapped)
    if not mapped:
        recording.skipped = unmapped_reason(trajectory, skipped)
        return recording
    steps = [rows for rows in _steps(trajectory, mapped, writes) if rows]
    if not steps:
        recording.skipped = "no party recorded the block ids it held"
        return recording
    dflash = None
    if drafter_kernel(trajectory) == DFLASH_KERNEL and any(r.lookahead for s in steps for r in s):
        try:
            dflash = dflash_kernel_of(vllm)
        except VllmUnavailable as exc:
            recording.skipped = str(exc)
            return recording
    try:
        kernel = slot_kernel_of(vllm)
    except VllmUnavailable as exc:
        recording.skipped = str(exc)
        return recording

    block_sizes = [trajectory.groups[g].block_size for g in mapped]
    everything = _Batch(steps)
    # A DFlash or DSpark drafter writes through its own kernel: compute_slot_mappings
    # maps the target's positions only, prepare_dflash_inputs the drafter's.
    batch = _Batch(_target_only(steps)) if dflash is not None else everything
    highest = max(
        [trajectory.null_block, trajectory.num_blocks - 1]
        + [b for held in everything.rows for ids in held for b in ids]
    )
    recording.poison, recording.guard = highest + 1, highest + 2
    # Every row is wide enough for its widest holding and its highest written
    # column, plus the guard column: the kernel never reads past a row.
    columns = [
        1
        + max(
            max(len(held[i]), max(positions, default=-1) // size + 1)
            for held, positions in zip(everything.rows, everything.positions, strict=True)
        )
        for i, size in enumerate(block_sizes)
    ]
    try:
        tables = kernel.tables(block_sizes, len(batch.rows), max(len(batch.flat), 1), columns)
    except Exception as exc:  # noqa: BLE001 - the check cannot set up here; the others decide
        recording.skipped = (
            f"vLLM {vllm.version}'s BlockTables cannot be built in this process "
            f"({type(exc).__name__}: {exc})"
        )
        return recording
    # Said once the tables exist: building them decides whether stand-ins were needed.
    recording.mode = kernel.mode
    note = len(trajectory.notes)
    trajectory.notes.append(f"slots: {kernel.mode}")
    tables.write_rows(
        [
            tuple(
                _padded(ids, columns[i], recording.poison, recording.guard)
                for i, ids in enumerate(held)
            )
            for held in batch.rows
        ]
    )
    slots = tables.map(range(len(batch.rows)), batch.starts, batch.flat)
    recording.kernel_calls = 1
    outside = _outside(batch, slots, block_sizes, trajectory.null_block)

    fresh = _as_vllm_leaves_them(kernel, batch, outside, block_sizes, columns)
    recording.kernel_calls += 1 if fresh else 0

    recording.escapes = _escapes(steps, batch, outside, fresh, block_sizes)
    if dflash is not None:
        recording.mode += f"; drafter positions: {dflash.mode}"
        trajectory.notes[note] = f"slots: {recording.mode}"
        escapes, calls = _dflash_escapes(
            dflash, trajectory, steps, block_sizes, columns, recording.poison, recording.guard
        )
        recording.escapes = _in_recording_order(recording.escapes + escapes)
        recording.kernel_calls += calls
    recording.steps = len(steps)
    recording.rows = len(batch.rows)
    recording.positions = len(batch.flat) * len(mapped)
    recording.seconds = time.perf_counter() - started
    return recording


def drafter_kernel(trajectory: Trajectory) -> str:
    """vLLM's kernel that maps the drafter's positions, from the method registry."""
    entry = method_for(trajectory.method)
    return entry.drafter_kernel if entry is not None else "compute_slot_mappings"


DFLASH_KERNEL = "prepare_dflash_inputs"


def _target_only(steps: Sequence[Sequence[_Row]]) -> list[list[_Row]]:
    return [[replace(row, positions=tuple(row.target)) for row in rows] for rows in steps]


def _in_recording_order(escapes: list[SlotEscape]) -> list[SlotEscape]:
    """Escapes ordered as the check groups them: by observation, party, role, position."""
    return sorted(escapes, key=lambda e: (e.observation, e.party, e.role != "target", e.position))


def _dflash_escapes(
    kernel: DflashKernel,
    trajectory: Trajectory,
    steps: Sequence[Sequence[_Row]],
    block_sizes: Sequence[int],
    columns: Sequence[int],
    poison: int,
    guard: int,
) -> tuple[list[SlotEscape], int]:
    """The drafter's positions through ``prepare_dflash_inputs``; (escapes, launches).

    One batch entry per distinct (holding, drafter start, lookahead), one launch per
    mapped group and lookahead, on rows padded with kvconform's poison; the escaped
    entries once more on rows as a fresh gathered batch row has them (zero past the
    held columns). Queries past ``max_model_len - 1`` are not judged: the kernel
    computes their slot from the unclamped position (it clamps only the position it
    stores and the column, to the row's last), which the contract does not cover.
    """
    last = trajectory.max_model_len - 1
    entries: dict[tuple[tuple[tuple[int, ...], ...], int, int], int] = {}
    uses: list[tuple[_Row, int]] = []
    for rows in steps:
        for row in rows:
            if row.lookahead and row.end <= last:
                key = (row.held, row.end, row.lookahead)
                uses.append((row, entries.setdefault(key, len(entries))))
    if not entries:
        return [], 0
    keys = list(entries)
    calls = 0
    escapes: list[SlotEscape] = []
    for lookahead in sorted({k[2] for k in keys}):
        chosen = [i for i, k in enumerate(keys) if k[2] == lookahead]
        for g, size in enumerate(block_sizes):
            held = [keys[i][0][g] for i in chosen]
            ends = [keys[i][1] for i in chosen]
            slots = kernel.query_slots(
                [_padded(ids, columns[g], poison, guard) for ids in held],
                [end - 1 for end in ends],
                lookahead,
                size,
                trajectory.max_model_len,
                trajectory.sample_from_anchor,
            )
            calls += 1
            outside: dict[tuple[int, int], int] = {}
            for r, (ids, end) in enumerate(zip(held, ends, strict=True)):
                own = {b for b in ids if b != trajectory.null_block}
                for j, slot in enumerate(slots[r]):
                    if end + j > last:
                        continue
                    if slot < 0 or slot // size not in own:
                        outside[(chosen[r], j)] = slot
            if not outside:
                continue
            again = sorted({i for i, _ in outside})
            fresh_slots = kernel.query_slots(
                [_padded(keys[i][0][g], columns[g], 0, 0) for i in again],
                [keys[i][1] - 1 for i in again],
                lookahead,
                size,
                trajectory.max_model_len,
                trajectory.sample_from_anchor,
            )
            calls += 1
            fresh = {
                (i, j): slot for r, i in enumerate(again) for j, slot in enumerate(fresh_slots[r])
            }
            for row, i in uses:
                if keys[i][2] != lookahead:
                    continue
                for j in range(lookahead):
                    if (i, j) not in outside:
                        continue
                    slot = outside[(i, j)]
                    position = row.end + j
                    fresh_slot = fresh[(i, j)]
                    escapes.append(
                        SlotEscape(
                            row.observations[g],
                            row.party,
                            "drafter",
                            position,
                            position // size,
                            slot,
                            slot // size if slot >= 0 else -1,
                            fresh_slot,
                            fresh_slot // size if fresh_slot >= 0 else None,
                            DFLASH_KERNEL,
                        )
                    )
    return escapes, calls


def _escapes(
    steps: Sequence[Sequence[_Row]],
    batch: _Batch,
    outside: dict[tuple[int, int, int], int],
    fresh: dict[tuple[int, int, int], int],
    block_sizes: Sequence[int],
) -> list[SlotEscape]:
    """Every (step, row, group, position) whose slot fell outside, in recording order."""
    escapes: list[SlotEscape] = []
    if not outside:
        return escapes
    for step_rows, uses in zip(steps, batch.uses, strict=True):
        for row, u in zip(step_rows, uses, strict=True):
            for i, size in enumerate(block_sizes):
                seen: set[int] = set()  # a clamped drafter writes one position twice
                for k, position in enumerate(row.positions):
                    slot = outside.get((u, i, position))
                    if slot is None or position in seen:
                        continue
                    seen.add(position)
                    fresh_slot = fresh.get((u, i, position))
                    escapes.append(
                        SlotEscape(
                            row.observations[i],
                            row.party,
                            "target" if k < len(row.target) else "drafter",
                            position,
                            position // size,
                            slot,
                            slot // size,
                            fresh_slot,
                            None if fresh_slot is None else fresh_slot // size,
                        )
                    )
    return escapes


def _as_vllm_leaves_them(
    kernel: SlotKernel,
    batch: _Batch,
    outside: dict[tuple[int, int, int], int],
    block_sizes: Sequence[int],
    columns: Sequence[int],
) -> dict[tuple[int, int, int], int]:
    """Where vLLM itself writes the escaped positions: (entry, group, position) -> slot.

    The same rows as ``BlockTables`` leaves them, zero past the held columns,
    mapped once more for the escaped positions only (no launch when none escaped).
    """
    if not outside:
        return {}
    entries = sorted({u for u, _, _ in outside})
    positions = {u: sorted({p for v, _, p in outside if v == u}) for u in entries}
    starts, flat = [0], []
    for u in entries:
        flat.extend(positions[u])
        starts.append(len(flat))
    tables = kernel.tables(block_sizes, len(entries), len(flat), columns)
    tables.write_rows(
        [
            tuple(_padded(ids, columns[i], 0, 0) for i, ids in enumerate(batch.rows[u]))
            for u in entries
        ]
    )
    slots = tables.map(range(len(entries)), starts, flat)
    return {
        (u, i, position): int(slots[i, starts[r] + k])
        for r, u in enumerate(entries)
        for k, position in enumerate(positions[u])
        for i in range(len(block_sizes))
    }


class _Batch:
    """Every step's rows as one kernel batch.

    The kernel is a pure function of a row's contents and a position, so each
    distinct holding is one row (one batch entry) carrying every position any
    step writes through it, each once: one launch for the whole scenario.
    """

    def __init__(self, steps: Sequence[Sequence[_Row]]) -> None:
        index: dict[tuple[tuple[int, ...], ...], int] = {}
        wanted: list[set[int]] = []
        self.uses: list[list[int]] = []  # per step, per row: its batch entry
        for rows in steps:
            uses = []
            for row in rows:
                u = index.setdefault(row.held, len(index))
                if u == len(wanted):
                    wanted.append(set())
                wanted[u].update(row.positions)
                uses.append(u)
            self.uses.append(uses)
        self.rows = list(index)
        self.positions = [sorted(p) for p in wanted]
        self.flat: list[int] = []
        self.starts = [0]
        for positions in self.positions:
            self.flat.extend(positions)
            self.starts.append(len(self.flat))


def _padded(held: tuple[int, ...], width: int, fill: int, guard: int) -> tuple[int, ...]:
    return held + (fill,) * (width - 1 - len(held)) + (guard,)


def _outside(
    batch: _Batch, slots: np.ndarray, block_sizes: Sequence[int], null_block: int
) -> dict[tuple[int, int, int], int]:
    """(batch entry, mapped group, position) -> slot, for every slot outside a real held block."""
    import numpy as np  # here: the checks' registry is imported by `merge`, which has no numpy

    found: dict[tuple[int, int, int], int] = {}
    for u, (held, positions) in enumerate(zip(batch.rows, batch.positions, strict=True)):
        start, end = batch.starts[u], batch.starts[u + 1]
        for i, size in enumerate(block_sizes):
            row_slots = slots[i, start:end]
            own = np.array([b for b in held[i] if b != null_block], dtype=np.int64)
            for t in np.nonzero(~np.isin(row_slots // size, own))[0]:
                found[(u, i, positions[int(t)])] = int(row_slots[t])
    return found
