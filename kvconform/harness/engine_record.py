"""Record -> replay: an engine run written as a ``kind: trajectory`` scenario.

``kvconform engine record SCENARIO --out FILE.yaml`` runs an engine scenario (or reads
a recording an earlier run kept, ``--from RECORDING.json``) and writes the steps the
engine executed as a trajectory scenario: the same requests, and per executed step
the action that makes kvconform's trajectory driver call the live ``KVCacheManager``
with the engine's own (computed, scheduled) counts. A GPU finding becomes a CPU
scenario anyone can rerun, against any vLLM.

How a recorded row becomes an action (the trajectory format's token arithmetic,
``kvconform/model/tokens.py``):

* computed below the prompt: ``{prefill: scheduled}``;
* drafts scheduled: ``{spec: drafts, accepted: A}``, where A is the next record's
  computed count minus this one's minus 1 (the engine's scheduler advanced the request
  by the sampled token and A drafts; with async scheduling that count is the
  scheduler's optimistic one, exactly what it reserved blocks for);
* neither: ``decode``; a request the worker was told finished, or still open at the
  end: ``finish``.

``--phase warmup`` writes the steps ``warmup_kernels`` issued instead, as the live
allocator would schedule them: replayed, they show what the allocator reserves for
the token counts the warmup built its block tables for.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvconform.errors import UsageError
from kvconform.harness.drivers.engine import request_names
from kvconform.model.scenario import Scenario
from kvconform.oracles.engine import EngineRecording


def trajectory_yaml(scenario: Scenario, recording: EngineRecording, phase: str = "serving") -> str:
    """The recorded ``phase`` of ``recording`` as the text of a trajectory scenario."""
    names = request_names(scenario, recording)
    steps = [s for s in recording.steps if s["phase"] == phase]
    rows: dict[str, list[tuple[int, dict]]] = {}
    prompt_lens: dict[str, int] = {}
    for position, step in enumerate(steps):
        for row in step["requests"]:
            name = names.get(row["request"], row["request"])
            if row.get("resumed"):
                raise UsageError(
                    f"request {name} was preempted and resumed in the recorded run; "
                    "record does not write preemptions yet"
                )
            if row.get("new"):
                prompt_lens[name] = row.get("prompt_len") or scenario.requests[name].prompt_len
            rows.setdefault(name, []).append((position, row))
    if not rows:
        raise UsageError(f"the recording has no {phase} steps")
    actions: list[dict[str, str]] = [{} for _ in steps]
    k = max((row["drafts"] for seq in rows.values() for _, row in seq), default=0)
    for name, seq in rows.items():
        for i, (position, row) in enumerate(seq):
            computed, scheduled, drafts = row["computed"], row["scheduled"], row["drafts"]
            if computed < prompt_lens[name]:
                actions[position][name] = f"{{prefill: {scheduled}}}"
            elif drafts:
                following = seq[i + 1][1]["computed"] if i + 1 < len(seq) else None
                accepted = drafts if following is None else following - computed - 1
                if not 0 <= accepted <= drafts:
                    raise UsageError(
                        f"request {name}: computed goes from {computed} to {following} after "
                        f"{drafts} drafts; not a speculative step the trajectory format can write"
                    )
                actions[position][name] = f"{{spec: {drafts}, accepted: {accepted}}}"
            else:
                actions[position][name] = "decode"
    finished_at: dict[str, int] = {}
    for position, step in enumerate(steps):
        for engine_id in step["finished"]:
            name = names.get(engine_id, engine_id)
            if name in rows and name not in actions[position]:
                finished_at.setdefault(name, position)
    last: dict[str, str] = {}
    for name in rows:
        if name in finished_at:
            actions[finished_at[name]][name] = "finish"
        else:
            last[name] = "finish"
    peak = max(
        sum(len(b) for row in s["requests"] for b in row["blocks"]) for s in steps if s["requests"]
    )
    spec = scenario.speculative
    model = scenario.model
    lines = [
        f"# Recorded by `kvconform engine record` from vLLM {recording.vllm_version}'s engine on "
        f"{recording.device}",
        f"# ({recording.model_runner} model runner, {phase} steps of scenario {scenario.id}): each "
        "step is one SchedulerOutput the worker executed.",
        f"name: {scenario.name}-{phase}-recorded",
        "description: >",
        f"  The {phase} steps vLLM {recording.vllm_version}'s real engine executed for "
        f"{scenario.id}, replayed",
        "  through the live KVCacheManager with the same computed and scheduled counts.",
        f"tags: [engine-recorded, {phase}]",
        "kind: trajectory",
        "model:",
        f"  block_size: {model.block_size}",
        f"  max_model_len: {model.max_model_len}",
        f"  num_blocks: {max(64, 2 * peak + 1)}",
    ]
    if spec is not None:
        lines += ["speculative:", f"  method: {spec.method}",
                  f"  num_speculative_tokens: {max(k, spec.num_speculative_tokens)}"]  # fmt: skip
    lines.append("requests:")
    lines += [f"  {name}: {{prompt_len: {prompt_lens[name]}}}" for name in rows]
    lines.append("steps:")
    for position, step_actions in enumerate(actions):
        if step_actions:
            body = ", ".join(f"{name}: {action}" for name, action in step_actions.items())
            lines.append(f"  - {{{body}}}  # engine step {steps[position]['index']}")
    if last:
        lines.append("  - {" + ", ".join(f"{n}: finish" for n in last) + "}")
    return "\n".join(lines) + "\n"


def record(
    scenario: Scenario, recording: EngineRecording | None, phases: Sequence[str]
) -> dict[str, str]:
    """{phase: scenario text}; runs the engine when no recording is given."""
    if recording is None:
        from kvconform.harness.drivers.engine import settings_for
        from kvconform.oracles import engine as engine_party

        reason = engine_party.unavailable_reason()
        if reason is not None:
            raise UsageError(f"engine mode cannot run here: {reason} (give --from RECORDING.json)")
        recording = engine_party.run_engine(settings_for(scenario))
    return {phase: trajectory_yaml(scenario, recording, phase) for phase in phases}
