"""Root-cause groups: the failure records of a run, gathered by who fell short and how.

One bug in vLLM fails many scenarios at many steps, and listing them one by one
hides that they share a cause. A :class:`RootCause` gathers the records
(:class:`~kvconform.model.results.Failure`) that have the same *party* (the
part of vLLM whose count is wrong), the same *check* and the same *miss* (the
shape of the wrong count, computed from the numbers the record carries: "short
by exactly the lookahead", "off by one block at the max_model_len cap", ...),
and lists the group types, methods and scenarios it spans. Each party names the
vLLM function and file it stands for, so a group reads as a sentence about
vLLM's code. :mod:`kvconform.harness.root_causes` builds the groups; the reports
show them largest first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Party:
    """A part of vLLM that kvconform holds to the contract, and the code it stands for."""

    name: str
    description: str
    function: str
    file: str  # inside the vLLM source tree, from the folder holding vllm/


PARTIES: Mapping[str, Party] = MappingProxyType(
    {
        p.name: p
        for p in (
            Party(
                "live",
                "the live allocator",
                "KVCacheManager.allocate_slots",
                "vllm/v1/core/kv_cache_manager.py",
            ),
            Party(
                "predicted",
                "the warmup predictor",
                "_reserved_block_count",
                "vllm/v1/worker/gpu/warmup.py",
            ),
            Party(
                "warmup",
                "the recorded warmup",
                "warmup_kernels / _warmup_block_counter",
                "vllm/v1/worker/gpu/warmup.py",
            ),
            Party(
                "scheduler",
                "the scheduler",
                "Scheduler.schedule",
                "vllm/v1/core/sched/scheduler.py",
            ),
            Party(
                "engine",
                "the engine",
                "EngineCore.step",
                "vllm/v1/engine/core.py",
            ),
            Party(
                "slots",
                "the slot mapping",
                "BlockTables.compute_slot_mappings",
                "vllm/v1/worker/gpu/block_table.py",
            ),
            Party(
                "dflash_slots",
                "the DFlash/DSpark drafter's slot mapping",
                "prepare_dflash_inputs",
                "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py",
            ),
            Party(
                "config",
                "the speculative config's lookahead",
                "VllmConfig.num_lookahead_tokens",
                "vllm/config/vllm.py",
            ),
        )
    }
)

# Where the live side is not the allocator driven by a scenario's own steps, the
# kind of scenario says which of vLLM's parts decided its holdings.
LIVE_PARTY_BY_KIND: Mapping[str, str] = MappingProxyType(
    {"scheduler": "scheduler", "engine": "engine"}
)


@dataclass(frozen=True)
class RootCauseScenario:
    """One scenario of a group: where it is and how many of the group's records it has."""

    id: str
    file: str
    line: int | None
    records: int


@dataclass
class RootCause:
    """The records of one party, check and miss, and what they span."""

    check: str
    party: str
    miss: str
    records: int = 0
    group_types: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    scenarios: list[RootCauseScenario] = field(default_factory=list)
    # The floor rule's reason (or the check's), said once for the whole group.
    why: str = ""

    @property
    def key(self) -> str:
        """A stable name for the group: what the HTML filter and anchors use."""
        return f"{self.party}/{self.check}/{self.miss}"

    @property
    def vllm(self) -> Party:
        return PARTIES[self.party]

    @property
    def representative(self) -> RootCauseScenario:
        """The scenario with the most records of this group (the first one on a tie)."""
        return max(self.scenarios, key=lambda s: s.records)

    def sentence(self) -> str:
        """One line: the counts, who, what, and where in vLLM."""
        party = self.vllm
        scenarios = len(self.scenarios)
        return (
            f"{self.records:,} record{'s' if self.records != 1 else ''}, {scenarios} "
            f"scenario{'s' if scenarios != 1 else ''}: {party.description} "
            f"{party.function} ({party.file}) {self.miss} [{self.check}]"
        )

    def to_json(self) -> dict[str, Any]:
        party = self.vllm
        return {
            "check": self.check,
            "party": self.party,
            "miss": self.miss,
            "records": self.records,
            "group_types": list(self.group_types),
            "methods": list(self.methods),
            "scenarios": [s.id for s in self.scenarios],
            "representative": self.representative.id,
            "vllm_function": party.function,
            "vllm_file": party.file,
        }
