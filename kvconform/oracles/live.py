"""The live party: vLLM's own ``KVCacheManager``, driven as its scheduler drives it.

Every call mirrors what ``vllm/v1/core/sched/scheduler.py`` does around
``allocate_slots``:

* A request entering from the waiting queue (first chunk, or first chunk after a
  preemption) first looks up its prefix-cache hit with ``get_computed_blocks``
  (capped so at least one token is scheduled), then calls ``allocate_slots``
  with the hit, the scenario's lookahead and, for encoder-decoder models, its
  encoder length; it is then marked running.
* A running request calls ``allocate_slots(request, scheduled,
  num_lookahead_tokens=lookahead)``.
* After the step, ``num_computed_tokens`` advances by the scheduled tokens,
  rejected drafts are rolled back from it, sampled tokens are appended and, as
  the scheduler does under speculative decoding, verified blocks are cached.
* ``preempt`` frees the blocks and resets the computed count; ``finish`` frees.

``allocate_slots`` returning ``None`` means the pool cannot serve the step:
the scenario asked for more than its pool holds, a :class:`PoolExhausted`;
unless the scenario marks the call ``refused``, where ``None`` is the answer it
expects (:meth:`LiveAllocator.is_refused`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvconform.errors import Location, PoolExhausted
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Action, Call, ModelSpec, RequestSpec
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.vllm import Vllm

# Token ids: disjoint ranges per request so that prefix-cache hits happen only
# where a scenario asks for them (prefix_from), never on outputs. Every party that
# builds vLLM requests (live, scheduler, the benchmark's bare loop) uses this layout.
ID_STRIDE = 1_000_000
OUTPUT_OFFSET = 500_000


def prompt_tokens(index: int, spec: RequestSpec, prompts: Mapping[str, list[int]]) -> list[int]:
    """The prompt of the ``index``-th request; a ``prefix_from`` prefix is copied from
    that request's prompt in ``prompts``."""
    base = (index + 1) * ID_STRIDE
    prompt = list(range(base, base + spec.prompt_len))
    if spec.prefix_from is not None:
        prompt[: spec.prefix_len] = prompts[spec.prefix_from][: spec.prefix_len]
    return prompt


def first_output_token(index: int) -> int:
    """The first sampled token id of the ``index``-th request."""
    return (index + 1) * ID_STRIDE + OUTPUT_OFFSET


def manager_for(
    vllm: Vllm,
    model: ModelSpec,
    specs: Sequence[Any],
    speculative_options: Mapping[str, int | bool] | None = None,
) -> Any:
    """A ``KVCacheManager`` for ``model``'s pool and groups, built as the scheduler builds it."""
    return vllm.new_manager(
        vllm.kv_cache_config(model.num_blocks, specs),
        max_model_len=model.max_model_len,
        scheduler_block_size=model.scheduler_block_size,
        hash_block_size=model.hash_block_size,
        enable_caching=model.enable_caching,
        dcp_world_size=model.dcp_world_size,
        log_stats=False,
        **dict(speculative_options or {}),
    )


