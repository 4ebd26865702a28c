"""The engine driver: vLLM's real engine run, turned into observations the checks judge.

A ``kind: engine`` scenario is run by the engine party
(:mod:`kvconform.oracles.engine`): ``vllm.LLM`` with a tiny model, watched by
hooks. This driver turns its :class:`~kvconform.oracles.engine.EngineRecording`
into a :class:`Trajectory`:

* one :class:`Observation` per executed step, request and KV-cache group. Steps
  the V2 warmup issued put their holding in the ``warmup`` party, serving steps
  in ``live`` (the engine's own scheduler and ``KVCacheManager`` decided it);
  the floor is kvconform's, with the lookahead of kvconform's table for the
  method, and the lookahead check compares it with the engine's own;
* the slot mappings the V2 runner and the drafter computed, as a
  :class:`SlotRecording` whose escapes are the written positions whose slot is
  not in a block the request held at that step (the null block, another
  request's block, or none); the ``slots`` check reads it as it reads the
  slots party's;
* a sanity failure for every request the engine did not finish with its
  ``max_tokens``, and the pool's free blocks after the run for the leak check.

Without CUDA (or with a vLLM that is not a CUDA build) the scenario is skipped
with the reason (:class:`~kvconform.errors.ScenarioSkipped`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from kvconform.errors import ScenarioSkipped, VllmUnavailable
from kvconform.model.group_types import GROUP_TYPES, group_type_for_class
from kvconform.model.methods import expected_lookahead
from kvconform.model.observations import (
    FreeEvent,
    GroupInfo,
    Observation,
    SlotEscape,
    SlotRecording,
    Trajectory,
)
from kvconform.model.scenario import Scenario
from kvconform.model.tiny_model import TinyModel
from kvconform.oracles import engine as engine_party
from kvconform.oracles.vllm import Vllm

# Where each engine run's raw recording is written as SCENARIO-ID.json, when set.
RECORDINGS_VARIABLE = "KVCONFORM_ENGINE_RECORDINGS"

# Poison and guard never occur in a real mapping: the slots check's wording for them
# ("kvconform's poison") is for the slots party's synthetic rows only.
_NO_POISON = -(2**31)


def settings_for(scenario: Scenario) -> engine_party.EngineSettings:
    engine = scenario.engine
    assert engine is not None
    spec = scenario.speculative

    def shape(model: TinyModel) -> TinyModel:
        return replace(model, max_position_embeddings=max(1024, scenario.model.max_model_len))

    return engine_party.EngineSettings(
        target=shape(engine.target),
        draft=shape(engine.draft) if engine.draft is not None else None,
        requests=tuple(engine.requests),
        method=spec.method if spec is not None else None,
        num_speculative_tokens=spec.num_speculative_tokens if spec is not None else 0,
        model_runner=engine.model_runner,
        block_size=scenario.model.block_size,
        max_model_len=scenario.model.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        enable_prefix_caching=scenario.model.enable_caching,
        async_scheduling=engine.async_scheduling,
        enforce_eager=engine.enforce_eager,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        num_gpu_blocks_override=engine.num_gpu_blocks,
    )


def drive_engine(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: engine`` scenario on vLLM's real engine and record what it did."""
    settings = settings_for(scenario)
    # What this release cannot build is unsupported here, whether or not a GPU is.
    engine_party.check_buildable(settings, vllm.version)
    reason = engine_party.unavailable_reason()
    if reason is not None:
        raise ScenarioSkipped(f"engine mode cannot run here: {reason}")
    recording = engine_party.run_engine(settings)
    keep = os.environ.get(RECORDINGS_VARIABLE)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{scenario.id}.json").write_text(recording.to_json())
    return trajectory_from(scenario, recording)


