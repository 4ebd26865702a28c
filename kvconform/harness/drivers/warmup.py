"""The warmup driver: vLLM's real warmup as a third party beside live and predicted.

A ``kind: warmup`` scenario names the warmup entry points and the runner limits
instead of requests and steps. The driver

1. records what vLLM's own warmup schedules (:mod:`kvconform.oracles.warmup`),
   with a stub model runner built from the scenario: its KV groups, the
   lookahead of its method from ``VllmConfig.num_lookahead_tokens``,
   ``max_num_seqs``, ``max_num_batched_tokens``, ``num_blocks``,
   ``max_model_len`` and, with a cross-attention group, ``max_encoder_len``;
2. replays the recorded (computed, scheduled) sequence through a live
   ``KVCacheManager`` with the same lookahead, freeing what the warmup
   finishes;
3. asks the predictor ``_reserved_block_count`` (where the release has it)
   for the same token counts, with the encoder length the warmup binds it to;

and records one :class:`Observation` per step, request and group, with the
warmup's own holding in the ``warmup`` party. The checks then judge all three:
the floor for each, agreement of warmup and live with the predictor (or, on a
release without a predictor, of warmup with live), and allocator sanity.
"""

from __future__ import annotations

from kvconform.errors import Location, StepDenied
from kvconform.harness.drivers.common import attach_predictor, denial, keep_in_progress
from kvconform.model.kind_specs import WarmupSpec
from kvconform.model.kinds import KINDS, Kind
from kvconform.model.observations import FreeEvent, Observation, Trajectory
from kvconform.model.scenario import Scenario
from kvconform.oracles.live import LiveAllocator
from kvconform.oracles.resolve import new_trajectory
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.warmup import record_warmup, scenario_settings


def drive_warmup(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: warmup`` scenario: record the warmup, replay it, predict it."""
    model = scenario.model
    warmup = scenario.warmup or WarmupSpec()
    trajectory = new_trajectory(scenario, vllm)
    keep_in_progress(trajectory)  # filled as it goes: kept if a party raises
    lookahead = trajectory.lookahead
    floor_lookahead = (
        lookahead if trajectory.floor_lookahead is None else trajectory.floor_lookahead
    )
    settings = scenario_settings(vllm, scenario, trajectory)
    max_encoder_len = settings.max_encoder_len
    recording = record_warmup(vllm, settings, warmup.entry_points, warmup.mixed_num_tokens)
    trajectory.notes.extend(recording.notes)
    trajectory.warmup_passes = recording.passes
    trajectory.warmup_writes_redirected = warmup.redirect_writes_to_null_block
    trajectory.warmup_committed_blocks = {
        step.index: step.committed for step in recording.steps if step.committed is not None
    }
    if warmup.expect_passes is not None:
        trajectory.expected_warmup_passes = tuple(
            p for p in warmup.expect_passes if p.applies_to(vllm.version)
        )
        trajectory.expected_warmup_passes_at = str(warmup.expect_passes_at or scenario.file)
    if not recording.steps:
        trajectory.notes.append("the warmup scheduled nothing: there was nothing to check")

    live = LiveAllocator(vllm, model, trajectory, as_scheduler=False)
    trajectory.parties = KINDS[Kind.WARMUP].recorded
    predictor = attach_predictor(trajectory, vllm, model, live.null_block)
    floor_rules = [info.floor_rule.blocks for info in trajectory.groups]
    predict = (
        [predictor.for_group(g) for g in range(len(model.groups))] if predictor.available else []
    )
    encoder_lens: dict[str, int] = {}
    trajectory.encoder_lens = encoder_lens

    held_by_live: set[str] = set()
    predicted_max: dict[str, list[int]] = {}
    observations = trajectory.observations
    for step in recording.steps:
        if trajectory.denials:
            break  # the live replay no longer holds what the recorded warmup held
        for name in step.finished:
            if name not in held_by_live:
                continue
            held, before = live.block_ids(name), live.free_blocks()
            live.finish(name)
            after = live.free_blocks()
            trajectory.events.append(
                FreeEvent(
                    len(observations),
                    step.index,
                    None,
                    name,
                    "finish",
                    held,
                    before,
                    after,
                    live.block_ids(name),
                )
            )
            live.forget(name)
            held_by_live.discard(name)
            predicted_max.pop(name, None)
        for call in step.calls:
            name = call.request
            label = f"{step.entry_point} #{step.number}: {call.label}"
            where = Location(scenario.file, scenario.line, f"warmup.{step.entry_point}")
            if call.new:
                encoder_lens[name] = call.encoder_len
            enc = encoder_lens.get(name, 0)
            try:
                live.replay(name, call.computed, call.scheduled, call.prompt_len, enc, where, label)
            except StepDenied as denied:
                trajectory.denials.append(denial(denied, step.index, None))
                break
            held_by_live.add(name)
            live_held = live.block_ids(name)
            num_tokens = call.computed + call.scheduled
            maxima = predicted_max.setdefault(name, [0] * len(model.groups))
            for g in range(len(model.groups)):
                floor = floor_rules[g](
                    trajectory.groups[g].floor_input(
                        call.computed, call.scheduled, floor_lookahead, enc
                    )
                )
                predicted = pmax = None
                if predictor.available:
                    # The warmup binds the predictor to the runner's max_encoder_len
                    # (_warmup_block_counter); predict what it was asked.
                    predicted = predict[g](num_tokens, max_encoder_len)
                    pmax = maxima[g] = max(maxima[g], predicted)
                observations.append(
                    Observation(
                        step.index,
                        None,
                        name,
                        label,
                        g,
                        call.computed,
                        call.scheduled,
                        floor_lookahead,
                        floor,
                        len(live_held[g]),
                        predicted,
                        pmax,
                        len(call.held[g]),
                        live_held[g],
                        call.held[g],
                    )
                )
    trajectory.all_finished = not held_by_live
    trajectory.final_free_blocks = live.free_blocks()
    return trajectory
