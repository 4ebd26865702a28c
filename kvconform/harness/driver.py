"""The trajectory driver: steps a scenario through every party, step by step.

For each call of each step the driver asks the live ``KVCacheManager`` to
allocate (exactly as the scheduler would), asks vLLM's warmup predictor how
many blocks it would reserve for the same token count, computes the reference
floor, and records one :class:`Observation` per group. It judges nothing: the
checks read the :class:`Trajectory` afterwards. Keeping judgement out of the
loop keeps the loop close to the cost of the allocator calls it makes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvconform.errors import Location, PoolExhausted, ScenarioError
from kvconform.harness.observations import FreeEvent, GroupInfo, Observation, Trajectory
from kvconform.harness.scenario import Action, GroupSpec, ModelSpec, Scenario
from kvconform.oracles.group_types import GROUP_TYPES
from kvconform.oracles.live import LiveAllocator
from kvconform.oracles.lookahead import expected_lookahead
from kvconform.oracles.predictor import Predictor
from kvconform.oracles.vllm_compat import Vllm


def resolve_lookahead(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """The scenario's lookahead, and where it came from, in an empty trajectory."""
    model, spec = scenario.model, scenario.speculative
    groups = tuple(
        GroupInfo(i, g.type, g.block_size, g.label, GROUP_TYPES[g.type].holds_null)
        for i, g in enumerate(model.groups)
    )
    if spec is None:
        return Trajectory(
            groups,
            0,
            "no speculative decoding",
            model.max_model_len,
            expected_lookahead=0,
            vllm_lookahead=0,
            floor_lookahead=0,
        )
    declared = vllm.declared_methods()
    if spec.method not in declared:
        where = spec.where or scenario.where.at("speculative.method")
        raise ScenarioError(
            where,
            f"unknown speculative method {spec.method!r}; vLLM {vllm.version} declares: "
            + ", ".join(declared),
        )
    method = vllm.canonical_method(spec.method)
    k, anchor = spec.num_speculative_tokens, spec.sample_from_anchor
    vllm_value = vllm.lookahead(method, k, anchor)
    expected = expected_lookahead(method, k, anchor)
    if spec.num_lookahead_tokens is not None:
        lookahead, source = spec.num_lookahead_tokens, "scenario override"
    elif vllm_value is not None:
        lookahead, source = vllm_value, "VllmConfig.num_lookahead_tokens"
    elif expected is not None:
        lookahead = expected
        source = f"kvconform's table (vLLM {vllm.version} has no VllmConfig.num_lookahead_tokens)"
    else:
        raise ScenarioError(
            spec.where or scenario.where,
            f"no lookahead for {spec.method!r}: vLLM {vllm.version} has no "
            "VllmConfig.num_lookahead_tokens and kvconform's table lacks the method; "
            "set speculative.num_lookahead_tokens",
        )
    return Trajectory(
        groups,
        lookahead,
        source,
        model.max_model_len,
        method=method,
        num_speculative_tokens=k,
        sample_from_anchor=anchor,
        vllm_lookahead=vllm_value,
        floor_lookahead=(
            spec.num_lookahead_tokens
            if spec.num_lookahead_tokens is not None
            else expected
            if expected is not None
            else lookahead
        ),
        expected_lookahead=expected,
    )


def spec_options(group: GroupSpec, num_speculative_tokens: int) -> dict[str, Any]:
    """The options ``group``'s vLLM spec is built with.

    A Mamba group without ``num_speculative_blocks`` gets one per speculative
    token, as vLLM's config does for Mamba models under speculative decoding.
    """
    options = dict(group.options)
    if group.type == "mamba" and options.get("num_speculative_blocks") is None:
        options["num_speculative_blocks"] = num_speculative_tokens
    return options


def encoder_lens(scenario: Scenario) -> dict[str, int]:
    """Per request, the encoder tokens its first chunk brings (0 without cross-attention)."""
    model = scenario.model
    if not any(g.type == "cross_attention" for g in model.groups):
        return {name: 0 for name in scenario.requests}
    return {
        name: req.encoder_len or model.max_encoder_len for name, req in scenario.requests.items()
    }


def build_specs(model: ModelSpec, vllm: Vllm, run: Trajectory) -> list[Any]:
    """vLLM KVCacheSpecs for the scenario's groups; fills in their floor inputs on ``run``."""
    specs = [
        vllm.build_spec(g.type, g.block_size, spec_options(g, run.num_speculative_tokens))
        for g in model.groups
    ]
    run.groups = tuple(
        replace(
            info,
            floor_args=dict(
                block_size=group.block_size,
                max_model_len=model.max_model_len,
                dcp_world_size=model.dcp_world_size if vllm.dcp_sharded(spec) else 1,
                num_speculative_blocks=int(getattr(spec, "num_speculative_blocks", 0) or 0),
                mamba_cache_mode=str(getattr(spec, "mamba_cache_mode", "none")),
            ),
        )
        for info, group, spec in zip(run.groups, model.groups, specs, strict=True)
    )
    return specs