def request_names(scenario: Scenario, recording: engine_party.EngineRecording) -> dict[str, str]:
    """Engine request id -> scenario name (vLLM appends ``-<8 hex>`` to the ids it is given)."""
    names = set(scenario.requests)
    found: dict[str, str] = {}
    for step in recording.steps:
        for row in step["requests"]:
            engine_id = row["request"]
            if engine_id in names:
                found[engine_id] = engine_id
            elif engine_id.rpartition("-")[0] in names:
                found[engine_id] = engine_id.rpartition("-")[0]
    return found


def trajectory_from(scenario: Scenario, recording: engine_party.EngineRecording) -> Trajectory:
    """The observations, slot escapes and notes of one engine run (no vLLM needed)."""
    model = scenario.model
    groups = []
    for index, group in enumerate(recording.kv_groups or [{"spec": "FullAttentionSpec",
                                                           "block_size": model.block_size}]):  # fmt: skip
        group_type = group_type_for_class(group["spec"])
        if group_type is None:
            raise VllmUnavailable(
                recording.vllm_version, f"a kvconform group type for {group['spec']}",
                "the engine built a KV-cache group kvconform has no floor for",
            )  # fmt: skip
        name = next(n for n, t in GROUP_TYPES.items() if t is group_type)
        size = int(group["block_size"])
        groups.append(GroupInfo(index, name, size, name, group_type.holds_null,
                                {"block_size": size, "max_model_len": model.max_model_len}))  # fmt: skip
    spec = scenario.speculative
    method = spec.method if spec is not None else None
    k = spec.num_speculative_tokens if spec is not None else 0
    expected = expected_lookahead(method, k) if method is not None else 0
    engine_lookahead = recording.lookahead if recording.lookahead is not None else expected
    if engine_lookahead is None:
        raise VllmUnavailable(recording.vllm_version, "the engine's lookahead",
                              recording.lookahead_source)  # fmt: skip
    floor_lookahead = expected if expected is not None else engine_lookahead
    trajectory = Trajectory(
        tuple(groups),
        engine_lookahead,
        recording.lookahead_source,
        model.max_model_len,
        floor_lookahead=floor_lookahead,
        method=method,
        num_speculative_tokens=k,
        vllm_lookahead=recording.lookahead,
        expected_lookahead=expected,
        parties=("live", "warmup"),
        exclusive_blocks=not model.enable_caching,
    )
    names = request_names(scenario, recording)
    floor_rules = [info.floor_rule.blocks for info in trajectory.groups]
    where: dict[tuple[int, str, int], int] = {}  # (step, engine id, group) -> observation
    counts = {"warmup": 0, "serving": 0, "startup": 0}
    for step in recording.steps:
        phase = step["phase"]
        counts[phase] = counts.get(phase, 0) + 1
        for engine_id in step["finished"]:
            trajectory.events.append(
                # The worker sees the request leave, not the pool's counts: the event
                # releases its blocks for the ownership check, the leak check reads the
                # pool after the run instead.
                FreeEvent(
                    len(trajectory.observations),
                    step["index"],
                    None,
                    names.get(engine_id, engine_id),
                    "finish",
                    (),
                    0,
                    0,
                    (),
                )  # fmt: skip
            )
        for row in step["requests"]:
            name = names.get(row["request"], row["request"])
            drafts = f", {row['drafts']} drafts" if row["drafts"] else ""
            label = f"{phase} #{counts[phase]}: {row['computed']} computed + {row['scheduled']} scheduled{drafts}"
            for g, info in enumerate(groups):
                held = row["blocks"][g] if g < len(row["blocks"]) else []
                floor = floor_rules[g](info.floor_input(row["computed"], row["scheduled"],
                                                        floor_lookahead, 0))  # fmt: skip
                serving = phase != "warmup"
                where[(step["index"], row["request"], g)] = len(trajectory.observations)
                trajectory.observations.append(
                    Observation(
                        step["index"], None, name, label, g, row["computed"], row["scheduled"],
                        floor_lookahead, floor,
                        len(held) if serving else None, None, None,
                        None if serving else len(held),
                        held if serving else None,
                        None if serving else held,
                    )
                )  # fmt: skip
    trajectory.slots = slot_recording(trajectory, recording, where)
    _finish(scenario, recording, trajectory, names, counts)
    return trajectory


