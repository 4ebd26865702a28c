"""``kvconform explain``: one scenario, every step, request and group, as a table.

For the developer adding a spec-decode method or a KV spec type: who held how
many blocks at each step, the lookahead and the floor it makes, why, and where a
party fell short (``!``) or the parties disagreed (``~``). Where the driver did not
decide the steps itself (scheduler mode), a line under each step says what vLLM
decided.
A startup scenario has no steps: one ``max_model_len`` request's floor per group,
against the pool vLLM's planning chose.

What to explain (:func:`find_targets`): ``FILE::ID`` (what every printed rerun
names), a file, an id under ``scenarios/`` (a matrix case's ``name[eagle-k3]``
too) or a matrix file's name. Where that names several scenarios, each runs and
only the ones that do not pass are drawn (all of them when every one passes is
too much to read: their verdicts are listed instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvconform.errors import ScenarioError, UsageError
from kvconform.harness.checks.startup import request_floor
from kvconform.harness.expectations import DEFAULT_SCENARIOS
from kvconform.harness.loader import load_paths
from kvconform.harness.loader.files import discover
from kvconform.harness.select import split_node
from kvconform.model.observations import GroupInfo, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.model.scenario import Scenario


@dataclass
class Targets:
    """The scenarios a target names, and whether it named exactly one."""

    scenarios: list[Scenario]
    errors: list[ScenarioError] = field(default_factory=list)
    exact: bool = False  # one scenario named by its id: draw it whatever its verdict


def find_targets(target: str, root: str = DEFAULT_SCENARIOS) -> Targets:
    """The scenarios ``target`` names: ``FILE::ID``, a file, or an id or name under
    ``root``. An id is looked for first in the files named like it (the default name
    of a scenario is its file's stem), then in every file."""
    file, scenario_id = split_node(target)
    if scenario_id is not None:
        if not Path(file).exists():
            raise UsageError(f"explain: no such file: {file}")
        loaded = load_paths([file])
        chosen = [s for s in loaded.scenarios if s.id == scenario_id]
        if not chosen and not loaded.errors:
            ids = ", ".join(s.id for s in loaded.scenarios)
            raise UsageError(f"explain: {file} has no scenario {scenario_id!r} (it has: {ids})")
        return Targets(chosen, loaded.errors, exact=True)
    if Path(target).exists():
        loaded = load_paths([target])
        return Targets(loaded.scenarios, loaded.errors, exact=len(loaded.scenarios) == 1)
    name = target.split("[", 1)[0]
    files = discover([root]) if Path(root).is_dir() else []
    likely = [f for f in files if f.stem == name]
    for paths in (likely, files):
        if not paths:
            continue
        loaded = load_paths(paths)
        exact = [s for s in loaded.scenarios if s.id == target]
        if exact:
            return Targets(exact, exact=True)
        named = [s for s in loaded.scenarios if s.name == target]
        if named:
            return Targets(named)
    raise UsageError(
        f"explain: no scenario {target!r} (give FILE::ID, a file, or an id or name under {root}/)"
    )


def to_draw(targets: Targets, results: list[ScenarioResult]) -> list[int]:
    """Which of the targets' results to draw: the one named, else those that did not pass."""
    if targets.exact or len(results) == 1:
        return list(range(len(results)))
    return [i for i, r in enumerate(results) if r.verdict not in (Verdict.PASSED, Verdict.SKIPPED)]


PARTIES = ((Party.LIVE, "live"), (Party.PREDICTED, "pred"), (Party.WARMUP, "wu"))


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
            f"  g{group.index} {group.label}, block {group.block_size}{_manager(group)}: "
            f"{group.floor_rule.reason}"
        )
    if trajectory.startup is not None:
        out.extend(_startup_lines(trajectory))
        return "\n".join(out + _verdict_lines(result))
    parties = [(attr, short) for attr, short in PARTIES if attr in trajectory.parties]
    # Warmup request ids (_v2_mixed_warmup_prefill_) and labels are longer than a
    # trajectory's; widen the columns to fit, within reason.
    req_w = min(max([8, *(len(o.request) for o in trajectory.observations)]), 28)
    act_w = min(max([22, *(len(o.label) for o in trajectory.observations)]), 48)
    header = (
        f"{'step':>4} {'line':>4} {'req':{req_w}} {'action':{act_w}} {'comp':>5} {'sched':>5} "
        f"{'look':>4}"
    )
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
                f"{obs.computed:>5} {obs.scheduled:>5} {obs.lookahead:>4}"
            ]
        cells = " ".join(
            f"{_cell(getattr(obs, attr), obs.floor, obs.predicted_max if attr != Party.PREDICTED else None):>4}"
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
    out.append(
        "columns: comp computed, sched scheduled, look the lookahead the floor counts (the "
        "drafter's positions past the scheduled ones); marks: ! below the floor, ~ differs "
        "from the predictor's running maximum"
    )
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


def _manager(group: GroupInfo) -> str:
    """", vLLM's SlidingWindowManager (vllm/v1/core/single_type_kv_cache_manager.py)": the
    manager class vLLM dispatched the group to, where the driver asked."""
    if group.manager is None:
        return ""
    where = f" ({group.manager_file})" if group.manager_file else ""
    return f", vLLM's {group.manager}{where}"


_WHY = " (why: "


def _without_why(message: str) -> tuple[str, str | None]:
    """A message and its closing ``(why: ...)`` aside, apart (the floor rule's reason)."""
    start = message.rfind(_WHY)
    if start < 0 or not message.endswith(")"):
        return message, None
    return message[:start], message[start + len(_WHY) : -1]


def _verdict_lines(result: ScenarioResult) -> list[str]:
    """The verdict, then each record with the manager class vLLM dispatched its group to;
    each reason once, under the records (the groups' floor reasons are above already)."""
    out = [
        f"verdict: {result.verdict.value}"
        + (f" ({result.expectation})" if result.expectation else "")
    ]
    trajectory = result.trajectory
    groups = trajectory.groups if trajectory is not None else ()
    said = {g.floor_rule.reason for g in groups}
    whys: list[str] = []
    for failure in result.failures:
        message, why = _without_why(failure.message)
        manager = ""
        if failure.group is not None and failure.group < len(groups):
            group = groups[failure.group]
            if group.manager is not None:
                manager = f" [{group.manager}, {group.manager_file or '?'}]"
        out.append(f"  [{failure.check}] {message}{manager}")
        if why is not None and why not in said and why not in whys:
            whys.append(why)
    out.extend(f"  why: {why}" for why in whys)
    if result.error:
        out.append(f"  {result.error}")
    return out
