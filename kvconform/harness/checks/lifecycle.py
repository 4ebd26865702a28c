"""``sanity``, the lifecycle family: what becomes of a request's blocks and outputs.

In the live oracle (trajectory mode), a request finished while its last step is in
flight: a KV consumer under asynchronous scheduling pops a finishing request's blocks
(``pop_blocks_for_free``), still referenced, and returns them once that step's output
is applied, so the popped blocks are the ones its tables held, and each goes back to
the free queue unless a live request holds it (:class:`~kvconform.model.facts.InFlightPop`,
:class:`~kvconform.model.facts.DeferredReturn`).

In scheduler mode, what ``schedule()`` and ``update_from_output`` make of each step:

* the prompt chunks a request states (``expect_chunks``), from its first admission until
  its prompt is computed or it is first preempted;
* no blocks go back to the pool while a step that scheduled the request may still write
  them (a KV consumer with batches in flight: ``Scheduler._free_request_blocks``);
* the engine's abort of every request leaves none held but those whose KV load is in
  flight; nothing is admitted while the engine paused the scheduler for new requests;
* a request ends with the output that samples its stop token (``stop_at``:
  ``check_stop``), and only then; one whose multimodal identifiers clash is rejected
  (``expect_rejected``), no other;
* its spec-decode metrics at the finish count its verifications
  (``scheduler.spec_decode_metrics``); with ``scheduler.log_stats`` each output's
  ``SchedulerStats`` equal what the recorded steps give (``Scheduler.make_stats``):
  ``kv_cache_usage`` the distinct blocks the requests hold (with those vLLM holds back for a
  finished one while a step that may write them is in flight) over the pool without its
  null block; ``prefix_cache_stats`` per admission since the last output one request, its
  tokens as queries and its hit as hits (a resumed one apart; a connector's lookups in
  ``connector_prefix_cache_stats``; the first schedule after a KV load that left the request
  nothing computed is a lookup again, as vLLM's ``schedule()`` makes it);
  ``spec_decoding_stats`` the step's verifications; each kind's ``reset`` flag whether a
  ``reset_prefix_cache`` since the last output reset that cache;
* a streaming session keeps its KV between turns and until its input stream closes.

In engine mode, every request ends with its ``max_tokens`` generated
(:class:`~kvconform.model.facts.EngineOutput`).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import at_request, fact_failure, facts_of
from kvconform.model.facts import (
    DeferredRelease,
    DeferredReturn,
    End,
    EngineOutput,
    Fact,
    HeldAfterAbortAll,
    InFlightPop,
    PausedAdmission,
    PrefillChunks,
    RunEnded,
    SessionReleased,
    SessionTurn,
    SpecDecodeMetrics,
    StepStats,
    StopApplied,
)
from kvconform.model.observations import (
    ABORT_ALL_KEPT,
    CHUNKS_DIFFER,
    DEFERRED_FREE,
    FREED_IN_FLIGHT,
    LEFT_UNFINISHED,
    PAUSE_ADMITS,
    REJECTION_DIFFERS,
    SESSION_KV_LOST,
    STATS_DISAGREE,
    STOP_MISSED,
    Trajectory,
)
from kvconform.model.results import Failure


def _outcome(end: End) -> str:
    if end is None:
        return "vLLM keeps it unfinished"
    stopped, outputs, _ = end
    how = "stopped (FINISHED_STOPPED)" if stopped else "finished otherwise (not stopped)"
    return f"vLLM ends it {how} after {outputs} output tokens"


def _stats(what: StepStats) -> list[str]:
    """What of an output's ``SchedulerStats`` differs from what its steps give."""
    problems: list[str] = []
    pool = what.pool
    usage = what.held / pool if pool else 0.0
    if abs(what.kv_cache_usage - usage) > 1e-9:
        problems.append(
            f"kv_cache_usage {what.kv_cache_usage:.4f}, but the requests hold "
            f"{what.held} of the pool's {pool} blocks ({usage:.4f})"
        )
    # The admissions since the last output, each as (resumed, num_tokens, local hit,
    # tokens loaded); a KV load's own tokens in the connector's.
    # (resumed, num_tokens, local hit, tokens loaded, the local hit the connector's lookup
    # was asked past: connector_local, where an admission's differs).
    lookups = [
        (phase == "resumed", tokens, hit, 0, what.connector_local.get(request, hit))
        for request, phase, tokens, hit in what.admissions
    ] + [(False, prompt, local, tokens - local, local) for _, prompt, local, tokens in what.loads]
    described = [
        f"{request} ({phase}, {tokens} tokens, hit {hit})"
        for request, phase, tokens, hit in what.admissions
    ] + [
        f"{rid} (loading {tokens - local}, local hit {local})"
        for rid, _, local, tokens in what.loads
    ]
    for kind, got in what.prefix.items():
        wanted = what.enable_caching if kind == "prefix_cache_stats" else True
        want = dict.fromkeys(got, 0)
        for resumed, tokens, local, external, asked in lookups if wanted else ():
            # The local lookup counts the whole sequence; the connector's what the
            # local hit leaves, and hits what it loads.
            queries, hits = (
                (tokens, local) if kind == "prefix_cache_stats" else (tokens - asked, external)
            )
            if kind != "prefix_cache_stats" and not queries:
                continue  # vLLM records no connector lookup of nothing
            part = ("requests", "queries", "hits")
            if resumed:
                part = ("preempted_requests", "preempted_queries", "preempted_hits")
            for name, value in zip(part, (1, queries, hits), strict=True):
                want[name] += value
        if dict(got) != want:
            problems.append(
                f"{kind} {dict(got)}, but the admissions since the last output "
                f"({', '.join(described) or 'none'}) give {want}"
            )
    for kind, got_reset in sorted(what.reset.items()):
        wanted_reset = _reset_wanted(kind, what.resets)
        if wanted_reset is not None and got_reset != wanted_reset:
            problems.append(
                f"{kind}.reset is {got_reset}, but "
                + (
                    "a reset_prefix_cache since the last output succeeded"
                    if wanted_reset
                    else "no reset_prefix_cache since the last output reset it"
                )
            )
    verified, spec = what.verified, what.spec
    if not verified:
        if spec is not None and spec["num_drafts"]:
            problems.append(
                f"spec_decoding_stats counts {spec['num_drafts']} drafts, but the step "
                "verifies none"
            )
    else:
        expected = {
            "num_drafts": len(verified),
            "num_draft_tokens": sum(drafts for _, drafts, _ in verified),
            "num_accepted_tokens": sum(accepted or 0 for _, _, accepted in verified),
        }
        found = None if spec is None else {name: spec[name] for name in expected}
        if found != expected:
            problems.append(
                f"spec_decoding_stats {found}, but the step verifies "
                + ", ".join(
                    f"{request} {drafts} drafts, {accepted} accepted"
                    for request, drafts, accepted in verified
                )
                + f": {expected}"
            )
    return problems


