"""The bare loop: the same vLLM calls the harness makes, without kvconform's bookkeeping.

``step_overhead_ratio`` divides the harness's time by the time of this loop on
the same trajectories, so the loop must make exactly the vLLM calls the driver
makes for the allocator and the predictor, and nothing else:

* build the groups' ``KVCacheSpec`` s, the ``KVCacheConfig``, one
  ``KVCacheManager`` and one ``Request`` per scenario request (same prompts,
  same prefix sharing, same block hasher);
* per allocating call, ``allocate_slots`` (with the prefix-cache lookup and the
  encoder length on a request's first chunk), ``get_block_ids`` once, and the
  predictor ``_reserved_block_count`` once per group, then what the
  scheduler's ``update_from_output`` does (rollback, sampled tokens, caching);
* ``free`` on ``finish`` and ``preempt``;
* per step, what ``Scheduler.schedule`` does around its calls: ``new_step_starts``
  first, the copy-on-write hand-over last.

It reads the *resolved* :class:`~kvconform.model.scenario.Call` s of a loaded
scenario, so both sides walk the same legal trajectory, and it calls vLLM
through the same :class:`~kvconform.oracles.vllm.Vllm` object (the
signature filtering of ``allocate_slots`` included). What it leaves out is what
kvconform adds: observations, floors, free events, running maxima and checks.

The plan (:class:`BarePlan`) is built once, outside any timing: the lookahead
and the group options are the harness's own resolution of the scenario, so the
loop cannot drift from what the harness asks of vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvconform.model.scenario import Action, Call, ModelSpec, Scenario
from kvconform.oracles.live import first_output_token, manager_for, prompt_tokens
from kvconform.oracles.resolve import new_trajectory, resolve_settings, spec_options
from kvconform.oracles.vllm import Vllm


@dataclass(frozen=True)
class BarePlan:
    """What the bare loop needs of one scenario, resolved before timing."""

    scenario_id: str
    model: ModelSpec
    group_options: tuple[tuple[str, int, dict[str, object]], ...]  # type, block_size, options
    lookahead: int
    manager_options: dict[str, int | bool]  # the scheduler's speculative KVCacheManager options
    prompts: tuple[tuple[str, tuple[int, ...]], ...]
    encoder_lens: dict[str, int]
    steps: tuple[tuple[Call, ...], ...]
    use_predictor: bool

    @property
    def calls(self) -> tuple[Call, ...]:
        return tuple(call for step in self.steps for call in step)


def plan(scenario: Scenario, vllm: Vllm) -> BarePlan:
    """Resolve a ``kind: trajectory`` scenario into a :class:`BarePlan`."""
    scenario, _ = resolve_settings(scenario, vllm)  # what the harness runs: vLLM's defaults
    model = scenario.model
    run = new_trajectory(scenario, vllm)
    groups = [
        (g.type, g.block_size, spec_options(g, run.num_speculative_tokens)) for g in model.groups
    ]
    # The live oracle's token-id layout, so that prefix-cache hits happen where they
    # happen under the harness.
    prompts: dict[str, list[int]] = {}
    for index, request in enumerate(scenario.requests.values()):
        prompts[request.name] = prompt_tokens(index, request, prompts)
    return BarePlan(
        scenario.id,
        model,
        tuple(groups),
        run.lookahead,
        vllm.manager_options(
            run.method,
            run.num_speculative_tokens,
            run.sample_from_anchor,
            model.enable_caching,
            run.disable_lookahead_block_hashes,
        ),
        tuple((name, tuple(p)) for name, p in prompts.items()),
        scenario.encoder_lens(),
        tuple(tuple(step.calls) for step in scenario.steps),
        vllm.reserved_block_count is not None,
    )


def run_bare(bare: BarePlan, vllm: Vllm) -> int:
    """Make the plan's vLLM calls; returns the number of ``allocate_slots`` calls."""
    model = bare.model
    specs = [vllm.build_spec(t, size, options) for t, size, options in bare.group_options]
    manager = manager_for(vllm, model, specs, bare.manager_options)
    caching = model.enable_caching
    hash_lookahead = int(bare.manager_options.get("num_hash_lookahead_tokens", 0))
    hasher = vllm.block_hasher(model.hash_block_size, hash_lookahead) if caching else None
    requests = {name: vllm.new_request(name, list(prompt), hasher) for name, prompt in bare.prompts}
    outputs = {name: first_output_token(i) for i, (name, _) in enumerate(bare.prompts)}
    running, preempted = vllm.running_status(), vllm.preempted_status()
    lookahead, max_model_len = bare.lookahead, model.max_model_len
    predict = (
        vllm.block_counter(
            num_lookahead_tokens=lookahead,
            max_model_len=max_model_len,
            dcp_world_size=model.dcp_world_size,
        )
        if bare.use_predictor
        else None
    )
    allocate_slots, get_block_ids = vllm.allocate_slots, manager.get_block_ids
    allocations = 0
    new_step, end_step = vllm.new_step_starts, vllm.release_block_copies
    for step in bare.steps:
        new_step(manager)  # Scheduler.schedule begins every step with it
        for call in step:
            request = requests[call.request]
            if call.action is Action.FINISH or call.action is Action.PREEMPT:
                manager.free(request)
                if call.action is Action.PREEMPT:
                    request.status = preempted
                    request.num_computed_tokens = 0
                continue
            enc = bare.encoder_lens[call.request]
            if call.first_chunk:
                blocks, hit = None, 0
                if caching:
                    blocks, hit = vllm.computed_blocks(
                        manager, request, call.computed + call.scheduled - 1
                    )
                new_blocks = allocate_slots(
                    manager,
                    request,
                    call.scheduled - hit,
                    num_new_computed_tokens=hit,
                    new_computed_blocks=blocks if hit else None,
                    num_lookahead_tokens=lookahead,
                    num_encoder_tokens=enc,
                    full_sequence_must_fit=model.scheduler_reserve_full_isl,
                )
            else:
                new_blocks = allocate_slots(
                    manager, request, call.scheduled, num_lookahead_tokens=lookahead
                )
            allocations += 1
            if call.refused:
                continue  # the driver expects None here and leaves the request as it was
            if new_blocks is None:
                raise RuntimeError(f"{bare.scenario_id}: the pool ran dry in the bare loop")
            request.status = running
            request.num_computed_tokens = call.computed + call.scheduled
            get_block_ids(call.request)
            if predict is not None:
                num_tokens = call.computed + call.scheduled
                for spec in specs:
                    predict(num_tokens, spec, max_encoder_len=enc)
            request.num_computed_tokens -= call.rejected
            if call.sampled:
                first = outputs[call.request]
                outputs[call.request] = first + call.sampled
                request.append_output_token_ids(list(range(first, first + call.sampled)))
                if caching:
                    vllm.cache_blocks(manager, request, request.num_computed_tokens)
        end_step(manager)  # and ends it handing over the copy-on-write copies
    return allocations


def run_bare_all(plans: Sequence[BarePlan], vllm: Vllm) -> int:
    return sum(run_bare(p, vllm) for p in plans)


def count_steps(plans: Sequence[BarePlan]) -> int:
    """Allocating calls in the plans: the unit of 'per step' figures."""
    return sum(1 for p in plans for c in p.calls if c.scheduled > 0)
