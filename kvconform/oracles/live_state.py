"""The live party's state, shared by its parts: what :class:`~kvconform.oracles.live.LiveAllocator`
holds of vLLM's manager and of the scenario, declared once for the parts built on it
(:mod:`.live_facts`, what it records; :mod:`.live_refusals`, whose a refusal is)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvconform.model.facts import Payload
from kvconform.model.observations import GroupInfo
from kvconform.model.scenario import Call, ModelSpec
from kvconform.oracles.vllm import Vllm


class LiveState:
    """The live party's attributes (set by ``LiveAllocator.__init__``) and the reads every
    part makes of vLLM's manager."""

    vllm: Vllm
    model: ModelSpec
    manager: Any  # vLLM's KVCacheManager
    null_block: int
    lookahead: int  # what the calls reserve with
    floor_lookahead: int  # what the drafter writes: the floor's lookahead
    # The groups (their floor rules and fixed inputs): the arithmetic a refusal is judged by.
    _groups: tuple[GroupInfo, ...]
    _requests: dict[str, Any]  # vLLM's Request of each request, by name
    _prompts: dict[str, list[int]]
    _outputs: dict[str, int]  # the next output token of each request
    _first_outputs: dict[str, int]
    _encoder_lens: dict[str, int]
    _last_calls: dict[str, Call]  # per request holding blocks, its last call
    _shares: dict[str, tuple[str, int]]  # the prefix a request may share: (source, tokens)
    _running_names: set[str]  # admitted, neither preempted nor finished
    _loaded: set[str]  # brought in by an asynchronous load, waiting to be admitted
    _ever_preempted: set[str]
    _report_full: set[str]  # kv_cache_report_mode "full"
    _skips_reading: set[str]  # skip reading the prefix cache
    # Requests finished while their last step was in flight: (request, popped blocks,
    # whether the step that returns them has begun).
    _deferred: list[tuple[str, list[Any], bool]]
    _zeroing_groups: list[int] | None  # the groups whose new blocks vLLM zeroes
    _own_pool_groups: set[int]  # groups whose blocks come from a pool of their own
    _finished: set[str]  # finished requests: vLLM's per-request state of them must go
    _finished_at_census: int  # how many had finished at the last bookkeeping scan
    _retained_hit_groups: tuple[int, ...]  # the groups that retain a longer prefix hit
    _handoff_groups: list[int]  # Mamba "align" groups handing boundary states over
    _cached_states: set[tuple[int, int, int]]  # boundary states cached when the step began
    _freed_this_step: set[int]
    _reannouncements: list[Any]  # events a prefix hit re-announced
    _stats_expected: list[int]
    _stats_reset: bool
    # What vLLM did, for check `sanity` (kvconform.model.facts): of a call, (call, fact);
    # of the step, (request, fact), the request "-" for the step as a whole.
    call_facts: list[tuple[Call, Payload]]
    step_facts: list[tuple[str, Payload]]

    def _full_sequence_must_fit(self, call: Call) -> bool:
        """What vLLM's scheduler passes at an admission: ``scheduler_reserve_full_isl``
        (the scenario's setting, vLLM's default unless stated), unless the chunk says."""
        if not call.first_chunk:
            return False
        stated = call.options.full_sequence_must_fit
        return self.model.scheduler_reserve_full_isl if stated is None else stated

    # Each live request's tables (every group) as last taken for the step's records
    # (LiveFacts._step_tables), and the requests called since, whose tables are taken
    # again from what their last call left (_tables_after).
    _census_tables: dict[str, tuple[tuple[int, ...], ...]]
    _touched: set[str]
    _read_table: Callable[[str], tuple[tuple[int, ...], ...]]

    _tables_after: dict[str, tuple[list[int], ...]]

    def _no_tables(self) -> tuple[list[int], ...]:
        return tuple([] for _ in self._groups)

    def block_ids(self, name: str) -> tuple[list[int], ...]:
        return tuple(self.manager.get_block_ids(name))

    def free_blocks(self) -> int:
        return self.vllm.free_block_count(self.manager)
