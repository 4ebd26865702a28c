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

Before that, what the engine ran is compared with what the scenario states
(:func:`engine_differences`: block size and spec of every KV-cache group, prefix
caching as resolved, ``max_model_len``, the model runner, the speculative method
and its tokens, the scheduler options the scenario states). A difference is an
error (:class:`EngineRanOtherwise`) naming both values and, where the recording
shows it, why vLLM chose its own: the checks would otherwise judge a
configuration the scenario does not describe.

A drafter or target the selected vLLM's registry lacks is ``unsupported`` before
any run; without CUDA (or with a vLLM that is not a CUDA build) the scenario is
skipped with the reason (:class:`~kvconform.errors.ScenarioSkipped`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvconform.errors import EngineRanOtherwise, ScenarioSkipped, VllmUnavailable
from kvconform.model.facts import EngineOutput, Fact
from kvconform.model.group_types import GROUP_TYPES, group_type_for_class
from kvconform.model.kinds import KINDS, Kind
from kvconform.model.methods import expected_lookahead, method_for
from kvconform.model.observations import (
    FreeEvent,
    GroupInfo,
    Observation,
    SlotEscape,
    SlotRecording,
    Trajectory,
)
from kvconform.model.parties import Party
from kvconform.model.scenario import Scenario
from kvconform.model.tiny_model import TinyModel
from kvconform.oracles import engine as engine_party
from kvconform.oracles.vllm import Vllm

# Where each engine run's raw recording is written as SCENARIO-ID.json, when set.
RECORDINGS_VARIABLE = "KVCONFORM_ENGINE_RECORDINGS"

# Poison and guard never occur in a real mapping: the slots check's wording for them
# ("kvconform's poison") is for the slots party's synthetic rows only.
_NO_POISON = -(2**31)


def settings_for(scenario: Scenario, resolved: bool = False) -> engine_party.EngineSettings:
    """What the engine child builds ``vllm.LLM`` with.

    ``resolved``: the scenario's settings were resolved against the selected vLLM
    (:func:`kvconform.oracles.resolve.resolve_settings`, as the runner does before the
    driver), so the model section's prefix caching and full-sequence admission are
    passed as resolved; otherwise only what the file states is, the rest left to vLLM.
    """
    engine = scenario.engine
    assert engine is not None
    spec = scenario.speculative
    model = scenario.model
    method = method_for(spec.method) if spec is not None else None

    def shape(tiny: TinyModel) -> TinyModel:
        return replace(tiny, max_position_embeddings=max(1024, model.max_model_len))

    def chosen(name: str) -> Any:
        return getattr(model, name) if resolved or name in model.stated else None

    return engine_party.EngineSettings(
        target=shape(engine.target),
        draft=shape(engine.draft) if engine.draft is not None else None,
        requests=tuple(engine.requests),
        method=spec.method if spec is not None else None,
        num_speculative_tokens=spec.num_speculative_tokens if spec is not None else 0,
        speculative_options=dict(method.speculative_options) if method is not None else {},
        model_runner=engine.model_runner,
        block_size=model.block_size,
        max_model_len=model.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        enable_prefix_caching=chosen("enable_caching"),
        scheduler_reserve_full_isl=chosen("scheduler_reserve_full_isl"),
        async_scheduling=engine.async_scheduling,
        enforce_eager=engine.enforce_eager,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        num_gpu_blocks_override=engine.num_gpu_blocks,
    )


def drive_engine(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: engine`` scenario on vLLM's real engine and record what it did.

    ``scenario`` is resolved (the runner resolves every scenario's settings first).
    """
    settings = settings_for(scenario, resolved=True)
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
    differences = engine_differences(scenario, recording)
    if differences:
        raise EngineRanOtherwise(recording.vllm_version or vllm.version, differences)
    return trajectory_from(scenario, recording)



def engine_differences(scenario: Scenario, recording: engine_party.EngineRecording) -> list[str]:
    """What the engine ran that the scenario does not state, each with both values and why.

    Pure: reads the recording (kvconform.oracles.engine.EngineRecording), so a
    hand-made one tests it on CPU. Compared: every KV-cache group's spec class and
    block size (engine scenarios state their groups' type and block size through the
    model section), and from the recorded configuration (absent in recordings made
    before kvconform recorded it): prefix caching against the resolved
    ``model.enable_caching``, full-sequence admission, ``max_model_len``, the model
    runner, the speculative method and ``num_speculative_tokens``, and the
    ``engine`` options the scenario states. The lookahead the engine reserves is not
    a setting but vLLM's answer for the method: the ``lookahead`` check judges it.
    """
    model, engine = scenario.model, scenario.engine
    assert engine is not None
    config = recording.config
    found: list[str] = []
    stated = {GROUP_TYPES[g.type].vllm_class: g.type for g in model.groups}
    for index, group in enumerate(recording.kv_groups):
        spec, size = group["spec"], int(group["block_size"])
        backend = group.get("backend")
        on = f" (attention backend {backend})" if backend else ""
        if spec not in stated:
            types = ", ".join(f"{name} ({cls})" for cls, name in stated.items())
            found.append(f"group {index} is vLLM's {spec}{on}, the scenario states {types}")
        want = model.groups[index].block_size if index < len(model.groups) else model.block_size
        if size != want:
            found.append(
                f"block size of group {index} ({spec}): the engine ran {size}, the scenario "
                f"states {want} ({_block_size_why(config, group, size, want)})"
            )
    if not config:
        return found
    spec_section = scenario.speculative

    def compare(what: str, ran: Any, want: Any, why: str = "", stated: bool = True) -> None:
        if ran is None or ran == want:
            return  # None: not recorded by this release
        says = "states" if stated else "takes vLLM's default for this release,"
        found.append(
            f"{what}: the engine ran {_shown(ran)}, the scenario {says} {_shown(want)}"
            + (f" ({why})" if why else "")
        )

    compare("prefix caching (enable_prefix_caching)", config.get("enable_prefix_caching"),
            model.enable_caching, "vLLM's CacheConfig.enable_prefix_caching after its checks",
            "enable_caching" in model.stated)  # fmt: skip
    compare("full-sequence admission (scheduler_reserve_full_isl)",
            config.get("scheduler_reserve_full_isl"), model.scheduler_reserve_full_isl,
            "vLLM's SchedulerConfig", "scheduler_reserve_full_isl" in model.stated)  # fmt: skip
    compare("max_model_len", config.get("max_model_len"), model.max_model_len,
            "vLLM's ModelConfig.max_model_len, capped by what the model's config allows")  # fmt: skip
    compare("model runner", config.get("model_runner"), engine.model_runner,
            "kvconform sets VLLM_USE_V2_MODEL_RUNNER; the worker built the runner "
            "VllmConfig.use_v2_model_runner chose")  # fmt: skip
    compare("speculative method", config.get("method") or "none",
            spec_section.method if spec_section is not None else "none")  # fmt: skip
    if spec_section is not None:
        compare("num_speculative_tokens", config.get("num_speculative_tokens"),
                spec_section.num_speculative_tokens)  # fmt: skip
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                 "async_scheduling"):  # fmt: skip
        want = getattr(engine, name)
        if want is not None:
            compare(f"engine.{name}", config.get(name), want, "vLLM's SchedulerConfig")
    return found


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _block_size_why(config: dict[str, Any], group: dict[str, Any], ran: int, want: int) -> str:
    """Why the engine's group has another block size, as far as the recording shows."""
    backend = group.get("backend")
    platform = config.get("platform")
    cache_size = config.get("block_size")
    user = config.get("user_specified_block_size")
    parts = []
    if cache_size is None:
        parts.append("the recording has no engine configuration to tell why")
    elif cache_size != want:
        taken = {
            True: "vLLM took it as the user's (CacheConfig.user_specified_block_size) and "
            "then changed it: Platform.update_block_size_for_backend aligns the block size "
            "of hybrid models and of mixed KV-cache dtypes",
            False: "vLLM did not take it as the user's (CacheConfig.user_specified_block_size "
            "is false), so Platform.update_block_size_for_backend set the attention "
            "backend's preferred size",
            None: "the platform's configuration pass changed it "
            "(Platform.update_block_size_for_backend)",
        }[user]
        parts.append(f"vLLM's CacheConfig.block_size became {cache_size} for the {want} "
                     f"kvconform passed: {taken}")  # fmt: skip
    elif ran % want == 0:
        parts.append(
            f"CacheConfig.block_size is {want}; vLLM multiplied the group's by {ran // want} "
            "when it built the KV-cache config (kv_cache_utils.unify_kv_cache_spec_page_size "
            "scales a smaller page up to the largest group's)"
        )
    else:
        parts.append(f"CacheConfig.block_size is {want}; vLLM built the group's spec with {ran}")
    if backend:
        parts.append(f"attention backend {backend}")
    if platform:
        parts.append(f"platform {platform}")
    return "; ".join(parts)


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
        parties=KINDS[Kind.ENGINE].recorded,
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
            party = Party.WARMUP if obs.live is None else Party.LIVE
            held = set((obs.block_ids if party == Party.LIVE else obs.warmup_block_ids) or ())
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
    # What the engine generated for each request, judged by checks.lifecycle.
    generated = {names.get(k, k): v for k, v in recording.outputs.items()}
    last = recording.steps[-1]["index"] if recording.steps else 0
    for name, request in scenario.requests.items():
        line = request.where.line if request.where is not None else None
        output = EngineOutput(generated.get(name), request.max_tokens)
        trajectory.facts.append(Fact(last, line, name, "after the last step", output))
    trajectory.all_finished = recording.free_blocks_after is not None and all(
        generated.get(name) == request.max_tokens for name, request in scenario.requests.items()
    )
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