def _reset_wanted(kind: str, resets: tuple[tuple[bool, bool], ...]) -> bool | None:
    """Whether an output's ``kind`` of prefix-cache stats must say ``reset``: a
    ``reset_prefix_cache`` since the last output reset that cache (the flag makes the
    hit-rate metric drop its window, ``CachingMetrics.observe``). The local cache is reset
    when the call succeeds, and not when it fails without the connector's; the connector's
    when a call with ``reset_connector`` succeeds, never by a call without it. None: a
    failed call with the connector's leaves unknown which of the two refused."""
    connector = kind != "prefix_cache_stats"
    if any(with_connector and not done for done, with_connector in resets):
        return None
    return any(done and (with_connector or not connector) for done, with_connector in resets)


def _spec_decode_metrics(what: SpecDecodeMetrics) -> str | None:
    steps = list(what.verifications)
    histogram = [0] * (what.num_speculative_tokens + 1)
    for _, accepted in steps:
        histogram[accepted] += 1
    want: dict[str, list[int] | int] = {
        "histogram": histogram,
        "num_draft_tokens": sum(drafts for drafts, _ in steps),
    }
    if what.detailed:
        want["per_step_accepted"] = [accepted for _, accepted in steps]
        want["per_step_drafted"] = [drafts for drafts, _ in steps]
    got = dict(what.got)
    if got == want:
        return None
    return (
        f"its spec-decode metrics at the finish are {got}, but its "
        f"{len(steps)} verifications (drafts, accepted) {steps} give {want}"
    )


