"""The trajectory driver: steps a scenario through every party, step by step.

For each call of each step the driver asks the live ``KVCacheManager`` to
allocate (exactly as the scheduler would), asks vLLM's warmup predictor how
many blocks it would reserve for the same token count, computes the reference
floor, and records one :class:`Observation` per group, and the facts the live
oracle saw (:mod:`kvconform.model.facts`) with the step, line and call they belong
to. It judges nothing: the checks read the :class:`Trajectory` afterwards. Keeping judgement out of the
loop keeps the loop close to the cost of the allocator calls it makes.
"""

from __future__ import annotations

from kvconform.errors import Location, ScenarioError, StepDenied
from kvconform.harness.drivers.common import attach_predictor, denial, keep_in_progress
from kvconform.model.facts import Fact
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.observations import FreeEvent, Observation, RefusedCall, Trajectory
from kvconform.model.scenario import Action, Scenario
from kvconform.oracles.live import LiveAllocator
from kvconform.oracles.resolve import new_trajectory
from kvconform.oracles.vllm import Vllm


def drive(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: trajectory`` scenario through the live allocator and the predictor."""
    model = scenario.model
    trajectory = new_trajectory(scenario, vllm)
    keep_in_progress(trajectory)  # filled as it goes: kept if a party raises
    lookahead = trajectory.lookahead
    floor_lookahead = (
        lookahead if trajectory.floor_lookahead is None else trajectory.floor_lookahead
    )
    live = LiveAllocator(vllm, model, trajectory)
    predictor = attach_predictor(trajectory, vllm, model, live.null_block)
    num_groups = len(model.groups)
    encoder_len = trajectory.encoder_lens = scenario.encoder_lens()
    for index, request in enumerate(scenario.requests.values()):
        live.add_request(request, index)
    # What the manager shows as built, before any step (its managers' declared defaults).
    facts = trajectory.facts
    for name, fact in live.step_facts:
        facts.append(Fact(0, None, name, "manager built", fact))
    live.step_facts.clear()

    predicted_max: dict[str, list[int]] = {}
    finished: set[str] = set()
    observations = trajectory.observations
    # The loop below runs once per allocator call and must stay close to the
    # cost of the vLLM calls it makes (make bench, docs/benchmarks.md): what
    # can be fixed before it is fixed here, and nothing is built that only an
    # error would need.
    record = observations.append
    new_row = tuple.__new__  # an Observation without its Python-level __new__
    # The predictor has no rule for some types (GroupType.predicted): not asked there.
    per_group = [
        (
            g,
            info.step_floor(),
            predictor.for_group(g)
            if predictor.available and GROUP_TYPES[info.type].predicted
            else None,
        )
        for g, info in enumerate(trajectory.groups)
    ]
    finish, preempt = Action.FINISH, Action.PREEMPT
    scenario_where = scenario.where  # a property that builds a Location: once, not per call
    # The allocator no longer holds what the scenario's later steps assume (it granted a
    # call the scenario marks refused, or refused one the floor fits): stop there.
    stopped = False
    for step in scenario.steps:
        if stopped:
            break
        index, line = step.index, step.line
        # What the engine does between the last step and this one.
        if step.reset_prefix_cache is not None:
            live.reset_prefix_cache(step.reset_prefix_cache)
        if step.evict_cached:
            live.evict_cached(
                step.evict_cached, Location(scenario.file, line, f"steps[{index}].evict_cached")
            )
        for name, fact in live.step_facts:
            facts.append(Fact(index, line, name, "before the step", fact))
        live.step_facts.clear()
        live.new_step()
        for call in step.calls:
            name, action = call.request, call.action
            if call.refused:
                free_before = live.free_blocks()
                try:
                    refused = live.is_refused(
                        call, encoder_len[name] if call.first_chunk else 0, scenario_where
                    )
                except ScenarioError as exc:  # a chunk with nothing to compute
                    where = Location(scenario.file, line, f"steps[{index}].{name}")
                    raise type(exc)(where, exc.message) from None
                trajectory.refusals.append(
                    RefusedCall(index, line, name, call.label, not refused, free_before)
                )
                if not refused:
                    stopped = True
                    break
                continue
            if call.deferred_free:
                live.finish_in_flight(name)
                finished.add(name)
                predicted_max.pop(name, None)
                continue
            if action is finish or action is preempt:
                held = live.block_ids(name)
                before = live.free_blocks()
                if action is finish:
                    live.finish(name)
                    finished.add(name)
                else:
                    live.preempt(name)
                predicted_max.pop(name, None)
                trajectory.events.append(
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
            except StepDenied as denied:
                trajectory.denials.append(denial(denied, index, line))
                stopped = True
                break
            except ScenarioError as exc:  # a pool too small, a chunk with nothing to compute
                where = Location(scenario.file, line, f"steps[{index}].{name}")
                raise type(exc)(where, exc.message) from None
            finally:
                if live.call_facts:
                    for made, fact in live.call_facts:
                        facts.append(Fact(index, line, name, made.label, fact))
                    live.call_facts.clear()
            held = live.table_after_call
            computed, scheduled, label = call.computed, call.scheduled, call.label
            num_tokens = computed + scheduled
            # A step that only loads KV writes nothing: no lookahead, and the warmup's
            # predictor, which knows only computed steps, has nothing to say about it.
            loading = call.options.load_async
            # The predictor models synchronous steps: with tokens in flight vLLM frees a
            # windowed group's blocks only below the processed tokens, and holds more.
            unpredicted = loading or call.options.in_flight > 0
            step_lookahead = 0 if loading else floor_lookahead
            maxima = predicted_max.get(name)
            if maxima is None:
                maxima = predicted_max[name] = [0] * num_groups
            if call.options.in_flight:
                first = len(observations)
                trajectory.in_flight_tokens.update(
                    (first + g, call.options.in_flight) for g in range(num_groups)
                )
            for g, floor_of, predict in per_group:
                predicted = pmax = None
                if predict is not None and not unpredicted:
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
                            step_lookahead,
                            floor_of(computed, scheduled, step_lookahead, enc),
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
        live.end_step()
        for name, fact in live.step_facts:
            facts.append(Fact(index, line, name, "end of step", fact))
        live.step_facts.clear()
    # The engine's next step applies the last output: blocks still deferred go back.
    live.return_deferred()
    for name, fact in live.step_facts:
        facts.append(Fact(len(scenario.steps), None, name, "after the last step", fact))
    live.step_facts.clear()
    trajectory.all_finished = len(finished) == len(scenario.requests)
    trajectory.final_free_blocks = live.free_blocks()
    return trajectory
