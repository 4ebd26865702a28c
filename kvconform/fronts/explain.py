"""``kvconform explain``: one scenario, every step, request and group, as a table.

For the developer adding a spec-decode method or a KV spec type: who held how
many blocks at each step, what the floor was and why, and where a party fell
short (``!``) or the parties disagreed (``~``). Where the driver did not decide
the steps itself (scheduler mode), a line under each step says what vLLM decided.
A startup scenario has no steps: one ``max_model_len`` request's floor per group,
against the pool vLLM's planning chose.
"""

from __future__ import annotations

from kvconform.harness.checks.startup import request_floor
from kvconform.model.observations import Trajectory
from kvconform.model.results import ScenarioResult
from kvconform.model.scenario import Scenario

PARTIES = (("live", "live"), ("predicted", "pred"), ("warmup", "wu"))


def _cell(value: int | None, floor: int, reference: int | None) -> str:
    if value is None:
        return "-"
    mark = "!" if value < floor else ("~" if reference is not None and value != reference else "")
    return f"{value}{mark}"


def explain(scenario: Scenario, result: ScenarioResult, version: str) -> str:
    out = [f"scenario {scenario.id}  ({scenario.file}:{scenario.line})"]
    if scenario.description:
        out.append(f"  {scenario.description}")
    trajectory = result.trajectory
    if trajectory is None:
        out.append(f"verdict: {result.verdict.value}: {result.error}")
        return "\n".join(out)
    spec = scenario.speculative
    method = f"{spec.method} k={spec.num_speculative_tokens}" if spec else "no speculation"
    out.append(
        f"vLLM {version}; {method}; lookahead {trajectory.lookahead} from {trajectory.lookahead_source} "
        f"(kvconform expects {trajectory.expected_lookahead}); parties: {', '.join(trajectory.parties)}"
    )
    for note in trajectory.notes:
        out.append(f"note: {note}")
    out.append("groups:")
    for group in trajectory.groups:
        out.append(
            f"  g{group.index} {group.label}, block {group.block_size}: {group.floor_rule.reason}"
        )
    if trajectory.startup is not None:
        out.extend(_startup_lines(trajectory))
        return "\n".join(out + _verdict_lines(result))
    parties = [(attr, short) for attr, short in PARTIES if attr in trajectory.parties]
    # Warmup request ids (_v2_mixed_warmup_prefill_) and labels are longer than a
    # trajectory's; widen the columns to fit, within reason.
    req_w = min(max([8, *(len(o.request) for o in trajectory.observations)]), 28)
    act_w = min(max([22, *(len(o.label) for o in trajectory.observations)]), 48)
    header = f"{'step':>4} {'line':>4} {'req':{req_w}} {'action':{act_w}} {'comp':>5} {'sched':>5}"
    for group in trajectory.groups:
        header += f" | g{group.index} floor " + " ".join(f"{short:>4}" for _, short in parties)
    out.append(header)
    rows: dict[tuple[int, str], list[str]] = {}
    for obs in trajectory.observations:
        key = (obs.step, obs.request)
        if key not in rows:
            rows[key] = [
                f"{obs.step:>4} {obs.line or '':>4} {obs.request[:req_w]:{req_w}} "
                f"{obs.label[:act_w]:{act_w}} "
                f"{obs.computed:>5} {obs.scheduled:>5}"
            ]
        cells = " ".join(
            f"{_cell(getattr(obs, attr), obs.floor, obs.predicted_max if attr != 'predicted' else None):>4}"
            for attr, _ in parties
        )
        rows[key].append(f" | {'':2} {obs.floor:>5} {cells}")
    last_step: int | None = None
    for (step, _), parts in rows.items():
        if last_step is not None and step != last_step and last_step in trajectory.step_notes:
            out.append(f"{'':>10}^ {trajectory.step_notes[last_step]}")
        out.append("".join(parts))
        last_step = step
    if last_step is not None and last_step in trajectory.step_notes:
        out.append(f"{'':>10}^ {trajectory.step_notes[last_step]}")
    out.append("marks: ! below the floor, ~ differs from the predictor's running maximum")
    return "\n".join(out + _verdict_lines(result))


def _startup_lines(trajectory: Trajectory) -> list[str]:
    """A startup scenario has no steps: one max_model_len request's floor against the pool."""
    record = trajectory.startup
    assert record is not None
    floors = request_floor(trajectory, record.max_model_len)
    pool = (
        f"vLLM chose a pool of {record.num_blocks} blocks ({record.num_blocks - 1} usable, the "
        "null block kept back)"
        if record.num_blocks is not None
        else f"vLLM refused; the pool would have been {record.pool} blocks ({record.pool - 1} usable)"
    )
    return [
        f"one request of max_model_len {record.max_model_len}: "
        + ", ".join(f"g{g.index} floor {n}" for g, n in zip(trajectory.groups, floors, strict=True))
        + f", {sum(floors)} in all; {pool}"
    ]


def _verdict_lines(result: ScenarioResult) -> list[str]:
    out = [
        f"verdict: {result.verdict.value}"
        + (f" ({result.expectation})" if result.expectation else "")
    ]
    for failure in result.failures:
        out.append(f"  [{failure.check}] {failure.message}")
    if result.error:
        out.append(f"  {result.error}")
    return out
