"""Scheduler mode's part of the facade: vLLM's configs, its ``Scheduler`` and model outputs.

:mod:`kvconform.oracles.scheduler` (and startup mode, for its configuration) uses it. It
builds what an engine would hand its scheduler (a ``ModelConfig`` from a local config-only
folder, a full ``SpeculativeConfig``, the ``VllmConfig`` with the pool size the engine would
set after profiling), the scheduler class the config picks (those in
:mod:`.scheduling_config`), and the model-runner outputs the scheduler reads back. Release differences handled here: the V2 model
runner switch, ``resolve_kv_cache_block_sizes``, ``max_concurrent_batches``,
0.33's ``skip_drafts`` and dynamic draft counts.

Remote prefill (P/D disaggregation, a decode instance): the configuration carries
vLLM's own ``NixlConnector`` as a ``kv_consumer``; its scheduler side runs without
a worker, as in vLLM's own connector unit tests (``tests/v1/kv_connector/unit``):
a request whose ``kv_transfer_params`` say ``do_remote_prefill`` gets its prompt's
KV loaded asynchronously (``WAITING_FOR_REMOTE_KVS``), and the fabricated model
output reports the transfer received (``KVConnectorOutput.finished_recving``).
A scenario may instead name a connector every request goes through
(``scheduler.kv_connector``): ``decode_bench``, vLLM's ``DecodeBenchConnector``, loads a
new request's prompt synchronously and tells the worker so in the output's
``kv_connector_metadata``; it needs no worker's answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from kvconform.model.facts import ENCODER_HELD_BACK
from kvconform.oracles.vllm.calls import call, quiet_logs
from kvconform.oracles.vllm.scheduling_config import SchedulingConfigs

__all__ = ["Scheduling"]


class Scheduling(SchedulingConfigs):
    """vLLM's scheduling classes for one loaded vLLM: ``vllm.part(Scheduling)``; its
    configuration and scheduler are built by :class:`SchedulingConfigs`."""

    def finished_spec_decode_metrics(self, engine_core_outputs: Any) -> dict[str, Any]:
        """The ``RequestSpecDecodeMetrics`` of the requests an ``update_from_output`` finished
        (``EngineCoreOutput.spec_decode_metrics``, set at the finish only), by request id."""
        found = {}
        for outputs in (engine_core_outputs or {}).values():
            for output in getattr(outputs, "outputs", ()) or ():
                metrics = getattr(output, "spec_decode_metrics", None)
                if metrics is not None:
                    found[output.request_id] = metrics
        return found

    def observe_published_events(self, scheduler: Any) -> list[Any]:
        """The KV-cache events the scheduler publishes (``update_from_output`` hands each
        step's batch to its ``kv_event_publisher``), appended to the list returned as they
        are published. The publisher's ``publish`` is wrapped on the instance to see the
        batch; the wrapper hands it on unchanged."""
        published: list[Any] = []
        publisher = getattr(scheduler, "kv_event_publisher", None)
        if publisher is None:
            raise self._vllm.not_offered("Scheduler.kv_event_publisher")
        publish = publisher.publish

        def observed(batch: Any) -> Any:
            published.extend(batch.events)
            return publish(batch)

        publisher.publish = observed
        return published

    def block_copies(self, scheduler_output: Any) -> list[tuple[int, int]]:
        """The copy-on-write block copies a step hands the worker, (source, destination)
        block ids (``SchedulerOutput.kv_cache_block_copies``; none before 0.33)."""
        copies = getattr(scheduler_output, "kv_cache_block_copies", None) or ()
        return [(int(c.src_block_id), int(c.dst_block_id)) for c in copies]

    def scheduled_drafts(self, scheduler_output: Any) -> dict[str, list[int]]:
        return dict(scheduler_output.scheduled_spec_decode_tokens or {})

    def skips_drafts(self, scheduler_output: Any) -> bool:
        """Whether the model runner proposes no drafts after this step (0.33's ``skip_drafts``)."""
        return bool(getattr(scheduler_output, "skip_drafts", False))

    def drafts_per_step(self, scheduler_output: Any, num_speculative_tokens: int) -> int:
        """How many drafts the drafter proposes after this step (dynamic speculation aware)."""
        return int(getattr(scheduler_output, "num_spec_tokens_to_schedule", 0) or 0) or (
            num_speculative_tokens
        )

    def model_runner_output(
        self,
        req_ids: list[str],
        sampled: list[list[int]],
        finished_recving: set[str] | None = None,
        failed_recving: set[str] | None = None,
        invalid_block_ids: set[int] | None = None,
    ) -> Any:
        """What the runner returns; ``finished_recving``: KV transfers it received this step;
        ``failed_recving``: those of them that failed as a whole; ``invalid_block_ids``: blocks
        a transfer left unwritten (what the worker's connector reports)."""
        connector_output = (
            call(
                self._scheduling.KVConnectorOutput,
                finished_recving=set(finished_recving),
                failed_recving=set(failed_recving or ()),
                invalid_block_ids=set(invalid_block_ids or ()),
            )
            if finished_recving
            else None
        )
        return call(
            self._scheduling.ModelRunnerOutput,
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=connector_output,
        )

    def remote_prefill_params(self, request_id: str, prompt_len: int, block_size: int) -> dict:
        """``kv_transfer_params`` of a request prefilled on a remote instance.

        The fields the router hands a decode instance, as vLLM's connector unit
        tests build them (``create_request(do_remote_prefill=True)``): the remote
        engine, its request and the blocks holding the prompt's KV there.
        """
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": "kvconform-prefill",
            "remote_request_id": f"prefill-{request_id}",
            "remote_block_ids": list(range(-(-prompt_len // block_size))),
            "remote_host": "localhost",
            "remote_port": 1234,
            "tp_size": 1,
        }

    def reports_failed_loads(self) -> bool:
        """Whether the worker can report a whole KV load failed (``failed_recving``, 0.30 on)."""
        import dataclasses

        output = self._scheduling.KVConnectorOutput
        fields = (
            {f.name for f in dataclasses.fields(output)}
            if dataclasses.is_dataclass(output)
            else set()
        )
        return "failed_recving" in fields

    def reset_prefix_cache(self, scheduler: Any, running: bool, connector: bool = False) -> bool:
        """``Scheduler.reset_prefix_cache``: what an RLHF weight update or the admin endpoint
        calls; with ``running`` it preempts the running requests first; with ``connector`` it
        resets the KV connector's cache too (``reset_connector_cache``)."""
        extra = {"reset_connector": True} if connector else {}
        return bool(scheduler.reset_prefix_cache(reset_running_requests=running, **extra))

    def watch_connector_lookups(self, scheduler: Any) -> dict[str, int]:
        """Per request, the local hit ``Scheduler.schedule`` last showed its KV connector
        (``get_num_new_matched_tokens(request, num_computed_tokens)``), kept up to date in
        the dict returned; empty for a scheduler with no connector.

        For an admission that begins a load it is the local hit the scheduler adopts: the
        hit cut to its block grid, whose sub-block tail a load supersedes (a load past a
        tail would need no copy-on-write); replay trimming and caps change the loaded
        tokens, not the hit. The blocks do not tell it: a chunked-local or sliding-window
        hit holds null columns whether or not anything is cached, and a load's skipped
        positions leave null columns too.
        """
        seen: dict[str, int] = {}
        connector = getattr(scheduler, "connector", None)
        if connector is None:
            return seen
        ask = connector.get_num_new_matched_tokens

        def recorded(request: Any, num_computed_tokens: int) -> Any:
            seen[request.request_id] = int(num_computed_tokens)
            return ask(request, num_computed_tokens)

        connector.get_num_new_matched_tokens = recorded
        return seen

    def is_loading_remote_kv(self, request: Any) -> bool:
        """Whether a request waits for its asynchronous KV load (``WAITING_FOR_REMOTE_KVS``)."""
        return bool(request.status == self._scheduling.RequestStatus.WAITING_FOR_REMOTE_KVS)

    def abort(self, scheduler: Any, request_id: str) -> None:
        """The client aborts a request: what ``EngineCore.abort_requests`` asks the scheduler.

        ``Scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)``: vLLM frees the
        request's blocks, or, for a request whose KV a connector still loads
        (``WAITING_FOR_REMOTE_KVS``), keeps them until the load reports done.
        """
        finish = getattr(scheduler, "finish_requests", None)
        if finish is None:
            raise self._vllm.missing("Scheduler.finish_requests")
        with quiet_logs():
            finish([request_id], self._scheduling.RequestStatus.FINISHED_ABORTED)

    def observe_deferred_frees(
        self,
        scheduler: Any,
        popped: Callable[[Any, tuple[list[int], ...]], None],
        drained: Callable[[list[tuple[list[int], int, int]]], None],
    ) -> bool:
        """With overlapping batches and a ``kv_consumer`` connector vLLM defers the blocks
        of a request freed while a step that may write them is in flight
        (``Scheduler.defer_block_free``): ``KVCacheManager.pop_blocks_for_free`` takes them
        out of the request's table and ``_drain_deferred_frees`` returns them to the pool
        once that step's output is processed. ``popped(request, table)`` follows each pop,
        with the request's table (per group) before it; ``drained(returned)`` each drain,
        with what it returned: (block ids, free blocks before, after), one per deferred
        entry. False: this scheduler defers nothing (nothing observed)."""
        if not getattr(scheduler, "defer_block_free", False):
            return False
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        pop, drain = manager.pop_blocks_for_free, scheduler._drain_deferred_frees

        def recording_pop(request: Any) -> Any:
            table = tuple(list(ids) for ids in manager.get_block_ids(request.request_id))
            blocks = pop(request)
            popped(request, table)
            return blocks

        def recording_drain() -> None:
            free_blocks = pool.free_blocks
            returned: list[tuple[list[int], int, int]] = []

            def recording_free_blocks(blocks: Any) -> None:
                blocks = list(blocks)
                before = pool.get_num_free_blocks()
                free_blocks(blocks)
                returned.append(([b.block_id for b in blocks], before, pool.get_num_free_blocks()))

            pool.free_blocks = recording_free_blocks
            try:
                drain()
            finally:
                pool.free_blocks = free_blocks
            if returned:
                drained(returned)

        manager.pop_blocks_for_free = recording_pop
        scheduler._drain_deferred_frees = recording_drain
        return True

    def scheduler_request_state(
        self, scheduler: Any, request_ids: Collection[str]
    ) -> dict[str, frozenset[str]]:
        """The request ids each per-request structure of the ``Scheduler`` and of the parts
        it owns holds: every dict, set, list or deque attribute of the scheduler, its
        encoder cache manager, its structured-output manager and its KV and encoder-cache
        connectors (scheduler side), keyed by request ids or ``Request`` objects
        (``requests``, ``finished_req_ids``, ``_pending_encoder_input_ids``,
        ``_inflight_prefills``, ...) or, for a dict of sets, holding request ids as values
        (the encoder cache's ``cached``: mm hash -> its requests). Found by their contents,
        so that a structure a release adds is seen too; the KV-cache manager is left out
        (:meth:`Managers.request_keyed_state` reads it)."""
        owners: list[tuple[str, Any]] = [("Scheduler", scheduler)]
        for attribute in (
            "encoder_cache_manager",
            "structured_output_manager",
            "connector",
            "ec_connector",
        ):
            part = getattr(scheduler, attribute, None)
            if part is not None and hasattr(part, "__dict__"):
                owners.append((type(part).__name__, part))
                # A connector's scheduler side (KVConnectorBase_V1's convention).
                inner = getattr(part, "connector_scheduler", None)
                if inner is not None and hasattr(inner, "__dict__"):
                    owners.append((type(inner).__name__, inner))
        found: dict[str, frozenset[str]] = {}
        for label, owner in owners:
            for attribute, value in vars(owner).items():
                if attribute == "kv_cache_manager":
                    continue
                held = _request_ids_in(value, request_ids)
                if held:
                    found[f"{label}.{attribute}"] = held
        return found

    def is_aborted(self, request: Any) -> bool:
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_ABORTED)

    def status_name(self, request: Any) -> str:
        status = request.status
        return str(getattr(status, "name", status))

    def draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> Any:
        return call(self._scheduling.DraftTokenIds, req_ids=req_ids, draft_token_ids=drafts)

    # -- multimodal encoder inputs ---------------------------------------------------

    def mm_features(self, inputs: list[tuple[int, int, str]]) -> list[Any]:
        """A request's ``mm_features`` for ``(offset, length, identifier)`` placeholder ranges.

        As vLLM's own scheduler tests build them (``tests/v1/core/utils.py``,
        ``create_requests(mm_positions=...)``): a ``MultiModalFeatureSpec`` of modality
        ``image`` per input, its data ``MultiModalKwargsItem.dummy()`` (the scheduler never
        reads it), its ``PlaceholderRange`` and identifier (the mm hash).
        """
        module = self._vllm.optional_module("vllm.multimodal.inputs")
        names = ("MultiModalFeatureSpec", "MultiModalKwargsItem", "PlaceholderRange")
        missing = [n for n in names if not hasattr(module, n)]
        if module is None or missing:
            raise self._vllm.not_offered(f"vllm.multimodal.inputs.{(missing or names)[0]}")
        item = module.MultiModalKwargsItem
        return [
            call(
                module.MultiModalFeatureSpec,
                data=item.dummy(),
                modality="image",
                identifier=identifier,
                mm_position=call(module.PlaceholderRange, offset=offset, length=length),
            )
            for offset, length, identifier in inputs
        ]

    def install_encoder_budget(
        self,
        scheduler: Any,
        largest_input: int,
        max_num_encoder_input_tokens: int | None,
        encoder_cache_size: int | None,
    ) -> tuple[int, int]:
        """Give a scheduler built for the text-only tiny model an encoder budget and cache.

        A multimodal model's scheduler gets them from ``MultiModalBudget``, which asks the
        model's processor for the most tokens an item takes and hands that to
        ``compute_mm_encoder_budget(scheduler_config, ...)``; the processor needs the model's
        tokenizer and image processor, which a config-only model has not. So, as vLLM's own
        scheduler tests do on a text model (``scheduler.max_num_encoder_input_tokens = ...``,
        ``scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=...)``), the two
        are set on the built scheduler, from vLLM's own ``compute_mm_encoder_budget`` with the
        scenario's largest input as the most tokens per item. The starting values are the
        config's (``max_num_batched_tokens``, set in ``SchedulerConfig.__post_init__``), or
        what the scenario states in their place. Returns (compute budget, cache size).
        """
        utils = self._vllm.optional_module("vllm.v1.core.encoder_cache_manager")
        compute = getattr(utils, "compute_mm_encoder_budget", None)
        if compute is None:
            raise self._vllm.not_offered(
                "vllm.v1.core.encoder_cache_manager.compute_mm_encoder_budget"
            )
        config = scheduler.scheduler_config
        if max_num_encoder_input_tokens is not None:
            config.max_num_encoder_input_tokens = max_num_encoder_input_tokens
        if encoder_cache_size is not None:
            config.encoder_cache_size = encoder_cache_size
        with quiet_logs():
            budget, cache_size = compute(config, {"image": largest_input})
        create_manager = getattr(type(scheduler.encoder_cache_manager), "create_manager", None)
        if create_manager is None:
            raise self._vllm.not_offered("EncoderCacheManager.create_manager")
        scheduler.max_num_encoder_input_tokens = budget
        scheduler.encoder_cache_manager = call(
            create_manager,
            cache_size=cache_size,
            vllm_config=scheduler.vllm_config,
        )
        return int(budget), int(cache_size)

    def scheduled_encoder_inputs(self, scheduler_output: Any) -> dict[str, list[int]]:
        """The encoder inputs a step runs, by request (their indexes in ``mm_features``)."""
        return {
            rid: list(ids)
            for rid, ids in (
                getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}
            ).items()
        }

    def encoder_input_stats(self, scheduler_output: Any) -> tuple[int, int] | None:
        """The step's ``scheduled_encoder_input_stats`` (``log_iteration_details``): the
        encoder inputs it schedules and their embeddings; None where it carries none."""
        stats = getattr(scheduler_output, "scheduled_encoder_input_stats", None)
        if stats is None:
            return None
        return int(stats.num_inputs), int(stats.output_tokens)

    def freed_encoder_outputs(self, scheduler_output: Any) -> list[str]:
        """The mm hashes whose encoder outputs the worker drops before the step runs."""
        return list(getattr(scheduler_output, "free_encoder_mm_hashes", None) or ())

    # -- stopping and stats (stop_at, scheduler.log_stats) ---------------------------------

    def is_stopped(self, request: Any) -> bool:
        """Whether a request finished on a stop token or its EOS (``FINISHED_STOPPED``)."""
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_STOPPED)

    def is_errored(self, request: Any) -> bool:
        """Whether a request finished with an error (``FINISHED_ERROR``: vLLM rejected it)."""
        return bool(request.status == self._scheduling.RequestStatus.FINISHED_ERROR)

    def scheduler_stats(self, engine_core_outputs: Any) -> Any | None:
        """The ``SchedulerStats`` an ``update_from_output`` returned (to one front-end only)."""
        for outputs in (engine_core_outputs or {}).values():
            stats = getattr(outputs, "scheduler_stats", None)
            if stats is not None:
                return stats
        return None

    def pause_new_requests(self, scheduler: Any, paused: bool) -> None:
        """``EngineCore.pause_scheduler(mode="wait")`` (``PauseState.PAUSED_NEW``: what runs
        keeps running, nothing new is admitted) or ``resume_scheduler`` (``UNPAUSED``)."""
        interface = self._vllm.optional_module("vllm.v1.core.sched.interface")
        states = getattr(interface, "PauseState", None) if interface is not None else None
        if states is None or not hasattr(scheduler, "set_pause_state"):
            raise self._vllm.not_offered("vllm.v1.core.sched.interface.PauseState")
        with quiet_logs():
            scheduler.set_pause_state(states.PAUSED_NEW if paused else states.UNPAUSED)

    def abort_all(self, scheduler: Any) -> None:
        """``EngineCore.pause_scheduler(mode="abort")``'s first move: every request aborted
        (``Scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)``)."""
        with quiet_logs():
            scheduler.finish_requests(None, self._scheduling.RequestStatus.FINISHED_ABORTED)

    # -- the queues a schedule() call finds (liveness and fairness) ---------------------

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

    def held_back(self, scheduler: Any, request: Any, running: bool) -> str:
        """Why ``Scheduler.schedule`` may pass this request over in the coming step without
        breaking its policy ("" none), read from the request's and the scheduler's state
        (each reason is a ``continue`` or a queue of its own in ``schedule()``; the list and
        why each is legitimate: docs/contract.md, "Liveness and fairness"). A request with
        a multimodal input ahead is recorded as held back by "the encoder budget or cache"
        only where no other reason holds, so that a reason that always excuses is not
        hidden behind the one the liveness family judges (``pending_input``)."""
        other = self._held_back_otherwise(scheduler, request, running)
        if other:
            return other
        if getattr(request, "has_encoder_inputs", False) and _encoder_ahead(scheduler, request):
            return ENCODER_HELD_BACK
        return ""

    def _held_back_otherwise(self, scheduler: Any, request: Any, running: bool) -> str:
        """:meth:`held_back`'s reasons but the encoder's."""
        status = self.status_name(request)
        if status.startswith("WAITING_FOR"):
            return {
                "WAITING_FOR_REMOTE_KVS": "its KV load is in flight",
                "WAITING_FOR_FSM": "its structured-output grammar is not compiled",
                "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": "its structured-output grammar is not compiled",
                "WAITING_FOR_STREAMING_REQ": "its session waits for input",
            }.get(status, status)
        if getattr(request, "lora_request", None) is not None:
            return "the LoRA limit"
        if getattr(scheduler, "need_mamba_block_aligned_split", False):
            return "a Mamba block-aligned chunk"
        if getattr(request, "num_stale_output_tokens", 0) and not running:
            return "its stale output is in flight"
        if getattr(request, "kv_transfer_params", None) and not running:
            return "the KV connector's queue"
        if not running:
            if getattr(scheduler, "cache_aware_window", 0):
                return "cache-aware admission reorders the waiting queue"
            return ""
        placeholders = int(getattr(request, "num_output_placeholders", 0) or 0)
        computed = int(request.num_computed_tokens)
        known = int(getattr(request, "num_tokens_with_spec", request.num_tokens))
        if known + placeholders - computed <= 0:
            return "its next token is not known before a step in flight is processed"
        max_tokens = getattr(request, "max_tokens", None)
        if (
            placeholders
            and max_tokens is not None
            and computed + 2 - placeholders >= request.num_prompt_tokens + max_tokens
        ):
            return "its last token is in flight"
        if _decode_deferred(scheduler, request):
            return "the pipeline's decode cadence"
        # _reserve_prefill_lookahead cuts a chunk only where the lookahead is more than 1
        # (multi-module MTP): "No-op for eagle-family drafters (lookahead 1)", the same in
        # 0.28.0-0.34.0; with 1 it excused any prefill chunk (issue 35's running #24 form).
        if getattr(request, "is_prefill_chunk", False) and (
            getattr(scheduler, "local_prefill_interval", 1) > 1
            or int(getattr(scheduler, "num_prefill_lookahead", 0) or 0) > 1
        ):
            return "the prefill cadence or lookahead window"
        sampled = int(getattr(scheduler, "num_sampled_tokens_per_step", 1) or 1)
        max_model_len = getattr(scheduler, "max_model_len", None)
        if max_model_len is not None and request.num_computed_tokens + sampled >= max_model_len:
            return "max_model_len"
        return ""

    def pending_input(self, scheduler: Any, request: Any) -> tuple[int, int, int, bool] | None:
        """(offset, length, embeddings, already in the encoder cache) of the first
        multimodal input ``request`` has not computed past, shifted by the prefill
        lookahead as ``_encoder_ahead`` reads it: the input ``_try_schedule_encoder_inputs``
        weighs first in the coming step (the embeddings are what ``can_allocate`` asks of
        the encoder budget and cache, ``Request.get_num_encoder_embeds``; a cached one
        needs no room, ``check_and_update_cache``). None where there is none, or where
        the answer is not the cache's: an encoder-cache connector (``ec_connector``), an
        encoder-decoder model (no encoder cache, ``is_encoder_decoder``)."""
        if getattr(scheduler, "ec_connector", None) is not None:
            return None
        if getattr(scheduler, "is_encoder_decoder", False):
            return None
        shift = self.prefill_shift(scheduler)
        computed = int(request.num_computed_tokens)
        cache = getattr(scheduler, "encoder_cache_manager", None)
        cached = getattr(cache, "cached", None) or {}
        for feature in getattr(request, "mm_features", None) or ():
            position = getattr(feature, "mm_position", None)
            if position is None:
                return None
            offset, length = int(position.offset), int(position.length)
            if offset + length + shift <= computed:
                continue
            embeds = getattr(position, "get_num_embeds", None)
            count = int(embeds() if callable(embeds) else embeds if embeds is not None else length)
            return offset, length, count, getattr(feature, "identifier", None) in cached
        return None

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


def _decode_deferred(scheduler: Any, request: Any) -> bool:
    """The request may not decode in the coming step (pipeline parallelism with async
    scheduling: ``Request.next_decode_eligible_step``)."""
    eligible = getattr(request, "next_decode_eligible_step", None)
    current = getattr(scheduler, "current_step", None)
    return eligible is not None and current is not None and current + 1 < eligible


def _encoder_ahead(scheduler: Any, request: Any) -> bool:
    """The request has a multimodal placeholder it has not computed past (with the prefill
    lookahead ``_try_schedule_encoder_inputs`` shifts by), or an encoder-cache connector
    decides for it: only then can the encoder budget or cache cut its tokens to 0."""
    if getattr(scheduler, "ec_connector", None) is not None:
        return True
    shift = int(getattr(scheduler, "num_prefill_lookahead", 0) or 0)
    computed = int(request.num_computed_tokens)
    for feature in getattr(request, "mm_features", None) or ():
        position = getattr(feature, "mm_position", None)
        if position is None:
            return True
        if int(position.offset) + int(position.length) + shift > computed:
            return True
    return False


def _request_id(item: Any, request_ids: Collection[str]) -> str | None:
    """``item``'s request id where it is one of ``request_ids`` or a ``Request`` of one."""
    if isinstance(item, str):
        return item if item in request_ids else None
    rid = getattr(item, "request_id", None)
    return rid if isinstance(rid, str) and rid in request_ids else None


# Tuples of types, not unions: ``isinstance(x, A | B)`` builds the union on every call,
# and the bookkeeping scan tests every attribute of the scheduler after every step.
_CONTAINERS = (dict, set, frozenset, list, deque)
_SETS = (set, frozenset)


def _request_ids_in(value: Any, request_ids: Collection[str]) -> frozenset[str]:
    """The request ids a structure holds: its keys or items (ids or ``Request`` objects),
    and for a dict whose values are sets, the ids in those sets."""
    if not isinstance(value, _CONTAINERS) or not value:
        return frozenset()
    held = {rid for item in value if (rid := _request_id(item, request_ids)) is not None}
    if isinstance(value, dict):
        for inner in value.values():
            if isinstance(inner, _SETS):
                held.update(
                    rid for item in inner if (rid := _request_id(item, request_ids)) is not None
                )
    return frozenset(held)
