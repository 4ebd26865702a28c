"""The parties: the parts of vLLM kvconform holds to the contract, one registry entry each.

A party is who holds blocks (or decides what is held) in a recorded run: the live
allocator a trajectory scenario drives, the warmup predictor, the recorded warmup,
vLLM's scheduler and engine, the startup planning, the slot mappings, and the
speculative config's lookahead. :class:`Party` names them (a string enum: recordings,
report.json and the reports write the value, ``live``); :data:`PARTIES` says, per
party, the code of vLLM it stands for and whose output it reads (its data flow, which
ranks root causes: :func:`upstream_of`). Every other module names a party through
:class:`Party`, never as a string (``tests/test_registries.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvconform.model.names import Name


class Party(Name):
    LIVE = "live"
    PREDICTED = "predicted"
    WARMUP = "warmup"
    SCHEDULER = "scheduler"
    ENGINE = "engine"
    PLANNER = "planner"
    SLOTS = "slots"
    DFLASH_SLOTS = "dflash_slots"
    CONFIG = "config"


@dataclass(frozen=True)
class PartyCode:
    """A party, and the code of vLLM it stands for."""

    name: Party
    description: str
    function: str
    file: str  # inside the vLLM source tree, from the folder holding vllm/
    # The parties whose output this one reads in vLLM (its data flow): a fault of one of
    # them reaches this party, never the other way round (:func:`upstream_of`).
    reads: tuple[Party, ...] = ()


# Keyed by Party; looked up by the party a record names (the string a recording keeps).
PARTIES: Mapping[str, PartyCode] = MappingProxyType(
    {
        p.name: p
        for p in (
            PartyCode(
                Party.LIVE,
                "the live allocator",
                "KVCacheManager.allocate_slots",
                "vllm/v1/core/kv_cache_manager.py",
                # reserves num_lookahead_tokens slots, in the pool the planning sized
                reads=(Party.CONFIG, Party.PLANNER),
            ),
            PartyCode(
                Party.PREDICTED,
                "the warmup predictor",
                "_reserved_block_count",
                "vllm/v1/worker/gpu/warmup.py",
                reads=(Party.CONFIG,),  # called with num_lookahead_tokens
            ),
            PartyCode(
                Party.WARMUP,
                "the recorded warmup",
                "warmup_kernels / _warmup_block_counter",
                "vllm/v1/worker/gpu/warmup.py",
                # sizes its blocks with the predictor's count
                reads=(Party.PREDICTED, Party.CONFIG),
            ),
            PartyCode(
                Party.SCHEDULER,
                "the scheduler",
                "Scheduler.schedule",
                "vllm/v1/core/sched/scheduler.py",
                # asks KVCacheManager.allocate_slots with the lookahead
                reads=(Party.CONFIG, Party.PLANNER, Party.LIVE),
            ),
            PartyCode(
                Party.ENGINE,
                "the engine",
                "EngineCore.step",
                "vllm/v1/engine/core.py",
                reads=(Party.CONFIG, Party.PLANNER, Party.SCHEDULER),  # runs vLLM's scheduler
            ),
            PartyCode(
                Party.PLANNER,
                "the startup KV-cache planning",
                "get_kv_cache_configs",
                "vllm/v1/core/kv_cache_planning.py",
            ),
            PartyCode(
                Party.SLOTS,
                "the slot mapping",
                "BlockTables.compute_slot_mappings",
                "vllm/v1/worker/gpu/block_table.py",
                # maps positions into the block tables the live side filled
                reads=(Party.LIVE, Party.SCHEDULER, Party.ENGINE, Party.CONFIG),
            ),
            PartyCode(
                Party.DFLASH_SLOTS,
                "the DFlash/DSpark drafter's slot mapping",
                "prepare_dflash_inputs",
                "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py",
                reads=(Party.LIVE, Party.SCHEDULER, Party.ENGINE, Party.CONFIG),
            ),
            PartyCode(
                Party.CONFIG,
                "the speculative config's lookahead",
                "VllmConfig.num_lookahead_tokens",
                "vllm/config/vllm.py",
            ),
        )
    }
)
assert set(PARTIES) == set(Party), "every party has its code"


def upstream_of(party: str) -> frozenset[str]:
    """Every party whose output reaches ``party`` through vLLM's data flow (``PartyCode.reads``,
    followed to the end): ``upstream_of(Party.WARMUP)`` holds the predictor and the config."""
    seen: set[str] = set()
    todo: list[str] = list(PARTIES[party].reads) if party in PARTIES else []
    while todo:
        name = todo.pop()
        if name not in seen and name != party:
            seen.add(name)
            todo.extend(PARTIES[name].reads if name in PARTIES else ())
    return frozenset(seen)


# The live side: the parties whose counts come from vLLM's KVCacheManager, which
# dispatches each group to a manager class by its spec class.
LIVE_PARTIES = (Party.LIVE, Party.SCHEDULER, Party.ENGINE)