def _run_ended(trajectory: Trajectory, fact: Fact, judged: set[str]) -> Iterator[Failure]:
    what = fact.what
    assert isinstance(what, RunEnded)
    for end in what.requests:
        if end.expect_rejected and not end.errored:
            yield fact_failure(
                at_request(trajectory, fact, end.request),
                f"{_outcome(end.end)}, not with an error (FINISHED_ERROR): "
                "one of its multimodal ids has another length in the encoder cache "
                "(expect_rejected)",
                REJECTION_DIFFERS,
            )
        elif end.has_mm_inputs and not end.expect_rejected and end.errored:
            yield fact_failure(
                at_request(trajectory, fact, end.request),
                "vLLM finishes it with an error (FINISHED_ERROR), but each of its "
                "multimodal ids has one length throughout the scenario",
                REJECTION_DIFFERS,
            )
    for end in what.requests:
        if end.request in judged or end.end is None:
            continue  # unfinished: the run stalled or ran out of steps, said otherwise
        stopped, outputs, _ = end.end
        if end.stop_at is None and stopped:
            yield fact_failure(
                at_request(trajectory, fact, end.request),
                f"finished as stopped (FINISHED_STOPPED) after {outputs} output tokens, "
                "none of which stops it: it has no stop_at",
                STOP_MISSED,
            )
        elif end.stop_at is not None and (not stopped or outputs != end.stop_at):
            yield fact_failure(
                at_request(trajectory, fact, end.request),
                f"{_outcome(end.end)}, but its output {end.stop_at} is its "
                f"{end.stop_name} (stop_at): check_stop finishes it there",
                STOP_MISSED,
            )


def _session_turn(trajectory: Trajectory, what: SessionTurn) -> str | None:
    null = trajectory.null_block
    problems = []
    if what.computed != what.frontier:
        problems.append(
            f"resumes with {what.computed} computed tokens, not the "
            f"{what.frontier} its turns so far leave (every token but the "
            "last sampled one)"
        )
    if what.known_tokens != what.tokens:
        problems.append(
            f"holds a sequence of {what.known_tokens} tokens, not {what.tokens} "
            f"(the {what.frontier} kept and the chunk's new ones)"
        )
    for group, (kept, now) in enumerate(zip(what.kept, what.now, strict=True)):
        lost = [
            (index, block)
            for index, block in enumerate(kept)
            if block != null and (index >= len(now) or now[index] not in (block, null))
        ]
        if lost:
            problems.append(
                f"group {group} no longer holds block(s) "
                + ", ".join(f"{b} at {i}" for i, b in lost)
                + f" it held at its last step ({list(kept)}; now {list(now)})"
            )
    if not problems:
        return None
    return (
        f"the streaming session's turn {what.turn} "
        + "; ".join(problems)
        + ": vLLM keeps a session's KV between turns"
    )


