"""``capacity``: vLLM serves every step that the floor says the pool holds.

A scenario's pool is the contract's to judge: when the floor's own arithmetic
(the columns ``cdiv(computed + scheduled + lookahead, block_size)`` per group,
the whole sequence's columns under full-sequence admission, minus what the
request holds and its prefix hit brings, against the free blocks left after
``reserved_blocks`` and the watermark) fits the pool, vLLM must serve the step.
``allocate_slots`` returning None there, or a scheduler that never schedules a
waiting request the pool holds, is vLLM asking more than the floor: a failure
that says who wanted how many. Where the scenario's own arithmetic does not fit
(the floors of the requests holding blocks and of the call, against the pool less
the null block), the scenario is wrong (an input error, raised by the driver); what
vLLM's tables hold never makes it one.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import blocks, named
from kvconform.model.checks import Check, always
from kvconform.model.observations import Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame

_FUNCTION = {
    "allocate_slots": "KVCacheManager.allocate_slots",
    "schedule": "Scheduler.schedule",
}


def find(trajectory: Trajectory) -> Iterator[Failure]:
    for denial in trajectory.denials:
        where = f"line {denial.line}, " if denial.line is not None else ""
        function = _FUNCTION.get(denial.who, denial.who)
        yield Failure(
            "capacity",
            f"step {denial.step} ({where}{denial.label}) request {denial.request}: vLLM's "
            f"{function} refuses it, although by the floor's arithmetic it needs "
            f"{blocks(denial.floor_need)} and the pool has {denial.detail}"
            + (f"; the stall shows {denial.cause}" if denial.cause else "")
            + "; the driver stopped there",
            step=denial.step,
            line=denial.line,
            request=denial.request,
            action=denial.label,
            party=Party.LIVE,
            detail={
                "who": denial.who,
                "floor_need": denial.floor_need,
                "available": denial.available,
                "free": denial.free,
                **({"cause": denial.cause} if denial.cause else {}),
            },
        )


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    who = (failure.detail or {}).get("who")
    if who == "schedule":
        return Blame(named(result, Party.LIVE), "never schedules a waiting request the pool holds")
    return Blame(named(result, Party.LIVE), "refuses a step the floor fits in the pool")


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(the vLLM function that refused, the stall's cause where the recording names one):
    ``capacity / schedule`` alone would make a triaged stall excuse every other."""
    detail = failure.detail or {}
    return str(detail.get("who", "-")), str(detail.get("cause", ""))


CHECK = Check(
    "capacity",
    "vLLM serves every step the floor says the pool holds (no refusal, no request waiting forever)",
    find,
    blame,
    signature,
    always(
        "the floor is what a step needs; a pool that holds the floor's blocks must serve "
        "the step, so a refusal there is the allocator or scheduler asking more"
    ),
)
