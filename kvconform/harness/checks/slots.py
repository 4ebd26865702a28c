"""``slots``: every position written lands, through vLLM's own kernel, in a block its request holds.

The kernel (``BlockTables.compute_slot_mappings``) runs in the slots party
(:mod:`kvconform.oracles.slots`), which the runner runs after the driver only
when this check is selected; the check reads what it recorded. Not a default
check: on a machine without CUDA the kernel runs under Triton's interpreter,
which costs time (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby

from kvconform.errors import CheckSkipped
from kvconform.harness.checks.records import PARTY_NAMES, blocks, failure_at, named
from kvconform.model.checks import Check, always
from kvconform.model.observations import BLOCK_ID_PARTIES, Observation, Trajectory, party_block_ids
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import PARTIES, Blame
from kvconform.oracles.slots import DFLASH_KERNEL, record_slots


def find(trajectory: Trajectory) -> Iterator[Failure]:
    recording = trajectory.slots
    if recording is None:
        raise CheckSkipped("the slots party did not run for this scenario")
    if recording.skipped is not None:
        raise CheckSkipped(recording.skipped)
    owners = _owners(trajectory)
    # One failure per run of consecutive positions of one row that land alike.
    for _, run_of in groupby(
        recording.escapes,
        key=lambda e: (e.observation, e.party, e.role, e.block, e.fresh_block),
    ):
        escapes = list(run_of)
        first = escapes[0]
        obs = trajectory.observations[first.observation]
        held = _party_ids(obs, first.party)
        whose = _whose(first.block, trajectory, obs, first.party, held, owners)
        positions = _span([e.position for e in escapes])
        columns = _span(sorted({e.column for e in escapes}))
        many = len(escapes) > 1
        column_word = "columns" if "," in columns or ".." in columns else "column"
        dflash = first.kernel == DFLASH_KERNEL
        kernel = (
            "vLLM's prepare_dflash_inputs (the DFlash/DSpark drafter's input kernel)"
            if dflash
            else "vLLM's slot-mapping kernel"
        )
        message = (
            f"{first.role} position{'s' if many else ''} {positions} ({column_word} {columns}) "
            f"{'fall' if many else 'falls'} outside the {blocks(len(held))} "
            f"{PARTY_NAMES[first.party]} holds: {kernel} read {whose}"
        )
        fresh = None
        if dflash:
            if first.fresh_slot is not None and first.fresh_slot < 0:
                fresh = "nothing (PAD_SLOT_ID)"
                message += (
                    "; through a freshly gathered batch row (zero past the held columns) the "
                    f"kernel writes nothing for {'them' if many else 'it'} (PAD_SLOT_ID: a "
                    "zero column is skipped, so the query's KV is never stored)"
                )
            else:
                fresh = _whose(first.fresh_block or 0, trajectory, obs, first.party, held, owners)
                message += (
                    "; through a freshly gathered batch row (zero past the held columns) "
                    f"{'they go' if many else 'it goes'} to {fresh}"
                )
            message += (
                "; in a batch row an earlier step gathered, the columns past the held ones "
                "still hold that step's block ids (gather_block_tables copies only the held "
                "columns), and the write lands there, possibly in another running request's "
                "block (docs/findings.md #5)"
            )
        elif first.fresh_block is not None and first.fresh_block != first.block:
            fresh = _whose(first.fresh_block, trajectory, obs, first.party, held, owners)
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
            "kernel": first.kernel,
        }
        yield failure_at("slots", trajectory, obs, message, detail, party=first.party)


def _party_ids(obs: Observation, party: str) -> list[int]:
    return list(party_block_ids(obs, party) or ())


def _owners(trajectory: Trajectory) -> dict[tuple[int, str, int], dict[int, str]]:
    """(step, party, group) -> {block: request} for every block a request held then."""
    owners: dict[tuple[int, str, int], dict[int, str]] = {}
    for obs in trajectory.observations:
        for party in BLOCK_ID_PARTIES:
            table = owners.setdefault((obs.step, party, obs.group), {})
            for block in _party_ids(obs, party):
                table.setdefault(block, obs.request)
    return owners


def _whose(
    block: int,
    trajectory: Trajectory,
    obs: Observation,
    party: str,
    held: list[int],
    owners: dict[tuple[int, str, int], dict[int, str]],
) -> str:
    recording = trajectory.slots
    assert recording is not None
    if block == recording.poison:
        return "kvconform's poison past the held columns (no block)"
    if block == recording.guard:
        return "the guard past the end of the row (no block)"
    if block == trajectory.null_block:
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


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    """The slot mapping, unless the holder is below the floor at that step: a write
    past too few blocks follows from the shortfall (``follows``), and the root causes
    fold it into the shortfall's group."""
    detail = failure.detail or {}
    party = detail.get("party")
    holder_party = named(result, party if isinstance(party, str) else None)
    holder = PARTIES[holder_party].description
    mapper = Party.DFLASH_SLOTS if detail.get("kernel") == DFLASH_KERNEL else Party.SLOTS
    return Blame(
        mapper,
        f"maps {detail.get('role', 'written')} positions past the blocks {holder} holds "
        f"into {_landing(str(detail.get('whose', '')))}",
        follows=holder_party,
    )


def _landing(whose: str) -> str:
    if "poison" in whose or "guard" in whose:
        return "no block"
    if "null block" in whose:
        return "the null block"
    if "of request" in whose:
        return "another request's block"
    return "a block no request holds"


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    return failure.spec_type or "-", ""


CHECK = Check(
    "slots",
    "every position the target or the drafter writes lands, through vLLM's slot-mapping "
    "kernel, in a block its request holds",
    find,
    blame,
    signature,
    always(
        "vLLM's slot-mapping kernel does not bound the column index: a position past the "
        "held blocks is written into whatever the row holds there"
    ),
    default=False,
    record=record_slots,
)
