"""What a ``schedule()`` call finds in vLLM's queues, for the liveness and fairness families:
the budgets ``Scheduler.schedule`` admits by, the requests it counts for the long-prefill
cap, a drafter's prefill shift, what the prefix cache holds for a request, the facts that
decide whether the coming step may pass a request over without breaking its policy (the
rule is the model's), the multimodal input a request waits at and the encoder's room, and
whether vLLM defers a request's free. Read from vLLM's
objects as each release has them; judged in ``kvconform.harness.checks.liveness`` and
``fairness``. The base of :class:`~kvconform.oracles.vllm.scheduling.Scheduling`.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from kvconform.model.queue_facts import HoldFacts, first_input_ahead
from kvconform.oracles.vllm.scheduling_config import SchedulingConfigs

__all__ = ["SchedulingQueues"]


class SchedulingQueues(SchedulingConfigs):
    """vLLM's queues and budgets as a ``schedule()`` call finds them."""

    def status_name(self, request: Any) -> str:
        status = request.status
        return str(getattr(status, "name", status))

    def scheduling_limits(self, scheduler: Any, config: Any) -> tuple[int, int, int, int]:
        """(the token budget ``max_num_scheduled_tokens``, the input budget
        ``max_num_batched_tokens``, the draft slots each scheduled request takes of the
        latter, the requests that may run at once): what ``Scheduler.schedule`` admits by.
        Releases before the split budgets have one budget and no draft slots."""
        sched_config = config.scheduler_config
        input_budget = int(sched_config.max_num_batched_tokens)
        token_budget = int(getattr(scheduler, "max_num_scheduled_tokens", None) or input_budget)
        spec = config.speculative_config
        draft_slots = int(getattr(spec, "max_num_new_slots_for_drafting", 0) or 0) if spec else 0
        if not hasattr(scheduler, "max_num_scheduled_tokens"):
            draft_slots = 0
        seats = getattr(scheduler, "max_num_active_reqs", None)
        if seats is None:
            seats = scheduler.max_num_running_reqs
        return token_budget, input_budget, draft_slots, int(seats)

    def eligible_requests(self, scheduler: Any) -> int:
        """The requests running or waiting, as ``Scheduler.schedule`` counts them for the
        long-prefill cap (``get_request_counts``; releases without it: every request the
        scheduler holds)."""
        counts = getattr(scheduler, "get_request_counts", None)
        if counts is None:
            return len(scheduler.requests)
        running, waiting = counts()
        return int(running) + int(waiting)

    def long_prefill_cap(self, scheduler: Any, config: Any) -> int:
        """The long-prefill threshold ``Scheduler.schedule`` caps a chunk at in the coming
        call, 0 for none: the configured one; from 0.31.0 (which added
        ``adaptive_long_prefill_threshold``) lifted with one request running or waiting
        ("there is nobody to starve") and, adaptive, floored at ``max_num_batched_tokens``
        over the requests eligible; before 0.31.0 applied to a lone request too. Without
        chunked prefill none where the release gates the threshold on it
        (:meth:`threshold_needs_chunked_prefill`); up to 0.33.0 it applies there too."""
        sched_config = config.scheduler_config
        threshold = int(sched_config.long_prefill_token_threshold or 0)
        if (
            threshold
            # SchedulerConfig's default where a stand-in config has none: enabled.
            and not getattr(sched_config, "enable_chunked_prefill", True)
            and self.threshold_needs_chunked_prefill(scheduler)
        ):
            return 0
        if not threshold or not hasattr(scheduler, "adaptive_long_prefill_threshold"):
            return threshold
        eligible = self.eligible_requests(scheduler)
        if eligible <= 1:
            return 0
        if scheduler.adaptive_long_prefill_threshold:
            threshold = max(threshold, int(sched_config.max_num_batched_tokens) // eligible)
        return threshold

    def threshold_needs_chunked_prefill(self, scheduler: Any) -> bool:
        """Whether ``Scheduler.schedule`` applies ``long_prefill_token_threshold`` only with
        chunked prefill. vLLM 0.34.0 gates the cap it computes once a call on it
        (``self.scheduler_config.enable_chunked_prefill and num_eligible_reqs > 1``). Up to
        0.33.0 nothing does: ``SchedulerConfig`` accepts a threshold with chunked prefill
        off, and both the running loop and the waiting loop cut a chunk to it, so a prompt
        is split although chunked prefill is disabled (the waiting loop's "If
        chunked_prefill is disabled, we can stop the scheduling here" only refuses a chunk
        past the budget; vllm#39608 proposes the guard). Read from the source of the
        ``schedule`` methods of the scheduler's class, where the gate is written."""
        return _gates_threshold_on_chunked_prefill(scheduler.__class__)

    def mamba_aligned_chunk(self, scheduler: Any, request: Any, tokens: int, start: int) -> int:
        """The chunk of ``tokens`` from ``start`` that ``Scheduler.schedule`` keeps after
        Mamba "align"'s split (``_mamba_block_aligned_split``: chunk ends on block
        boundaries and checkpoint positions; a chunk that starts mid-block stops at the
        block's end, even one that would finish the prompt), ``tokens`` where the scheduler
        does not split. ``start`` past the request's computed tokens is what a waiting
        request would adopt (its prefix-cache hit). The method only reads the scheduler's
        and the request's state; its signature is the same on every release that has it
        (0.28.0 on)."""
        if not getattr(scheduler, "need_mamba_block_aligned_split", False):
            return tokens
        adopted = start - int(request.num_computed_tokens)
        return int(scheduler._mamba_block_aligned_split(request, tokens, adopted))

    def prefill_chunk_cap(self, scheduler: Any, config: Any, request: Any, computed: int) -> int:
        """The chunk ``Scheduler.schedule`` gives ``request`` (at ``computed``) with the whole
        budget free, before ``_reserve_prefill_lookahead``: its token budget
        (``min(max_num_scheduled_tokens, max_num_batched_tokens - draft slots)``), the
        long-prefill threshold where one is in force (:meth:`long_prefill_cap`), then Mamba
        "align"'s block-aligned split of that chunk, which vLLM applies before the
        reservation. What ``lookahead_cuts_to_nothing`` (``kvconform.model.queue_facts``)
        takes as ``cap``, for the stall's cause and for ``HoldFacts.chunk_cap`` alike."""
        chunk = self.unsplit_chunk(scheduler, config, request, computed)
        return self.mamba_aligned_chunk(scheduler, request, chunk, computed)

    def unsplit_chunk(self, scheduler: Any, config: Any, request: Any, computed: int) -> int:
        """:meth:`prefill_chunk_cap` before Mamba "align"'s split: the request's token
        budget, the long-prefill threshold in force, and the tokens it has left."""
        token_budget, input_budget, draft_slots, _ = self.scheduling_limits(scheduler, config)
        cap = min(token_budget, input_budget - draft_slots)
        threshold = self.long_prefill_cap(scheduler, config)
        if threshold:
            cap = min(cap, threshold)
        # request.num_tokens, as the method reads it: the prompt, and the outputs of a
        # request resumed after preemption.
        left = int(request.num_tokens) - computed
        return min(cap, left)

    def mamba_split_limits(self, scheduler: Any, config: Any) -> tuple[int, int] | None:
        """(the Mamba block, the split's limit) that ``_mamba_block_aligned_split`` reads, None
        where the scheduler does not split (``need_mamba_block_aligned_split``): the block is
        ``cache_config.block_size`` (align mode sets the Mamba block to the attention
        block), the limit ``max_num_scheduled_tokens``, or the configured
        ``long_prefill_token_threshold`` where one below it is set (the configured one,
        whatever the count of requests: the method reads the config, not the cap in
        force). The same on every release that has the method (0.28.0 on)."""
        if not getattr(scheduler, "need_mamba_block_aligned_split", False):
            return None
        token_budget, _, _, _ = self.scheduling_limits(scheduler, config)
        limit = token_budget
        # The scheduler's own configs, as the method reads them (self.cache_config, ...).
        threshold = int(scheduler.scheduler_config.long_prefill_token_threshold or 0)
        if threshold > 0:
            limit = min(limit, threshold)
        return int(scheduler.cache_config.block_size), limit

    def prefill_end(self, request: Any) -> int:
        """Where ``_mamba_block_aligned_split`` takes the prefill to end: the prompt, or the
        tokens but the last of a request resumed with outputs to replay."""
        return max(int(request.num_prompt_tokens), int(request.num_tokens) - 1)

    def prefill_shift(self, scheduler: Any) -> int:
        """The tokens a drafter reads past a prefill chunk, which
        ``_try_schedule_encoder_inputs`` takes as ``shift_computed_tokens``
        (``Scheduler.num_prefill_lookahead``: 1 for the EAGLE family, k for multi-module
        MTP; set on the scheduler from 0.28.0, before ``VllmConfig`` had
        ``num_prefill_lookahead_tokens`` in 0.31.0); 0 without a drafter."""
        return int(getattr(scheduler, "num_prefill_lookahead", 0) or 0)

    def cached_tokens(self, manager: Any, request: Any) -> int:
        """The request's tokens the prefix cache holds, the last one left out, as its
        admission would find them (``KVCacheManager.get_num_cached_tokens``: a probe that
        takes no references and emits nothing); 0 where the release has no such probe."""
        probe = getattr(manager, "get_num_cached_tokens", None)
        return int(probe(request)) if probe is not None else 0

    def hold_facts(self, scheduler: Any, request: Any, running: bool) -> HoldFacts:
        """What decides whether ``Scheduler.schedule`` may pass this request over in the
        coming step, read from the request's and the scheduler's state as this release has
        them (attributes a release lacks read as their defaults: nothing holds). Facts only:
        the reason is the model's (``kvconform.model.queue_facts.held_back``; the list and
        why each is legitimate: docs/contract.md, "Liveness and fairness"). Two are vLLM's
        own tests, recorded as booleans: ``_decode_deferred`` (the step numbering of the
        decode cadence) and ``_encoder_ahead`` (the placeholders' positions and an
        encoder-cache connector); the chunk cap is read only where the rule
        may weigh it (a running prefill chunk under a lookahead above 1), and what Mamba
        "align"'s split decides a running request's chunk by only under the split (the rule
        excuses a waiting request the split holds as recorded: its start is the hit the
        waiting loop looks up)."""
        max_tokens = getattr(request, "max_tokens", None)
        max_model_len = getattr(scheduler, "max_model_len", None)
        mamba_split = bool(getattr(scheduler, "need_mamba_block_aligned_split", False))
        prefill_chunk = bool(getattr(request, "is_prefill_chunk", False))
        lookahead = self.prefill_shift(scheduler)
        computed = int(request.num_computed_tokens)
        chunk_cap = 0
        if running and prefill_chunk and lookahead > 1:
            chunk_cap = self.prefill_chunk_cap(scheduler, scheduler.vllm_config, request, computed)
        split_chunk = prefill_end = mamba_block = split_limit = 0
        limits = self.mamba_split_limits(scheduler, scheduler.vllm_config) if running else None
        if limits is not None:
            mamba_block, split_limit = limits
            prefill_end = self.prefill_end(request)
            split_chunk = self.unsplit_chunk(scheduler, scheduler.vllm_config, request, computed)
        return HoldFacts(
            running=running,
            status=self.status_name(request),
            lora=getattr(request, "lora_request", None) is not None,
            mamba_split=mamba_split,
            stale_output=int(getattr(request, "num_stale_output_tokens", 0) or 0),
            kv_transfer=bool(getattr(request, "kv_transfer_params", None)),
            cache_aware_window=int(getattr(scheduler, "cache_aware_window", 0) or 0),
            placeholders=int(getattr(request, "num_output_placeholders", 0) or 0),
            known=int(getattr(request, "num_tokens_with_spec", request.num_tokens)),
            max_tokens=None if max_tokens is None else int(max_tokens),
            decode_deferred=_decode_deferred(scheduler, request),
            prefill_chunk=prefill_chunk,
            prefill_interval=int(getattr(scheduler, "local_prefill_interval", 1)),
            lookahead=lookahead,
            chunk_cap=chunk_cap,
            split_chunk=split_chunk,
            prefill_end=prefill_end,
            mamba_block=mamba_block,
            split_limit=split_limit,
            sampled=int(getattr(scheduler, "num_sampled_tokens_per_step", 1) or 1),
            max_model_len=None if max_model_len is None else int(max_model_len),
            encoder_ahead=bool(getattr(request, "has_encoder_inputs", False))
            and _encoder_ahead(scheduler, request),
        )

    def pending_input(self, scheduler: Any, request: Any) -> tuple[int, int, int, bool] | None:
        """(offset, length, embeddings, already in the encoder cache) of the first
        multimodal input ``request`` has not computed past
        (``kvconform.model.queue_facts.first_input_ahead``: the drafter's prefill shift
        moves only the end of the window ``_try_schedule_encoder_inputs`` weighs, never its
        start): the input that call weighs first in the coming step (the embeddings are
        what ``can_allocate`` asks of the encoder budget and cache,
        ``Request.get_num_encoder_embeds``; a cached one needs no room,
        ``check_and_update_cache``). None where there is none, or where the answer is not
        the cache's: an encoder-cache connector (``ec_connector``), an encoder-decoder model
        (no encoder cache, ``is_encoder_decoder``)."""
        if getattr(scheduler, "ec_connector", None) is not None:
            return None
        if getattr(scheduler, "is_encoder_decoder", False):
            return None
        positions = _positions(request)
        if positions is None:
            return None
        index = first_input_ahead(
            [(int(p.offset), int(p.length)) for p in positions],
            int(request.num_computed_tokens),
        )
        if index is None:
            return None
        position = positions[index]
        embeds = getattr(position, "get_num_embeds", None)
        length = int(position.length)
        count = int(embeds() if callable(embeds) else embeds if embeds is not None else length)
        cache = getattr(scheduler, "encoder_cache_manager", None)
        cached = getattr(cache, "cached", None) or {}
        identifier = getattr(request.mm_features[index], "identifier", None)
        return int(position.offset), length, count, identifier in cached

    def encoder_room(self, scheduler: Any) -> tuple[int, int]:
        """(the encoder budget of a ``schedule()`` call, ``max_num_encoder_input_tokens``;
        the embeddings the encoder cache can take now, ``num_freeable_slots``: its free
        slots and those of entries no live request references, which ``can_allocate``
        evicts). (0, 0) where the scheduler has no encoder cache."""
        cache = getattr(scheduler, "encoder_cache_manager", None)
        if cache is None:
            return 0, 0
        budget = int(getattr(scheduler, "max_num_encoder_input_tokens", 0) or 0)
        return budget, int(getattr(cache, "num_freeable_slots", 0) or 0)

    def frees_deferred(self, scheduler: Any, request: Any) -> bool:
        """Whether ``Scheduler.schedule`` may not preempt this running request in the coming
        call: with an asynchronous KV consumer and more than one batch in flight
        (``Scheduler.defer_block_free``), the blocks of a request whose last step is still
        in flight are freed only once that step is processed, and the preemption loop gives
        up the call rather than preempt it ("A deferred free will not help with immediate
        allocation", ``_request_blocks_can_be_freed``). Releases without deferred frees:
        False."""
        can_be_freed = getattr(scheduler, "_request_blocks_can_be_freed", None)
        if can_be_freed is None or not getattr(scheduler, "defer_block_free", False):
            return False
        return not can_be_freed(request)

    def in_flight_tokens(self, request: Any) -> int:
        """The request's tokens scheduled but not yet processed (``Request.num_in_flight_tokens``,
        0.28.0-0.34.0; 0 where a release has none): ``KVCacheManager.allocate_slots`` frees a
        window's skipped blocks on the processed basis, ``num_computed_tokens`` less these,
        because the steps in flight still read below the optimistic boundary."""
        return int(getattr(request, "num_in_flight_tokens", 0) or 0)

    def deferred_block_ids(self, scheduler: Any) -> frozenset[int]:
        """The blocks the scheduler holds back for a deferred free before a ``schedule()``
        call (``Scheduler.deferred_frees``: the tables of requests finished, aborted or
        preempted with a step in flight that may still write them, and copy-on-write
        retentions): none is free until ``_drain_deferred_frees`` returns it, once that step's
        output is processed, and no preemption frees it sooner. Releases without deferred
        frees: none."""
        pending = getattr(scheduler, "deferred_frees", None) or ()
        return frozenset(int(block.block_id) for _, blocks in pending for block in blocks)


def _decode_deferred(scheduler: Any, request: Any) -> bool:
    """The request may not decode in the coming step (pipeline parallelism with async
    scheduling: ``Request.next_decode_eligible_step``)."""
    eligible = getattr(request, "next_decode_eligible_step", None)
    current = getattr(scheduler, "current_step", None)
    return eligible is not None and current is not None and current + 1 < eligible


def _positions(request: Any) -> list[Any] | None:
    """The placeholder ranges (``mm_position``) of ``request``'s multimodal inputs, in
    prompt order; None where one has none to read."""
    positions = []
    for feature in getattr(request, "mm_features", None) or ():
        position = getattr(feature, "mm_position", None)
        if position is None:
            return None
        positions.append(position)
    return positions


def _encoder_ahead(scheduler: Any, request: Any) -> bool:
    """The request has a multimodal placeholder it has not computed past
    (``kvconform.model.queue_facts.first_input_ahead``), or an encoder-cache connector
    decides for it: only then can the encoder budget or cache cut its tokens to 0."""
    if getattr(scheduler, "ec_connector", None) is not None:
        return True
    positions = _positions(request)
    if positions is None:
        return True
    inputs = [(int(p.offset), int(p.length)) for p in positions]
    return first_input_ahead(inputs, int(request.num_computed_tokens)) is not None


# The guard vLLM 0.34.0 writes in Scheduler.schedule; up to 0.33.0 it is absent.
_THRESHOLD_GATE = re.compile(r"enable_chunked_prefill\s+and\s+num_eligible_reqs")


@functools.cache
def _gates_threshold_on_chunked_prefill(scheduler_class: type) -> bool:
    """Whether a ``schedule`` method of ``scheduler_class`` or its bases gates the
    long-prefill threshold on chunked prefill (:data:`_THRESHOLD_GATE`). A source that
    cannot be read counts as no gate: the threshold applied, as every release before
    0.34.0 applies it."""
    for klass in scheduler_class.__mro__:
        schedule = klass.__dict__.get("schedule")
        if schedule is None:
            continue
        try:
            source = inspect.getsource(schedule)
        except (OSError, TypeError):
            continue
        if _THRESHOLD_GATE.search(source):
            return True
    return False