def attach_predictor(run: Trajectory, vllm: Vllm, model: ModelSpec, null_block: int) -> Predictor:
    """vLLM's predictor for ``run``, and the pool facts every driver records.

    Where the installed vLLM has no predictor, the party is dropped from
    ``run.parties`` and a note says why: reported unavailable, never faked.
    """
    predictor = Predictor(vllm, model.max_model_len, run.lookahead)
    if not predictor.available:
        run.parties = tuple(p for p in run.parties if p != "predicted")
        run.notes.append(f"predictor unavailable: {predictor.unavailable_reason}")
    run.null_block = null_block
    run.num_blocks = model.num_blocks
    run.exclusive_blocks = not model.enable_caching
    return predictor


def drive(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: trajectory`` scenario through the live allocator and the predictor."""
    model = scenario.model
    run = resolve_lookahead(scenario, vllm)
    lookahead = run.lookahead
    floor_lookahead = lookahead if run.floor_lookahead is None else run.floor_lookahead
    specs = build_specs(model, vllm, run)
    scheduler_options = vllm.manager_options(
        run.method, run.num_speculative_tokens, run.sample_from_anchor, model.enable_caching
    )
    live = LiveAllocator(vllm, model, specs, lookahead, scheduler_options)
    predictor = attach_predictor(run, vllm, model, live.null_block)
    num_groups = len(specs)
    encoder_len = run.encoder_lens = encoder_lens(scenario)
    for index, request in enumerate(scenario.requests.values()):
        live.add_request(request, index)

    predicted_max: dict[str, list[int]] = {}
    finished: set[str] = set()
    observations = run.observations
    # The loop below runs once per allocator call and must stay close to the
    # cost of the vLLM calls it makes (make bench, docs/benchmarks.md): what
    # can be fixed before it is fixed here, and nothing is built that only an
    # error would need.
    record = observations.append
    new_row = tuple.__new__  # an Observation without its Python-level __new__
    per_group = [
        (g, info.step_floor(), predictor.for_group(specs[g]) if predictor.available else None)
        for g, info in enumerate(run.groups)
    ]
    finish, preempt = Action.FINISH, Action.PREEMPT
    scenario_where = scenario.where  # a property that builds a Location: once, not per call
    for step in scenario.steps:
        index, line = step.index, step.line
        for call in step.calls:
            name, action = call.request, call.action
            if action is finish or action is preempt:
                held = live.block_ids(name)
                before = live.free_blocks()
                if action is finish:
                    live.finish(name)
                    finished.add(name)
                else:
                    live.preempt(name)
                predicted_max.pop(name, None)
                run.events.append(
                    FreeEvent(
                        len(observations),
                        index,
                        line,
                        name,
                        action.value,
                        held,
                        before,
                        live.free_blocks(),
                        live.block_ids(name),
                    )
                )
                continue
            enc = encoder_len[name]
            try:
                # A prefix-cache hit is computed, not written: the slots party skips it.
                cached = live.schedule(call, enc if call.first_chunk else 0, scenario_where)
            except PoolExhausted as exc:
                where = Location(scenario.file, line, f"steps[{index}].{name}")
                raise PoolExhausted(where, exc.message) from None
            held = live.block_ids(name)
            computed, scheduled, label = call.computed, call.scheduled, call.label
            num_tokens = computed + scheduled
            maxima = predicted_max.get(name)
            if maxima is None:
                maxima = predicted_max[name] = [0] * num_groups
            for g, floor_of, predict in per_group:
                predicted = pmax = None
                if predict is not None:
                    predicted = predict(num_tokens, enc)
                    pmax = maxima[g]
                    if predicted > pmax:
                        pmax = maxima[g] = predicted
                ids = held[g]
                record(
                    new_row(
                        Observation,
                        (
                            index,
                            line,
                            name,
                            label,
                            g,
                            computed,
                            scheduled,
                            floor_lookahead,
                            floor_of(computed, scheduled, floor_lookahead, enc),
                            len(ids),
                            predicted,
                            pmax,
                            None,
                            ids,
                            None,
                            cached,
                        ),
                    )
                )
            live.complete(call)
    run.all_finished = len(finished) == len(scenario.requests)
    run.final_free_blocks = live.free_blocks()
    return run
