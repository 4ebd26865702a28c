"""The facade's prefix cache: the KV-cache events vLLM publishes, the hashes and stats of
prefix hits, what the pools cache, HiSparse's host residency, and the boundary states
vLLM hands a KV connector."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from kvconform.oracles.vllm.base import VllmBase
from kvconform.oracles.vllm.calls import accepts_keyword


class PrefixCachePart(VllmBase):
    """The prefix cache, its events and hand-offs."""

    def take_kv_cache_events(
        self, manager: Any, leave_out: Collection[int] = ()
    ) -> list[tuple[str, int, tuple[object, ...]]]:
        """The KV-cache events since the last call (``KVCacheManager.take_events``, drained
        as the scheduler drains them each step), as (kind, group, block hashes): kind
        ``stored``, ``removed`` or ``cleared`` (group -1, no hashes); those whose ``id`` is
        in ``leave_out`` are drained and left out."""
        return self.kv_cache_events(e for e in manager.take_events() if id(e) not in leave_out)

    def kv_cache_events(self, queued: Iterable[Any]) -> list[tuple[str, int, tuple[object, ...]]]:
        """vLLM's KV-cache events as (kind, group, block hashes): kind ``stored``,
        ``removed`` or ``cleared`` (group -1, no hashes); other events are left out."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        events: list[tuple[str, int, tuple[object, ...]]] = []
        for event in queued:
            if isinstance(event, AllBlocksCleared):
                events.append(("cleared", -1, ()))
            elif isinstance(event, (BlockStored, BlockRemoved)):
                kind = "stored" if isinstance(event, BlockStored) else "removed"
                group = -1 if event.group_idx is None else int(event.group_idx)
                events.append((kind, group, tuple(event.block_hashes)))
        return events

    def queued_kv_events(self, manager: Any) -> list[Any]:
        """The KV-cache events queued since the last ``take_events``, left in the queue."""
        return list(manager.block_pool.kv_event_queue)

    def announced_blocks(self, events: Sequence[Any]) -> list[tuple[int, tuple[object, ...]]]:
        """The ``BlockStored`` events among ``events``, as (group, block hashes)."""
        from vllm.distributed.kv_events import BlockStored

        return [
            (-1 if e.group_idx is None else int(e.group_idx), tuple(e.block_hashes))
            for e in events
            if isinstance(e, BlockStored)
        ]

    def hit_block_hashes(self, blocks: Any) -> dict[int, list[object]]:
        """Per group, the hashes a prefix hit's blocks are cached under, as KV-cache events
        carry them (None for a null column)."""
        utils = self._kv_cache_utils
        return {
            group: [
                None
                if block.block_hash is None
                else utils.maybe_convert_block_hash(utils.get_block_hash(block.block_hash))
                for block in group_blocks
            ]
            for group, group_blocks in enumerate(blocks.blocks)
        }

    def metrics_collector(self) -> Any:
        """A ``KVCacheMetricsCollector`` sampling every block, what the scheduler builds with
        ``ObservabilityConfig.kv_cache_metrics`` on and ``kv_cache_metrics_sample`` 1."""
        module = self.optional_module("vllm.v1.core.kv_cache_metrics")
        if module is None:
            raise self.missing("vllm.v1.core.kv_cache_metrics.KVCacheMetricsCollector")
        # The stats the scheduler records at each admission (0.26 on).
        if not hasattr(self._kvm.KVCacheManager, "record_prefix_cache_stats"):
            raise self.not_offered("KVCacheManager.record_prefix_cache_stats")
        return module.KVCacheMetricsCollector(1.0)

    def prefix_cache_stats(self, manager: Any) -> dict[str, Any]:
        """``make_prefix_cache_stats`` (taken and reset, as ``Scheduler.make_stats`` takes it
        each step) and the pool's ``usage``, as plain values; the metrics collector's
        eviction events are drained as ``make_stats`` drains them."""
        stats = manager.make_prefix_cache_stats()
        fields = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                  "preempted_hits", "reset")  # fmt: skip
        taken = {name: getattr(stats, name) for name in fields}
        taken["usage"] = manager.usage
        collector = getattr(manager, "metrics_collector", None)
        if collector is not None:
            collector.drain_events()  # as make_stats drains them; not judged
        return taken

    def cached_block_counts(self, manager: Any) -> dict[tuple[int, object], int]:
        """(group, block hash as the events carry it) -> the blocks the pools cache under it
        (the device pool, and a group's own pool where it has one: HiSparse's host source,
        whose events go to the device pool's queue)."""
        utils = self._kv_cache_utils
        pools = {id(manager.block_pool): manager.block_pool}
        for group in manager.coordinator.single_type_managers:
            pools.setdefault(id(group.block_pool), group.block_pool)
        counts: dict[tuple[int, object], int] = {}
        for pool in pools.values():
            cached = pool.cached_block_hash_to_block
            # By shape: to 0.33 a key maps to one block or a dict of its copies; from 0.34
            # to one block id, the ids of a key's copies kept apart (``_dup_ids``).
            copies = getattr(cached, "_dup_ids", None) or {}
            for key, blocks in cached._cache.items():
                event_key = (
                    utils.get_group_id(key),
                    utils.maybe_convert_block_hash(utils.get_block_hash(key)),
                )
                if isinstance(blocks, dict):
                    number = len(blocks)
                else:
                    number = len(copies[key]) if key in copies else 1
                counts[event_key] = counts.get(event_key, 0) + number
        return counts

    def hisparse_coordinator(self, manager: Any) -> Any | None:
        """vLLM's ``HiSparseCoordinator`` bound to the manager's HiSparse groups, built as
        ``get_hisparse_coordinator`` builds it before the first admission; None without a
        HiSparse layout. Its per-step work (``advance_scheduled``) is 0.32's."""
        config = manager.kv_cache_config
        if getattr(config, "hisparse_host_num_blocks", None) is None:
            return None
        module = self.optional_module("vllm.v1.hisparse.coordinator")
        if module is None:
            raise self.not_offered("vllm.v1.hisparse.coordinator")
        coordinator = module.get_hisparse_coordinator(manager)
        if not hasattr(coordinator, "advance_scheduled"):
            raise self.not_offered("HiSparseCoordinator.advance_scheduled")
        return coordinator

    def hisparse_step(self, coordinator: Any, scheduled: Mapping[str, tuple[int, int]]) -> None:
        """One step of HiSparse around the forward. Before it, what the HiSparse
        connector's scheduler side does once ``schedule()`` has allocated
        (``HiSparseConnectorScheduler.build_connector_meta``): the residency work of
        every scheduled request (``advance_scheduled`` with the tokens computed once the
        step completes), the page transfers, the host copies and the residency updates
        handed to the worker. After it, the worker's answer: every transfer done on its
        one worker and every host copy run (``update_spills``,
        ``release_completed_host_copies``), as vLLM's own tests answer for the worker.
        ``scheduled``: request id -> (tokens computed once the step completes, scheduled).
        """
        coordinator.advance_scheduled((rid, done) for rid, (done, _) in scheduled.items())
        command = coordinator.build_offload_command()
        copies = coordinator.take_host_block_copies()
        coordinator.take_residency_updates({rid: n for rid, (_, n) in scheduled.items()})
        transfers = getattr(command, "page_transfers", None) or ()
        counts = {transfer.transfer_id: 1 for transfer in transfers}
        coordinator.release_completed_host_copies([copy.dst_block_id for copy in copies])
        coordinator.update_spills(counts, counts)

    def retained_hit_groups(self, manager: Any) -> tuple[int, ...]:
        """The groups that keep a longer prefix hit than the others, which ``allocate_slots``
        trims to the computed tokens (``retained_hit_group_ids``, 0.30 on: HiSparse's host
        source); empty where there are none."""
        return tuple(getattr(manager, "retained_hit_group_ids", None) or ())

    def boundary_state_groups(self, manager: Any) -> list[int]:
        """The Mamba "align" groups whose cached boundary states vLLM hands a KV connector
        block by block (``KVCacheManager.take_boundary_state_offloads``, 0.29 on); empty
        where there are none or the release has no hand-off."""
        if not hasattr(manager, "take_boundary_state_offloads"):
            return []
        return [
            index
            for index, group in enumerate(manager.coordinator.single_type_managers)
            if getattr(group, "mamba_cache_mode", None) == "align"
        ]

    def boundary_states_cached(
        self, manager: Any, groups: Sequence[int]
    ) -> set[tuple[int, int, int]]:
        """(group, block id, tokens) of every block of the pool that holds the cache entry
        of a boundary state of one of ``groups`` (its primary hash, and the tokens it
        covers: ``block_hash_num_tokens``)."""
        get_group_id = self._kv_cache_utils.get_group_id
        wanted = set(groups)
        cached = set()
        for block in manager.block_pool.blocks:
            key = block.block_hash
            if key is None:
                continue
            group = get_group_id(key)
            if group in wanted:
                cached.add((group, block.block_id, block.block_hash_num_tokens))
        return cached

    def finalize_partial_tail_offers(
        self, manager: Any, request: Any
    ) -> list[tuple[int, int, int]] | None:
        """(group, block id, tokens) of the partial-tail boundary states a KV producer's
        finishing request hands its connector (``finalize_partial_tail_offloads``, which
        ``Scheduler._connector_finished`` calls before freeing); None where the release
        has no such call."""
        finalize = getattr(manager, "finalize_partial_tail_offloads", None)
        return None if finalize is None else list(finalize(request))

    def cached_key(self, manager: Any, block_id: int) -> object:
        """The prefix-cache key a block of the pool holds (None: not cached)."""
        return manager.block_pool.blocks[block_id].block_hash

    def take_boundary_state_offers(self, manager: Any) -> dict[str, list[tuple[int, int, int]]]:
        """Request id -> (group, block id, tokens) of the boundary states handed to a KV
        connector since the last call, drained as ``Scheduler.schedule`` drains them."""
        return dict(manager.take_boundary_state_offloads())

    def skips_zeroing_loaded_blocks(self, manager: Any) -> bool:
        """Whether the manager keeps the blocks an asynchronous KV load writes off its
        zeroing list (``allocate_slots(skip_zeroing_group_ids=...)``, 0.32 on); before, it
        lists them like any new block and the scheduler keeps them off the step's list."""
        return accepts_keyword(manager.allocate_slots, "skip_zeroing_group_ids")

    def hit_block_ids(self, blocks: Any) -> dict[int, list[int]]:
        """Group index -> the block ids of a prefix hit (``KVCacheBlocks``; None: no hit)."""
        groups = getattr(blocks, "blocks", None) or ()
        return {index: [block.block_id for block in group] for index, group in enumerate(groups)}

    def evictable_blocks(self, blocks: Any, null_block: int) -> int:
        """How many of a prefix hit's blocks sit in the free queue (no request holds them):
        taking them uses free blocks as a new allocation does."""
        groups = getattr(blocks, "blocks", None) or ()
        return sum(
            1
            for group in groups
            for block in group
            if block.block_id != null_block and getattr(block, "ref_cnt", 1) == 0
        )
