"""What the live party records of vLLM beside its answers: the facts (:mod:`kvconform.model.facts`)
the ``sanity`` families of :mod:`kvconform.harness.checks` judge, of a call (zeroing lists,
retained hits, lookup events) and of a step (prefix-cache stats, KV-cache events, hand-offs
to a KV connector, deferred frees, resets and evictions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.model.facts import (
    DeferredReturn,
    Eviction,
    FinalizedTails,
    InFlightPop,
    LookupEvents,
    PoolCensus,
    PrefixStats,
    ResetAnswer,
    RetainedHit,
    StepEvents,
    StepHandoffs,
    ZeroingList,
)
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.scenario import Call
from kvconform.oracles.live_state import LiveState


class LiveFacts(LiveState):
    """The live party's recording of facts, and the calls whose answers are facts only
    (an in-flight finish, a reset, an eviction)."""

    def finish_in_flight(self, name: str) -> None:
        """A request finishes while its last step is in flight (a KV consumer under
        asynchronous scheduling, ``Scheduler._free_request_blocks``): its blocks are popped
        (``pop_blocks_for_free``), still referenced, and go back to the pool only once that
        step's output is applied (``_drain_deferred_frees``), at the end of the next step.
        The popped blocks must be the ones its tables held."""
        self._note_freed(name)
        held = sorted(b for ids in self._read_table(name) for b in ids if b != self.null_block)
        self._tables_after.pop(name, None)
        popped = self.manager.pop_blocks_for_free(self._requests[name])
        ids = sorted(b.block_id for b in popped if b.block_id != self.null_block)
        self._running_names.discard(name)
        after = self._read_table(name)
        self.step_facts.append((name, InFlightPop(tuple(held), tuple(ids), after)))
        self._deferred.append((name, popped, False))
        self._finished.add(name)

    def return_deferred(self, ended_step: bool = False) -> None:
        """Return the deferred blocks whose in-flight step has completed, tail first (the
        scheduler frees them in reverse order): at the end of every step after the finish's
        step (``ended_step``), or at the run's end. Each popped block that no live request
        holds goes back to the free queue."""
        waiting: list[tuple[str, list[Any], bool]] = []
        for name, blocks, due in self._deferred:
            if ended_step and not due:
                waiting.append((name, blocks, True))
                continue
            live_ids = {
                b for other in self._running_names | self._loaded
                for ids in self._read_table(other) for b in ids
            }  # fmt: skip
            popped = {b.block_id for b in blocks if b.block_id != self.null_block}
            self._last_calls.pop(name, None)  # held, by the scenario, until now
            before = self.free_blocks()
            self.manager.block_pool.free_blocks(reversed(blocks))
            returned = self.free_blocks() - before
            self.step_facts.append(
                (
                    name,
                    DeferredReturn(
                        len(blocks),
                        tuple(sorted(popped)),
                        tuple(sorted(popped & live_ids)),
                        returned,
                    ),
                )
            )
        self._deferred = waiting

    def reset_prefix_cache(self, stated: bool) -> None:
        """``KVCacheManager.reset_prefix_cache`` between steps (an RLHF weight update, the
        ``/reset_prefix_cache`` endpoint): it must answer as ``stated`` (derived by hand: it
        succeeds only when no request holds a block), and a reset leaves nothing cached."""
        answer = bool(self.manager.reset_prefix_cache())
        if answer:
            self._stats_reset = True
        still = sum(self.vllm.cached_block_counts(self.manager).values()) if answer else 0
        self.step_facts.append(
            ("-", ResetAnswer(stated, answer, still, self.free_blocks(), self.model.num_blocks))
        )

    def evict_cached(self, columns: Sequence[tuple[str, int]], where: Location) -> None:
        """``KVCacheManager.evict_blocks`` of the blocks a KV connector reported invalid
        (``Scheduler._handle_invalid_blocks``): the blocks at these columns of the requests'
        group-0 tables leave the prefix cache; a request that holds one keeps it."""
        tables = {name: self.block_ids(name)[0] for name, _ in columns}
        chosen: set[int] = set()
        for name, column in columns:
            table = tables[name]
            if column >= len(table) or table[column] == self.null_block:
                raise ScenarioError(
                    where,
                    f"column {column} of request {name!r}'s group-0 table holds no block "
                    f"(the table is {table}); a connector reports blocks the request holds",
                )
            chosen.add(table[column])
        self.manager.evict_blocks(chosen)
        kept = sorted(b for b in chosen if self.vllm.block_is_cached(self.manager, b))
        self.step_facts.append(
            (", ".join(sorted(tables)), Eviction(tuple(sorted(chosen)), tuple(kept)))
        )

    def _record_census(self) -> None:
        """The pool after the step, for the conservation and bookkeeping families: the
        free count, the live tables of the device pool's groups, the blocks still
        deferred, their references, the live requests and vLLM's per-request state."""
        own_pool = self._own_pool_groups
        null = self.null_block
        now = self._step_tables()
        tables = (
            {
                name: tuple(() if group in own_pool else ids for group, ids in enumerate(table))
                for name, table in sorted(now.items())
            }
            if own_pool
            else dict(sorted(now.items()))
        )
        deferred = tuple(
            b.block_id for _, blocks, _ in self._deferred for b in blocks if b.block_id != null
        )
        held = {b for table in tables.values() for ids in table for b in ids if b != null}
        refs, hashed = self.vllm.block_refs(self.manager, held | set(deferred))
        self.step_facts.append(
            (
                "-",
                PoolCensus(
                    self.free_blocks(),
                    self.vllm.pool_size(self.manager),
                    tables,
                    deferred,
                    refs,
                    hashed,
                    frozenset(self._requests.keys() - self._finished),
                    self._bookkeeping(),
                ),
            )
        )

    def _step_tables(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Each live request's tables at the end of the step, for the step's records (the
        hand-offs, the census), read from vLLM once per call: a table changes only by its
        own request's calls, so a request the step called holds what its last call left
        (``schedule`` reads it right after the call, ``table_after_call``), and one it did
        not call what was last read. A table changed by another request's call, or after
        the call, still shows: the census reads the free count and the reference count of
        every held block anew, and a block taken or dropped behind a table's back moves
        them (docs/contract.md, "Conservation")."""
        live = self._running_names | self._loaded
        known = self._census_tables
        touched = self._touched
        if touched:
            after = self._tables_after
            for name in touched:
                table = after.get(name)
                if table is None:  # granted where refused, or gone since: read below
                    known.pop(name, None)
                else:
                    known[name] = tuple(map(tuple, table))
            touched.clear()
        if not live.issuperset(known):
            for name in [name for name in known if name not in live]:
                del known[name]
        if len(known) != len(live):
            read = self._read_table
            for name in live:
                if name not in known:
                    known[name] = read(name)
        return known

    def _bookkeeping(self) -> dict[str, frozenset[str]]:
        """vLLM's per-request state, read only after a request ended since the last census
        (what must be dropped is dropped then, or stays): the scan costs a step's time."""
        if len(self._finished) == self._finished_at_census:
            return {}
        self._finished_at_census = len(self._finished)
        return self.vllm.request_keyed_state(self.manager, self._requests.keys())

    def _record_stats(self) -> None:
        """The step's ``make_prefix_cache_stats`` and ``usage``, with what its admissions
        looked up (new and preempted requests apart) and the blocks the live requests'
        tables hold (null block and a group's own pool left out)."""
        stats = self.vllm.prefix_cache_stats(self.manager)
        own_pool = {g for g, info in enumerate(self._groups) if GROUP_TYPES[info.type].own_pool}
        held = {
            block
            for name in self._running_names | self._loaded
            for group, ids in enumerate(self._read_table(name))
            if group not in own_pool
            for block in ids
            if block != self.null_block
        }
        # Blocks popped at an in-flight finish are still taken until they go back.
        held |= {b.block_id for _, blocks, _ in self._deferred for b in blocks}
        held.discard(self.null_block)
        self.step_facts.append(
            (
                "-",
                PrefixStats(
                    stats,
                    tuple(self._stats_expected),
                    self._stats_reset,
                    len(held),
                    self.model.num_blocks,
                ),
            )
        )
        self._stats_expected = [0] * 6
        self._stats_reset = False

    def _record_kv_events(self) -> None:
        """The step's KV-cache events (a lookup's re-announcements left out) and what the
        pools cache at its end (judged by :mod:`kvconform.harness.checks.kv_events`)."""
        events = self.vllm.take_kv_cache_events(
            self.manager, leave_out={id(e) for e in self._reannouncements}
        )
        self._reannouncements.clear()
        cached = self.vllm.cached_block_counts(self.manager)
        self.step_facts.append(("-", StepEvents(tuple(events), cached)))

    def _record_handoffs(self) -> None:
        """The boundary states handed to a KV connector in the step, and what the step
        cached (judged by :mod:`kvconform.harness.checks.handoffs`)."""
        offers = self.vllm.take_boundary_state_offers(self.manager)
        offered_keys = tuple(
            self.vllm.cached_key(self.manager, block)
            for states in offers.values()
            for _, block, _ in states
        )
        after = self.vllm.boundary_states_cached(self.manager, self._handoff_groups)
        tables = dict(self._step_tables())
        self.step_facts.append(
            (
                "-",
                StepHandoffs(
                    tuple(self._handoff_groups),
                    frozenset(self._cached_states),
                    frozenset(after),
                    {name: tuple(states) for name, states in offers.items()},
                    offered_keys,
                    tables,
                    frozenset(self._freed_this_step),
                ),
            )
        )

    def _record_admission(self, call: Call, hit: int) -> None:
        """What ``Scheduler.schedule`` does once it admits a request whose prefix cache it
        looked up: ``record_prefix_cache_stats(request, hit)``; and what the step's stats
        must then count, from the scenario (its prompt and outputs, whether it was
        preempted before)."""
        request = self._requests[call.request]
        self.manager.record_prefix_cache_stats(request, hit)
        # A request that skips reading the prefix cache looked nothing up: not counted.
        if self.model.enable_caching and call.request not in self._skips_reading:
            tokens = len(self._prompts[call.request]) + (
                self._outputs[call.request] - self._first_outputs[call.request]
            )
            at = 3 if call.request in self._ever_preempted else 0
            for offset, value in enumerate((1, tokens, hit)):
                self._stats_expected[at + offset] += value

    def _record_zeroing(
        self,
        call: Call,
        before: tuple[list[int], ...],
        after: tuple[list[int], ...],
        hit_blocks: Any,
        valid_tokens: int,
    ) -> None:
        """The blocks vLLM hands the worker to zero, per recording group, with what holds
        valid KV: a prefix hit's blocks and, under an asynchronous load, those holding
        loaded tokens (the scheduler's ``skip_zeroing_group_ids``, in releases that have
        it); judged by :mod:`kvconform.harness.checks.zeroing`."""
        assert self._zeroing_groups is not None
        zeroed = self.vllm.take_blocks_to_zero(self.manager, self._zeroing_groups)
        hits = self.vllm.hit_block_ids(hit_blocks)
        loaded = bool(
            call.options.load_async and self.vllm.skips_zeroing_loaded_blocks(self.manager)
        )
        for group, recorded in zeroed.items():
            self.call_facts.append(
                (
                    call,
                    ZeroingList(
                        group,
                        self.model.groups[group].block_size,
                        tuple(before[group]),
                        tuple(after[group]),
                        tuple(recorded),
                        tuple(hits.get(group, ())),
                        loaded,
                        valid_tokens,
                    ),
                )
            )

    def _record_retained_hit(
        self, call: Call, after: tuple[list[int], ...], hit_blocks: Any, covered: int
    ) -> None:
        """What a group that keeps a longer prefix hit than the others (HiSparse's host
        source, ``retains_longer_hit``) adopted of it: the hit, the tokens the request now
        has computed (its local hit and the connector's), its table after the call
        (judged by :mod:`kvconform.harness.checks.allocator`)."""
        hits = self.vllm.hit_block_ids(hit_blocks)
        tokens = min(covered, self.model.max_model_len)
        for group in self._retained_hit_groups:
            self.call_facts.append(
                (
                    call,
                    RetainedHit(
                        group,
                        self.model.groups[group].block_size,
                        tuple(hits.get(group, [])),
                        tokens,
                        tuple(after[group]),
                    ),
                )
            )

    def _record_lookup_events(self, call: Call, blocks: Any, hit: int, queued: int) -> None:
        """The events a prefix-cache lookup queued, and, where the request asks for
        ``kv_cache_report_mode`` "full" and got a hit, the hashes its hit's blocks are
        cached under (judged by :mod:`kvconform.harness.checks.kv_events`)."""
        emitted = self.vllm.queued_kv_events(self.manager)[queued:]
        self._reannouncements.extend(emitted)
        said = self.vllm.announced_blocks(emitted)
        reused = (
            {group: tuple(hashes) for group, hashes in self.vllm.hit_block_hashes(blocks).items()}
            if hit and call.request in self._report_full
            else None
        )
        self.call_facts.append((call, LookupEvents(hit, tuple(said), len(emitted), reused)))

    def _note_freed(self, name: str) -> None:
        if self._handoff_groups:
            self._freed_this_step.update(b for ids in self._read_table(name) for b in ids)

    def _record_finalized_tails(self, name: str) -> None:
        """The partial-tail boundary states a finishing request hands its connector
        (``finalize_partial_tail_offloads``), with the states cached in its tables and
        their cache keys (judged by :mod:`kvconform.harness.checks.handoffs`)."""
        request = self._requests[name]
        offers = self.vllm.finalize_partial_tail_offers(self.manager, request)
        if offers is None:
            return
        table = self._read_table(name)
        cached = tuple(
            state
            for state in self.vllm.boundary_states_cached(self.manager, self._handoff_groups)
            if state[1] in table[state[0]]
        )
        key = self.vllm.cached_key
        self.step_facts.append(
            (
                name,
                FinalizedTails(
                    tuple(offers),
                    table,
                    int(request.num_computed_tokens),
                    cached,
                    {block: key(self.manager, block) for _, block, _ in cached},
                    tuple(key(self.manager, block) for _, block, _ in offers),
                ),
            )
        )
