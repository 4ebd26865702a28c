"""``sanity``, the warmup family: what the recorded warmup (``warmup_kernels``) hands out.

The recorded warmup hands out only blocks of the pool (and, where its KV cache grows on
demand, only committed ones), each to one table, in the passes its limits give.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import PARTY_NAMES, failure_at
from kvconform.model.observations import Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure


def _passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def blocks_in_pool(trajectory: Trajectory) -> Iterator[Failure]:
    """The recorded warmup hands out only blocks the pool has, and never the null block.

    The warmup numbers its blocks itself (from 1, block 0 being the null block);
    an id at or past ``num_blocks`` indexes past the KV-cache tensor on a GPU. Where
    the runner grows its KV cache on demand (0.34's extensible KV cache), an id at or
    past the blocks committed when the step ran is unbacked memory. Not when the
    warmup's writes are redirected to the null block (the elastic-EP re-warm): then
    no id it hands out is written.
    """
    if trajectory.warmup_writes_redirected:
        return
    null, size = trajectory.null_block, trajectory.num_blocks
    committed_at = trajectory.warmup_committed_blocks
    reported: set[tuple[str, int]] = set()
    for obs in trajectory.observations:
        ids = obs.warmup_block_ids
        if not ids or (obs.request, obs.group) in reported:
            continue
        outside = [b for b in ids if b >= size or b < 0]
        committed = committed_at.get(obs.step)
        uncommitted = [b for b in ids if committed is not None and b >= committed]
        if outside or uncommitted or (null in ids and not trajectory.groups[obs.group].holds_null):
            reported.add((obs.request, obs.group))
            if outside:
                what = f"block {outside[0]}, which a pool of {size} blocks does not have"
            elif uncommitted:
                what = (
                    f"block {uncommitted[0]}, which its extensible KV cache has not committed "
                    f"({committed} of {size} blocks backed when the step ran: the warmup "
                    "commits with ensure_kv_cache_blocks before it hands blocks out)"
                )
            else:
                what = f"the null block (id {null})"
            yield failure_at(
                "sanity", trajectory, obs, f"{PARTY_NAMES[Party.WARMUP]} hands out {what}"
            )


def blocks_distinct(trajectory: Trajectory) -> Iterator[Failure]:
    """No block the recorded warmup hands out is in two tables at once.

    The warmup numbers its blocks itself ("Assign distinct block IDs per request per
    group"); a block in two requests' tables, or in two groups of one request, is KV
    that two writers overwrite. A request's blocks are free again once it finishes:
    the finish events are the live replay's, so only rows the live replay mirrors
    (warmup scenarios; not engine mode's GPU warmup rows) are judged. Not when the
    warmup's writes are redirected to the null block.
    """
    if trajectory.warmup_writes_redirected:
        return
    owner: dict[int, tuple[str, int]] = {}
    held: dict[str, set[int]] = {}
    reported: set[tuple[str, int]] = set()
    events = iter(trajectory.events)
    pending = next(events, None)
    for seq, obs in enumerate(trajectory.observations):
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
                yield failure_at(
                    "sanity",
                    trajectory,
                    obs,
                    f"{PARTY_NAMES[Party.WARMUP]} hands out block {block}, which {whose} holds "
                    f"in group {other[1]}",
                    {"invariant": "hands one block to two tables"},
                    party=Party.WARMUP,
                )
        held.setdefault(obs.request, set()).update(ids)


def passes_made(trajectory: Trajectory) -> Iterator[Failure]:
    """warmup_kernels makes the passes the scenario derives from the runner's limits.

    Each pass prefills one batch, as many requests as max_num_seqs, the token
    budget and the pool allow (the null block kept out), and samples randomly or
    greedily; a pass missing, or a batch smaller or larger than the limits give,
    leaves batch shapes unwarmed or hands out blocks the pool does not have.
    """
    expected = trajectory.expected_warmup_passes
    if expected is None or tuple(trajectory.warmup_passes) == expected:
        return
    made = "; ".join(str(p) for p in trajectory.warmup_passes) or "none"
    wanted = "; ".join(str(p) for p in expected)
    yield Failure(
        "sanity",
        f"warmup_kernels made {_passes(len(trajectory.warmup_passes))} ({made}), but "
        f"{trajectory.expected_warmup_passes_at} derives {_passes(len(expected))} ({wanted})",
        party=Party.WARMUP,
        detail={"invariant": "warms other batches than its limits give"},
    )
