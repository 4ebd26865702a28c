"""``startup``: vLLM's startup planning accepts a pool exactly when one max_model_len request fits.

Before it serves, vLLM's engine core plans its KV cache (``get_kv_cache_configs``):
it sizes the pool from the profiled memory or ``num_gpu_blocks_override``, and
refuses to start (or, with auto-fit, lowers ``max_model_len``) unless one request of
``max_model_len`` tokens fits. The contract's arithmetic for that request is the
floor: every group's floor for ``max_model_len`` tokens computed and written
(``cdiv(max_model_len, block_size)`` columns of a token-indexed group, a Mamba
group's running state plus its speculative blocks), against the pool less the null
block ``BlockPool`` keeps back. So, for a ``kind: startup`` scenario
(:class:`~kvconform.model.observations.StartupRecord`):

* vLLM accepts: the request's floor fits the pool it chose; else vLLM starts an
  engine that admits such a request and never schedules it (a hang);
* with auto-fit, the ``max_model_len`` vLLM fitted is the longest whose floor fits
  (one token more does not);
* vLLM refuses: the floor does not fit the pool it would have had (the override,
  else the memory's blocks); else it refuses a pool that serves the request;
* where the scenario states the outcome (``expect``, ``expect_max_model_len``,
  derived by hand), vLLM's decision is that one.

Failures say who wanted how many: the floor per group, the pool, the null block.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import blocks, named
from kvconform.model.checks import Check, always
from kvconform.model.observations import StartupRecord, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame


def request_floor(trajectory: Trajectory, length: int) -> list[int]:
    """Each group's floor for one request of ``length`` tokens, computed and written."""
    return [info.step_floor()(0, length, 0, 0) for info in trajectory.groups]


def _wants(trajectory: Trajectory, floors: list[int]) -> str:
    return ", ".join(
        f"group {info.index} ({info.label}) {n}"
        for info, n in zip(trajectory.groups, floors, strict=True)
    )


def _failure(record: StartupRecord, message: str, who: str, need: int, pool: int) -> Failure:
    return Failure(
        "startup",
        message,
        line=record.line,
        action="startup",
        party=Party.LIVE,
        detail={"who": who, "floor_need": need, "pool": pool, "usable": pool - 1},
    )


def find(trajectory: Trajectory) -> Iterator[Failure]:
    record = trajectory.startup
    if record is None:
        return
    pool = record.pool
    usable = pool - 1  # BlockPool keeps one block back: the null block
    length = record.max_model_len
    floors = request_floor(trajectory, length)
    need = sum(floors)
    planning = f"vLLM's startup planning ({record.function})"
    handed = f"{record.available_blocks} blocks of memory" + (
        f" and num_gpu_blocks_override {record.override}" if record.override is not None else ""
    )
    if record.accepted:
        if need > usable:
            yield _failure(
                record,
                f"{planning} accepts a pool of {blocks(pool)} ({handed}) for max_model_len "
                f"{length}, but one request of {length} tokens needs {blocks(need)} by the floor "
                f"({_wants(trajectory, floors)}) and the pool gives {usable} (one block is the "
                "null block BlockPool keeps back): vLLM admits such a request and never "
                "schedules it",
                "accepts a pool one max_model_len request does not fit",
                need,
                pool,
            )
        elif record.auto_fit and length < record.original_max_model_len:
            longer = request_floor(trajectory, length + 1)
            if sum(longer) <= usable:
                yield _failure(
                    record,
                    f"{planning} auto-fits max_model_len to {length} for a pool of "
                    f"{blocks(pool)} ({handed}), but a request of {length + 1} tokens needs only "
                    f"{blocks(sum(longer))} by the floor ({_wants(trajectory, longer)}) of the "
                    f"{usable} the pool gives",
                    "lowers max_model_len below what the pool fits",
                    sum(longer),
                    pool,
                )
    else:
        shortest = 1 if record.auto_fit else length
        floors = request_floor(trajectory, shortest)
        if sum(floors) <= usable:
            what = (
                f"a max_model_len of even 1 token needs {blocks(sum(floors))}"
                if record.auto_fit
                else f"one request of max_model_len {length} needs {blocks(sum(floors))}"
            )
            yield _failure(
                record,
                f'{planning} refuses to start with {handed} ("{record.refusal}"), although '
                f"{what} by the floor ({_wants(trajectory, floors)}) and a pool of "
                f"{blocks(pool)} gives {usable} (the null block kept back)",
                "refuses a pool one max_model_len request fits",
                sum(floors),
                pool,
            )
    if record.expect is not None and (record.expect == "accept") != record.accepted:
        decided = (
            f"accepts a pool of {blocks(pool)}"
            if record.accepted
            else f'refuses ("{record.refusal}")'
        )
        yield _failure(
            record,
            f"the scenario states that {planning} {record.expect}s {handed} for max_model_len "
            f"{record.original_max_model_len}, but it {decided}",
            "decides otherwise than the scenario states",
            need,
            pool,
        )
    expected = record.expect_max_model_len
    if expected is not None and record.accepted and length != expected:
        yield _failure(
            record,
            f"the scenario states that {planning} auto-fits max_model_len to {expected} with "
            f"{handed}, but it fits {length}",
            "decides otherwise than the scenario states",
            need,
            pool,
        )


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    return Blame(
        named(result, Party.LIVE), str((failure.detail or {}).get("who", "misplans the pool"))
    )


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    return str((failure.detail or {}).get("who", "-")), ""


CHECK = Check(
    "startup",
    "vLLM's startup planning accepts a pool (and auto-fits max_model_len) exactly when one "
    "max_model_len request's floor fits it, the null block kept back",
    find,
    blame,
    signature,
    always(
        "a pool that cannot hold one max_model_len request by the floor starts an engine "
        "that admits such a request and never schedules it; one that can must not be refused"
    ),
)