class LiveAllocator:
    """One ``KVCacheManager`` shared by all requests of a scenario."""

    def __init__(
        self, vllm: Vllm, model: ModelSpec, run: Trajectory, *, as_scheduler: bool = True
    ) -> None:
        """A manager for ``model``'s pool and groups, allocating with ``run``'s lookahead.

        ``as_scheduler``: built with what vLLM's scheduler passes for its
        speculative config (``Vllm.manager_options``: EAGLE block drop, prefill
        lookahead, lookahead block hashes); off for a warmup replay, whose
        requests never came through a scheduler.
        """
        options = (
            vllm.manager_options(
                run.method, run.num_speculative_tokens, run.sample_from_anchor, model.enable_caching
            )
            if as_scheduler
            else {}
        )
        self.vllm = vllm
        self.model = model
        self.lookahead = run.lookahead
        self.specs = group_specs(vllm, model, run.num_speculative_tokens)
        self.manager = manager_for(vllm, model, self.specs, options)
        self.null_block = vllm.null_block_id(self.manager)
        self._hasher = (
            vllm.block_hasher(
                model.hash_block_size, int(options.get("num_hash_lookahead_tokens", 0))
            )
            if model.enable_caching
            else None
        )
        self._requests: dict[str, Any] = {}
        self._prompts: dict[str, list[int]] = {}
        self._outputs: dict[str, int] = {}
        self._running = vllm.running_status()
        self._preempted = vllm.preempted_status()

    def add_request(self, spec: RequestSpec, index: int) -> None:
        prompt = self._prompts[spec.name] = prompt_tokens(index, spec, self._prompts)
        self._outputs[spec.name] = first_output_token(index)
        self._requests[spec.name] = self.vllm.new_request(spec.name, prompt, self._hasher)

    def schedule(self, call: Call, encoder_len: int, where: Location) -> int:
        """Allocate for one call; returns the prefix-cache hit in tokens."""
        new_blocks, hit = self._allocate(call, encoder_len)
        if new_blocks is None:
            raise PoolExhausted(
                where,
                f"the pool of {self.model.num_blocks} blocks has "
                f"{self.vllm.free_block_count(self.manager)} free, too few for {call.label} of "
                f"request {call.request!r}; raise model.num_blocks, or preempt or finish a request",
            )
        request = self._requests[call.request]
        request.status = self._running
        request.num_computed_tokens = call.computed + call.scheduled
        return hit

    def is_refused(self, call: Call, encoder_len: int) -> bool:
        """Make a call the scenario says must be refused; whether ``allocate_slots`` did.

        A refused call leaves the request as it was, as the scheduler leaves it.
        """
        new_blocks, _ = self._allocate(call, encoder_len)
        return new_blocks is None

    def _allocate(self, call: Call, encoder_len: int) -> tuple[Any, int]:
        """``allocate_slots`` for one call: its answer (``None``: refused) and the hit."""
        request = self._requests[call.request]
        hit = 0
        if call.first_chunk:
            blocks = None
            if self.model.enable_caching:
                blocks, hit = self.vllm.computed_blocks(
                    self.manager, request, call.computed + call.scheduled - 1
                )
            new_blocks = self.vllm.allocate_slots(
                self.manager,
                request,
                call.scheduled - hit,
                num_new_computed_tokens=hit,
                new_computed_blocks=blocks if hit else None,
                num_lookahead_tokens=self.lookahead,
                num_encoder_tokens=encoder_len,
            )
        else:
            new_blocks = self.vllm.allocate_slots(
                self.manager, request, call.scheduled, num_lookahead_tokens=self.lookahead
            )
        return new_blocks, hit

    def complete(self, call: Call) -> None:
        """What ``update_from_output`` does after the step: rollback and sample."""
        request = self._requests[call.request]
        request.num_computed_tokens -= call.rejected
        if call.sampled:
            first = self._outputs[call.request]
            self._outputs[call.request] = first + call.sampled
            request.append_output_token_ids(list(range(first, first + call.sampled)))
            if self.model.enable_caching:
                self.vllm.cache_blocks(self.manager, request, request.num_computed_tokens)

    def replay(
        self,
        name: str,
        computed: int,
        scheduled: int,
        prompt_len: int,
        encoder_len: int,
        where: Location,
        label: str = "",
    ) -> None:
        """Allocate for a step known only by its counts (a recorded warmup step).

        A request the allocator does not hold enters from the waiting queue with
        a prompt of ``prompt_len`` tokens; a running one has its computed count
        set to the recorded ``computed`` first. After the step it holds one
        sampled token past ``computed + scheduled``, as after a step whose drafts
        were all accepted.
        """
        first_chunk = name not in self._requests
        if first_chunk:
            self.add_request(RequestSpec(name, prompt_len), len(self._prompts))
        request = self._requests[name]
        request.num_computed_tokens = computed
        action = Action.PREFILL if first_chunk else Action.SPEC
        call = Call(name, action, computed, scheduled, first_chunk=first_chunk, label=label)
        self.schedule(call, encoder_len if first_chunk else 0, where)
        sampled = max(0, computed + scheduled + 1 - request.num_tokens)
        self.complete(replace(call, sampled=sampled))

    def preempt(self, name: str) -> None:
        request = self._requests[name]
        self.manager.free(request)
        request.status = self._preempted
        request.num_computed_tokens = 0

    def finish(self, name: str) -> None:
        self.manager.free(self._requests[name])

    def forget(self, name: str) -> None:
        """Drop a finished request, so that its name can enter again (warmup passes)."""
        del self._requests[name]

    def block_ids(self, name: str) -> tuple[list[int], ...]:
        return tuple(self.manager.get_block_ids(name))

    def free_blocks(self) -> int:
        return self.vllm.free_block_count(self.manager)
