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

from kvconform.oracles.vllm.calls import call, quiet_logs
from kvconform.oracles.vllm.scheduling_queues import SchedulingQueues

__all__ = ["Scheduling"]


class Scheduling(SchedulingQueues):
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