def _one(trajectory: Trajectory, fact: Fact, judged: set[str]) -> Iterator[Failure]:
    """The failures of one fact of this family."""
    what = fact.what
    if isinstance(what, InFlightPop):
        if list(what.popped) != list(what.held) or any(what.after):
            yield fact_failure(
                fact,
                f"pop_blocks_for_free gives blocks {list(what.popped)}, but the request's "
                f"tables held {list(what.held)} and now hold {[list(ids) for ids in what.after]}",
                DEFERRED_FREE,
            )
    elif isinstance(what, DeferredReturn):
        expected = len(set(what.popped) - set(what.held_by_live))
        if what.returned != expected:
            yield fact_failure(
                fact,
                f"the {what.blocks} blocks popped at its in-flight finish return "
                f"{what.returned} blocks to the pool, not the {expected} no live request holds",
                DEFERRED_FREE,
            )
    elif isinstance(what, PrefillChunks):
        if what.chunks != what.stated:
            yield fact_failure(
                fact,
                f"prefilled its prompt in chunks {'+'.join(map(str, what.chunks)) or 'none'}, "
                f"but the scenario states {'+'.join(map(str, what.stated))} (expect_chunks)",
                CHUNKS_DIFFER,
            )
    elif isinstance(what, DeferredRelease):
        last, processed = what.last_busy, what.processed
        if last is not None and last > processed and what.after > what.before:
            yield fact_failure(
                fact,
                f"returned {what.after - what.before} blocks to the pool at its {what.kind} "
                f"while step {last}, which scheduled it, was in flight (processed up to step "
                f"{processed}); with a KV consumer connector and batches in flight vLLM "
                "defers them (Scheduler._free_request_blocks)",
                FREED_IN_FLIGHT,
            )
    elif isinstance(what, HeldAfterAbortAll):
        yield fact_failure(
            fact,
            "still held by the scheduler after the engine aborted every "
            "request (pause_scheduler mode abort: finish_requests(None))",
            ABORT_ALL_KEPT,
        )
    elif isinstance(what, PausedAdmission):
        yield fact_failure(
            fact,
            f"admitted ({what.phase}) while the engine has paused the scheduler "
            "for new requests (PauseState.PAUSED_NEW): only what runs, or holds "
            "KV blocks, is scheduled until it resumes",
            PAUSE_ADMITS,
        )
    elif isinstance(what, StopApplied):
        if not (what.gone or what.end == (True, what.stop_at, what.updates)):
            judged.add(fact.request)
            yield fact_failure(
                fact,
                f"the step's output samples its {what.stop_name} as output {what.stop_at} "
                f"(stop_at), yet applying it {_outcome(what.end)}; check_stop finishes the "
                "request there and its blocks go back to the pool",
                STOP_MISSED,
            )
    elif isinstance(what, SpecDecodeMetrics):
        message = _spec_decode_metrics(what)
        if message is not None:
            yield fact_failure(fact, message, STATS_DISAGREE)
    elif isinstance(what, StepStats):
        if not what.present:
            yield fact_failure(
                fact, "update_from_output returned no SchedulerStats with log_stats",
                STATS_DISAGREE,
            )  # fmt: skip
        else:
            for problem in _stats(what):
                yield fact_failure(
                    fact, f"SchedulerStats of the step's output: {problem}", STATS_DISAGREE
                )
    elif isinstance(what, RunEnded):
        yield from _run_ended(trajectory, fact, judged)
    elif isinstance(what, SessionReleased):
        if what.kind != "preempt" or what.ended_turn:
            yield fact_failure(
                fact,
                f"the streaming session's blocks are released in turn {what.turn}, "
                "before its input stream closes: vLLM keeps a session's KV while it "
                "waits for input",
                SESSION_KV_LOST,
            )
    elif isinstance(what, SessionTurn):
        message = _session_turn(trajectory, what)
        if message is not None:
            yield fact_failure(fact, message, SESSION_KV_LOST)
    elif isinstance(what, EngineOutput):
        if what.generated is None:
            yield fact_failure(
                fact,
                f"the engine never finished request {fact.request} (max_tokens {what.max_tokens})",
                LEFT_UNFINISHED,
            )
        elif what.generated != what.max_tokens:
            yield fact_failure(
                fact,
                f"the engine finished request {fact.request} with {what.generated} tokens, "
                f"not its max_tokens {what.max_tokens}",
                LEFT_UNFINISHED,
            )


KINDS = (InFlightPop, DeferredReturn, PrefillChunks, DeferredRelease, HeldAfterAbortAll,
         PausedAdmission, StopApplied, SpecDecodeMetrics, StepStats, RunEnded, SessionReleased,
         SessionTurn, EngineOutput)  # fmt: skip


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the lifecycle family, in recording order."""
    # Requests whose stop an output already missed: not judged again at the run's end.
    judged: set[str] = set()
    for index, fact in facts_of(trajectory, *KINDS):
        for failure in _one(trajectory, fact, judged):
            yield index, failure
