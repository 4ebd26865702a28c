"""The scheduler driver: a ``kind: scheduler`` scenario through vLLM's real scheduler.

:mod:`kvconform.oracles.scheduler` steps vLLM's ``Scheduler`` or
``AsyncScheduler`` to the end and records what it did; this driver turns those
records into the same :class:`Observation` and :class:`FreeEvent` rows the
allocator driver produces, so the ``floor``, ``agree``, ``lookahead`` and
``sanity`` checks judge scheduler runs unchanged.

What each row compares:

* **live** -- the blocks the scheduler's own ``KVCacheManager`` holds for the
  request right after ``schedule()``.
* **floor** -- the group's floor rule for the counts *as the scheduler keeps
  them*: ``computed`` is ``num_computed_tokens`` before the step (a prefix-cache
  hit adopted at admission included) and ``scheduled`` the tokens it scheduled,
  drafts included; the lookahead is what the drafter writes by kvconform's
  table (the scheduler's ``num_lookahead_tokens`` where the table lacks the
  method; the two differ exactly when the ``lookahead`` check fails).
  Under async scheduling ``num_computed_tokens`` already counts the steps still
  in flight as if all their drafts were accepted: the scheduler cannot know yet
  how many will be, so the most the drafter may write is what must be covered.
* **predicted** -- vLLM's warmup predictor ``_reserved_block_count`` for
  ``computed + scheduled`` tokens, and its running maximum since the request
  last (re)started, as in allocator mode.

* **remote KV loads** -- a request prefilled remotely (``remote_prefill``) gets a
  row at the step it begins loading its KV asynchronously: ``computed`` the
  tokens its blocks are for (local prefix hit plus the remote KV), nothing
  scheduled and no lookahead, for nothing runs on it until the KV has arrived;
  no prediction (the warmup has no loads). The row's index goes to
  ``Trajectory.async_loads``, where the ``lookahead`` check holds it to
  exactly those blocks (vLLM limits the lookahead while KV loads).

The scheduler's decisions go beside the holdings: each row's label says what
was scheduled for the request (``new, prefill 64/100``, ``verify 1+3 acc 1``,
``resumed, hit 32, prefill 88``), ``Trajectory.step_notes`` what happened in the step
(admissions, preemptions, finishes, batches in flight, free blocks), and a
note on the trajectory sums it up.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from kvconform.errors import KvconformError
from kvconform.harness.drivers.common import attach_predictor, keep_in_progress
from kvconform.harness.drivers.scheduler_hits import lookup_facts
from kvconform.model.facts import Fact, PrefillChunks, SchedulerReset, StatedAdmission
from kvconform.model.floors import FloorInput
from kvconform.model.observations import (
    Denial,
    FreeEvent,
    KvLoad,
    Observation,
    Trajectory,
)
from kvconform.model.scenario import Scenario
from kvconform.oracles.resolve import new_trajectory
from kvconform.oracles.scheduler import (
    AbortRecord,
    DeferredFreeRecord,
    FreeRecord,
    LoadDoneRecord,
    LoadRecord,
    ScheduledRequest,
    SchedulerRun,
    StepFact,
    StepRecord,
    run_scheduler,
)
from kvconform.oracles.vllm import Vllm


def decision_label(row: ScheduledRequest) -> str:
    """What the scheduler scheduled for one request in one step, in a few words."""
    prefix = {"new": "new, ", "resumed": "resumed, ", "turn": "next turn, "}.get(row.phase, "")
    if row.phase == "loaded":
        prefix = f"remote KV {row.cached} loaded, "
    elif row.cached:
        prefix += f"hit {row.cached}, "
    pending = row.known_tokens - row.computed
    if row.drafts:
        core = f"verify 1+{row.drafts} acc {row.accepted}"
    elif row.prefill_chunk or pending > 1:
        core = (
            f"prefill {row.scheduled}/{pending}"
            if row.scheduled < pending
            else (f"prefill {row.scheduled}")
        )
    else:
        core = "decode" if row.scheduled == 1 else f"decode {row.scheduled} (padded)"
    return prefix + core


def drive_scheduler(scenario: Scenario, vllm: Vllm) -> Trajectory:
    """Run a ``kind: scheduler`` scenario through vLLM's scheduler and record every step.

    Where vLLM (or kvconform's oracle) raises in a step, the steps recorded before it
    become the trajectory the runner keeps with the crash (:func:`keep_in_progress`).
    """
    trajectory = new_trajectory(scenario, vllm)
    contract_lookahead = trajectory.expected_lookahead if trajectory.method is not None else 0
    started: list[SchedulerRun] = []
    try:
        record = run_scheduler(
            vllm,
            scenario,
            trajectory.num_speculative_tokens,
            trajectory.groups,
            trajectory.lookahead if contract_lookahead is None else contract_lookahead,
            started=started.append,
        )
    except KvconformError:
        raise  # bad input, or what the release lacks: no crash, nothing to keep
    except Exception:
        if started:
            _keep_partial(trajectory, started[0], scenario, vllm)
        raise
    return _trajectory_of(trajectory, record, scenario, vllm)


def _keep_partial(
    trajectory: Trajectory, record: SchedulerRun, scenario: Scenario, vllm: Vllm
) -> None:
    """Hand the runner the steps recorded up to an exception, as rows like a whole run's."""
    try:
        keep_in_progress(_trajectory_of(trajectory, record, scenario, vllm))
    except Exception:  # noqa: BLE001 - the exception on its way up is the one to report
        pass


def _trajectory_of(
    trajectory: Trajectory, record: SchedulerRun, scenario: Scenario, vllm: Vllm
) -> Trajectory:
    """``trajectory`` filled with the rows and facts of what the scheduler did."""
    model = scenario.model
    # Async scheduling schedules a step before the previous ones' outputs are processed.
    trajectory.steps_in_flight = {"sync": 0, "async": 1}.get(
        record.mode, record.max_concurrent_batches
    )
    if record.lookahead is not None:
        trajectory.lookahead = record.lookahead
        trajectory.lookahead_source = f"{record.scheduler_class}.num_lookahead_tokens"
        if trajectory.method is not None:
            # The lookahead check judges the value the scheduler actually uses.
            trajectory.vllm_lookahead = record.lookahead
        if record.config_lookahead is not None and record.config_lookahead != record.lookahead:
            trajectory.notes.append(
                f"{record.scheduler_class}.num_lookahead_tokens is {record.lookahead} but "
                f"VllmConfig.num_lookahead_tokens is {record.config_lookahead}"
            )
    lookahead = trajectory.lookahead
    # The floor takes what the drafter writes by kvconform's table; where the table
    # lacks the method, the scheduler's own lookahead.
    floor_lookahead = trajectory.expected_lookahead if trajectory.method is not None else 0
    if floor_lookahead is None:
        floor_lookahead = lookahead
    trajectory.floor_lookahead = floor_lookahead
    predictor = attach_predictor(trajectory, vllm, model, record.null_block)
    trajectory.all_finished = len(record.finished) == len(scenario.requests)
    trajectory.final_free_blocks = record.final_free_blocks
    if record.stall is not None:
        stall = record.stall
        where = scenario.requests[stall.request].where
        trajectory.denials.append(
            Denial(
                stall.step, where.line if where else None, stall.request,
                f"waiting {stall.request}", "schedule", stall.floor_need, stall.available,
                stall.free, stall.detail, stall.cause,
            )
        )  # fmt: skip
    trajectory.encoder_lens = {name: 0 for name in scenario.requests}

    floor_rules = [info.floor_rule.blocks for info in trajectory.groups]
    predict = (
        [predictor.for_group(g) for g in range(len(model.groups))] if predictor.available else []
    )
    predict_load = (
        [predictor.for_load(g) for g in range(len(model.groups))] if predictor.available else []
    )
    lines = trajectory.request_lines = {
        name: (req.where.line if req.where else None) for name, req in scenario.requests.items()
    }
    predicted_max: dict[str, list[int]] = {}
    notes: dict[int, list[str]] = defaultdict(list)
    loads: dict[str, int] = {}  # request -> its load in flight (Trajectory.kv_loads)
    observations = trajectory.observations
    for event in record.events:
        if isinstance(event, FreeRecord):
            predicted_max.pop(event.request, None)
            notes[event.step].append(f"{event.kind} {event.request}")
            trajectory.events.append(
                FreeEvent(
                    len(observations),
                    event.step,
                    lines[event.request],
                    event.request,
                    event.kind,
                    event.held,
                    event.free_before,
                    event.free_after,
                    event.held_after,
                )
            )
            continue
        if isinstance(event, LoadRecord):
            notes[event.step].append(f"{event.request} loads {event.tokens} tokens of remote KV")
            _load_rows(trajectory, event, lines[event.request], floor_rules)
            if predictor.available:
                # The load's blocks stay in the table when it fails at a block under
                # kv_load_failure_policy recompute (the computed count is cut to the valid
                # prefix and the rest recomputed into them), as a rejected draft's do: the
                # running maximum starts from what the predictor gives the loaded tokens,
                # without the lookahead, which vLLM does not allocate for a load (the
                # drafter's blocks come with the first step, whose prediction counts them).
                maxima = predicted_max.setdefault(event.request, [0] * len(model.groups))
                for g in range(len(model.groups)):
                    maxima[g] = max(maxima[g], predict_load[g](event.tokens, 0))
            loads[event.request] = len(trajectory.kv_loads)
            trajectory.kv_loads.append(
                KvLoad(
                    event.request,
                    lines[event.request],
                    event.step,
                    tuple(tuple(ids) for ids in event.loading),
                )
            )
            continue
        if isinstance(event, LoadDoneRecord):
            notes[event.step].append(f"{event.request}'s remote KV received")
            if event.request in loads:
                index = loads.pop(event.request)
                trajectory.kv_loads[index] = trajectory.kv_loads[index]._replace(done=event.step)
            continue
        if isinstance(event, AbortRecord):
            notes[event.step].append(f"{event.request} aborted ({event.status})")
            if event.request in loads:
                index = loads[event.request]
                trajectory.kv_loads[index] = trajectory.kv_loads[index]._replace(aborted=event.step)
            continue
        _step_note(event, notes[event.step])
        for row in event.requests:
            label = decision_label(row)
            # What the scenario states of an admission, with what vLLM did (check sanity).
            stated = (
                ("hit", row.cached, scenario.requests[row.request].expect_hit)
                if row.phase == "new"
                else ("loaded", row.computed, scenario.requests[row.request].expect_loaded)
                if row.phase == "loaded"
                else None
            )
            if stated is not None and stated[2] is not None:
                trajectory.facts.append(
                    Fact(
                        event.step,
                        lines[row.request],
                        row.request,
                        label,
                        StatedAdmission(stated[0], stated[1], stated[2]),
                    )
                )
            maxima = predicted_max.setdefault(row.request, [0] * len(model.groups))
            if not row.drafts and (row.prefill_chunk or row.known_tokens - row.computed > 1):
                trajectory.prefill_rows.update(
                    range(len(observations), len(observations) + len(model.groups))
                )
            for g, info in enumerate(trajectory.groups):
                floor = floor_rules[g](
                    info.floor_input(row.computed, row.scheduled, floor_lookahead, 0)
                )
                if row.replay_start and model.groups[g].options.get("bounded_replay"):
                    trajectory.read_bounds[len(observations)] = row.replay_start
                predicted = pmax = None
                # A replayed hit holds the whole hit's blocks while its computed count
                # is rewound to the replay start: the warmup predictor has no such step.
                if predictor.available and not row.replay_start:
                    predicted = predict[g](row.computed + row.scheduled, 0)
                    pmax = maxima[g] = max(maxima[g], predicted)
                observations.append(
                    Observation(
                        event.step,
                        lines[row.request],
                        row.request,
                        label,
                        g,
                        row.computed,
                        row.scheduled,
                        floor_lookahead,
                        floor,
                        len(row.block_ids[g]),
                        predicted,
                        pmax,
                        None,
                        row.block_ids[g],
                    )
                )
    for reset in record.resets:
        answer = "reset" if reset.succeeded else "refused to reset"
        how = " (preempting the running requests)" if reset.running else ""
        how += " (with the KV connector's cache)" if reset.connector else ""
        notes[reset.step].append(f"prefix cache: {answer}{how}")
        trajectory.facts.append(
            Fact(
                reset.step,
                reset.line,
                "-",
                "reset_prefix_cache",
                SchedulerReset(
                    reset.succeeded, reset.succeeds, reset.step, reset.running, reset.connector
                ),
            )
        )
    _step_facts(trajectory, record.zeroing, "schedule", lines)
    _step_facts(trajectory, record.census, "schedule", lines)
    _step_facts(trajectory, record.queues, "schedule", lines)
    _deferred_frees(trajectory, record.deferred_frees, lines, notes)
    _encoder_facts(trajectory, record, lines)
    for step, note in record.encoder_notes.items():
        notes[step].append(note)
    _chunk_facts(trajectory, record, scenario, lines)
    lookup_facts(trajectory, record, scenario, lines)
    _step_facts(trajectory, record.lifecycle, "update_from_output", lines)
    trajectory.step_notes = {step: "; ".join(parts) for step, parts in sorted(notes.items())}
    trajectory.notes.append(summary(record, scenario))
    return trajectory


def _encoder_facts(
    trajectory: Trajectory, record: SchedulerRun, lines: dict[str, int | None]
) -> None:
    """What the run's encoder did (judged by ``sanity``), and the budget it ran with (a
    note)."""
    if record.encoder_budget is not None:
        trajectory.notes.append(
            f"encoder budget {record.encoder_budget} embeddings a step, encoder cache "
            f"{record.encoder_cache_size}"
        )
    _step_facts(trajectory, record.encoder, "schedule", lines)


def _step_facts(
    trajectory: Trajectory,
    facts: Sequence[StepFact],
    call: str,
    lines: dict[str, int | None],
) -> None:
    """The facts the oracle recorded (for ``sanity``), as facts of ``call``."""
    trajectory.facts += [
        Fact(fact.step, lines.get(fact.request), fact.request, call, fact.what) for fact in facts
    ]


def _chunk_facts(
    trajectory: Trajectory,
    record: SchedulerRun,
    scenario: Scenario,
    lines: dict[str, int | None],
) -> None:
    """The prompt chunks of each request that states them (``expect_chunks``), from its first
    admission until its prompt is computed or it is first preempted."""
    for name, request in scenario.requests.items():
        stated = request.expect_chunks
        if stated is None:
            continue
        chunks: list[int] = []
        last = 0
        for event in record.events:
            if isinstance(event, FreeRecord) and event.request == name and chunks:
                break  # preempted (or aborted): the stated chunks are the first admission's
            if not isinstance(event, StepRecord):
                continue
            for row in event.requests:
                if row.request == name and row.computed < row.prompt_len:
                    chunks.append(row.scheduled)
                    last = event.step
        trajectory.facts.append(
            Fact(last, lines[name], name, "prefill", PrefillChunks(tuple(chunks), tuple(stated)))
        )


def _deferred_frees(
    trajectory: Trajectory,
    records: list[DeferredFreeRecord],
    lines: dict[str, int | None],
    notes: dict[int, list[str]],
) -> None:
    """Blocks vLLM returned to the pool after their request finished (defer_block_free).

    Each becomes the request's :class:`FreeEvent` where the blocks went back to the pool
    (after the observations of the step whose output returned them): until then they are
    still the finished request's, so sanity's one-table rule flags another request holding
    one, and the returned count is held against the blocks (none returned: a leak). That
    they do not go back while a step may still write them is the oracle's rule
    (``FREED_IN_FLIGHT``).
    """
    for record in records:
        returned = record.returned
        until = f" until step {record.fence}'s output" if record.fence is not None else ""
        notes[record.step].append(f"{record.kind} {record.request} (blocks deferred{until})")
        if returned is not None:
            notes[returned].append(f"{record.request}'s deferred blocks returned")
        last = returned if returned is not None else max(
            (o.step for o in trajectory.observations), default=record.step
        )  # fmt: skip
        trajectory.events.append(
            FreeEvent(
                sum(1 for o in trajectory.observations if o.step <= last),
                last,
                lines[record.request],
                record.request,
                record.kind,
                record.held,
                record.free_before,
                record.free_after,
                tuple([] for _ in record.held),
            )
        )
    trajectory.events.sort(key=lambda e: e.seq)


def _load_rows(
    trajectory: Trajectory,
    event: LoadRecord,
    line: int | None,
    floor_rules: list[Callable[[FloorInput], int]],
) -> None:
    """One row per group for a request that began loading its KV asynchronously."""
    label = f"loading remote KV {event.tokens} (async)"
    for g, info in enumerate(trajectory.groups):
        trajectory.async_loads.add(len(trajectory.observations))
        trajectory.observations.append(
            Observation(
                event.step,
                line,
                event.request,
                label,
                g,
                event.tokens,
                0,
                0,
                floor_rules[g](info.floor_input(event.tokens, 0, 0, 0)),
                len(event.block_ids[g]),
                None,
                None,
                None,
                event.block_ids[g],
            )
        )


def _step_note(event: StepRecord, parts: list[str]) -> None:
    tokens = sum(row.scheduled for row in event.requests)
    head = f"{len(event.requests)} scheduled, {tokens} tokens"
    if event.in_flight:
        head += f", {event.in_flight} in flight"
    parts.insert(0, f"{head}, {event.free_blocks} blocks free")


def summary(record: SchedulerRun, scenario: Scenario) -> str:
    """One line: which scheduler, how it ran, and its notable decisions."""
    steps = [e for e in record.events if isinstance(e, StepRecord)]
    preempted = [
        f"{e.request}@{e.step}"
        for e in record.events
        if isinstance(e, FreeRecord) and e.kind == "preempt"
    ]
    chunks: dict[str, list[int]] = defaultdict(list)
    verifications: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    drafted: Counter[str] = Counter()
    for step in steps:
        for row in step.requests:
            if row.drafts:
                verifications[row.request] += 1
                drafted[row.request] += row.drafts
                accepted[row.request] += row.accepted or 0
            elif row.prefill_chunk or row.known_tokens - row.computed > 1:
                chunks[row.request].append(row.scheduled)
    mode = {
        "sync": "stepped synchronously",
        "async": "stepped in lockstep",
        "overlapped": f"overlapped ({record.max_concurrent_batches} batches in flight)",
    }[record.mode]
    parts = [
        f"scheduler: {record.scheduler_class} {mode}, model runner {record.model_runner}, "
        f"lookahead {record.lookahead}, "
        f"prefill lookahead {record.prefill_lookahead}, {len(steps)} steps"
    ]
    parts.append("preempted " + (", ".join(preempted) if preempted else "none"))
    hits = [
        f"{row.request} {row.cached}"
        for step in steps
        for row in step.requests
        if row.cached and row.phase != "loaded"
    ]
    if hits:
        parts.append("prefix hits " + ", ".join(hits))
    loads = [f"{e.request} {e.tokens}" for e in record.events if isinstance(e, LoadRecord)]
    if loads:
        parts.append("remote KV loaded asynchronously " + ", ".join(loads))
    chunked = [
        f"{name} {'+'.join(map(str, sizes))}" for name, sizes in chunks.items() if len(sizes) > 1
    ]
    if chunked:
        parts.append("chunked prefill " + ", ".join(chunked))
    if verifications:
        parts.append(
            "accepted "
            + ", ".join(f"{name} {accepted[name]}/{drafted[name]}" for name in verifications)
        )
    unfinished = [name for name in scenario.requests if name not in record.finished]
    if unfinished:
        parts.append("unfinished " + ", ".join(unfinished))
    return "; ".join(parts)