def slot_recording(trajectory: Trajectory, recording: engine_party.EngineRecording,
                   where: dict[tuple[int, str, int], int]) -> SlotRecording:  # fmt: skip
    slots = SlotRecording(poison=_NO_POISON, guard=_NO_POISON)
    if not recording.mappings:
        slots.skipped = (
            "the V1 model runner's slot mappings are not hooked (engine mode hooks the V2 "
            "runner's BlockTables.compute_slot_mappings)"
            if recording.model_runner == "v1"
            else "the engine's runner computed no slot mappings kvconform could see"
        )
        return slots
    slots.mode = (
        f"vLLM {recording.vllm_version}'s engine on {recording.device}: the slot mappings "
        "BlockTables.compute_slot_mappings returned to the V2 model runner and its drafter"
    )
    slots.groups_mapped = tuple(g.index for g in trajectory.groups)
    sizes, per = recording.block_sizes, recording.blocks_per_kv_block
    seen_steps = set()
    for call in recording.mappings:
        slots.kernel_calls += 1
        seen_steps.add(call["step"])
        for row in call["rows"]:
            g = row["group"]
            index = where.get((call["step"], row["request"], g))
            if index is None:
                continue  # a row of a request this step did not schedule (padding)
            obs = trajectory.observations[index]
            party = "warmup" if obs.live is None else "live"
            held = set((obs.block_ids if party == "live" else obs.warmup_block_ids) or ())
            slots.rows += 1
            kernel_size = sizes[g] if g < len(sizes) else trajectory.groups[g].block_size
            per_kv = per[g] if g < len(per) else 1
            for position, slot in zip(row["positions"], row["slots"], strict=False):
                slots.positions += 1
                block = (slot // kernel_size) // per_kv if slot >= 0 else slot
                if slot >= 0 and block in held and block != trajectory.null_block:
                    continue
                slots.escapes.append(
                    SlotEscape(
                        index,
                        party,
                        call["role"],
                        position,
                        position // trajectory.groups[g].block_size,
                        slot,
                        block,
                        None,
                        None,
                    )  # fmt: skip
                )
    slots.steps = len(seen_steps)
    # A drafter call maps one position of every request; the slots check reports one
    # failure per run of consecutive positions of one request, so order them that way.
    slots.escapes.sort(key=lambda e: (e.observation, e.party, e.role, e.position))
    return slots


def _finish(scenario: Scenario, recording: engine_party.EngineRecording, trajectory: Trajectory,
            names: dict[str, str], counts: dict[str, int]) -> None:  # fmt: skip
    generated = {names.get(k, k): v for k, v in recording.outputs.items()}
    for name, request in scenario.requests.items():
        got = generated.get(name)
        if got is None:
            trajectory.unfinished.append(
                f"the engine never finished request {name} (max_tokens {request.max_tokens})"
            )
        elif got != request.max_tokens:
            trajectory.unfinished.append(
                f"the engine finished request {name} with {got} tokens, not its max_tokens "
                f"{request.max_tokens}"
            )
    trajectory.all_finished = not trajectory.unfinished and recording.free_blocks_after is not None
    trajectory.final_free_blocks = recording.free_blocks_after
    trajectory.num_blocks = recording.pool_blocks or 0
    up = recording.seconds.get("engine_up")
    trajectory.notes.append(
        f"vLLM {recording.vllm_version}'s real engine on {recording.device} ({recording.model_runner} "
        f"model runner): up in {up} s, {counts.get('warmup', 0)} warmup and "
        f"{counts.get('serving', 0)} serving steps executed, {len(recording.mappings)} slot "
        f"mappings seen; lookahead {recording.lookahead} from {recording.lookahead_source}"
    )
    trajectory.notes.extend(recording.notes)
