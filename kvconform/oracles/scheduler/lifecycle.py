"""What vLLM's ``update_from_output`` makes of each fabricated output, recorded for
``checks.lifecycle``: the stops it applies, how every request ends, the ``SchedulerStats``
and the per-request speculative-decoding metrics it returns."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

from kvconform.model.facts import (
    PausedAdmission,
    Payload,
    RequestEnd,
    RunEnded,
    SpecDecodeMetrics,
    StepStats,
    StopApplied,
)
from kvconform.oracles.scheduler.inputs import STOP_TOKEN_IDS
from kvconform.oracles.scheduler.records import LoadRecord, ScheduledRequest, StepFact
from kvconform.oracles.scheduler.state import OracleState
from kvconform.oracles.vllm.scheduling import Scheduling


class AppliedStep(NamedTuple):
    """One step's fabricated output, as kvconform made it, until the scheduler applies it."""

    step: int
    rows: tuple[ScheduledRequest, ...]
    stops: dict[str, int]  # request -> its output count once the stop token is sampled
    received: frozenset[str] = frozenset()  # requests whose KV load the output reports done


class Lifecycle:
    """Records what ``update_from_output`` makes of each fabricated output, for
    ``checks.lifecycle`` to judge: a request ends with the output that samples its stop
    token (``stop_at``: ``check_stop``), and with ``scheduler.log_stats`` the
    ``SchedulerStats`` it returns equal what the recorded steps give
    (``Scheduler.make_stats``):

    * ``kv_cache_usage``: the distinct blocks the requests hold, with those of finished
      requests that vLLM holds back while a step that may write them is in flight
      (``Scheduler._free_request_blocks``, not yet returned by ``_drain_deferred_frees``)
      and both ends of the block copies it holds back likewise
      (``_free_cow_retained_blocks``), over the pool without its null block
      (``BlockPool.get_usage``);
    * ``prefix_cache_stats``: per admission since the last output (vLLM records a lookup
      when it admits, ``record_prefix_cache_stats``), one request, its ``num_tokens`` as
      queries and its prefix-cache hit as hits, apart for a resumed (preempted) one; none
      without prefix caching. The first schedule after a KV load is no lookup, unless the
      load left the request nothing computed: vLLM looks a request up whenever it takes it
      from the waiting queue with ``num_computed_tokens`` 0 (``Scheduler.schedule``), and
      ``_update_waiting_for_remote_kv`` leaves 0 after a load of a 1-token prompt (a whole
      prompt loaded keeps its last token to recompute) or a failed load with no valid
      prefix (``kv_load_failure_policy`` recompute), or, with SWA bounded replay, a failed
      load whose valid prefix is no longer than the replayed window (it rewinds the
      computed count by the window, ``_mark_prefix_replay``, since a failed load may have
      lost it). Such a fresh lookup counts like an admission's: its hit before the
      replay's rewind (:meth:`_looked_up_hit`);
    * ``spec_decoding_stats``: per request of the step with drafts verified, one draft, its
      drafts and the accepted ones (``make_spec_decoding_stats``); None with no draft.
    """

    def __init__(self, oracle: OracleState) -> None:
        self.oracle = oracle
        self.requests = oracle.scenario.requests
        self.outputs = dict.fromkeys(self.requests, 0)  # output tokens sampled so far
        self.ends: dict[str, tuple[bool, int, int]] = {}  # (stopped, outputs, update)
        self.updates = 0  # outputs applied
        self._rows: tuple[ScheduledRequest, ...] = ()
        self._stops: dict[str, int] = {}
        self._admissions: list[ScheduledRequest] = []
        # Admissions that began an asynchronous KV load: (request, prompt tokens, local hit,
        # local hit + loaded tokens).
        self._loads: list[tuple[str, int, int, int]] = []
        self._received: set[str] = set()  # KV loads the next output reports done
        # reset_prefix_cache calls since the last output: (answer, with the connector's).
        self._resets: list[tuple[bool, bool]] = []
        # Requests whose KV load left them nothing computed: their first schedule after the
        # load is a fresh lookup (see the class's docstring).
        self._looked_up_again: set[str] = set()
        self.errors: set[str] = set()  # finished with an error (FINISHED_ERROR)
        # Per request, its verifications so far: (drafts, accepted).
        self.verifications: dict[str, list[tuple[int, int]]] = {}

    def _fact(self, step: int, request: str, what: Payload) -> None:
        self.oracle.run.lifecycle.append(StepFact(step, request, what))

    # what kvconform fabricates

    def scheduled(self, rows: Sequence[ScheduledRequest]) -> None:
        self._rows = tuple(rows)
        if self.oracle._paused:
            for row in rows:
                if row.phase in ("new", "resumed"):
                    self._fact(self.oracle._current, row.request, PausedAdmission(row.phase))
        # A session's next turn looks nothing up: it resumes on the KV it kept.
        self._admissions += [row for row in rows if row.phase not in ("running", "turn")]

    def reset(self, succeeded: bool, connector: bool) -> None:
        """``Scheduler.reset_prefix_cache`` answered ``succeeded`` (``connector``: it reset
        the KV connector's cache too); the next output's stats say whether a reset ran."""
        self._resets.append((succeeded, connector))

    def loaded(self, record: LoadRecord) -> None:
        """An admission that parks a request for its asynchronous KV load: its local hit is
        the one the scheduler showed the connector (``Scheduling.watch_connector_lookups``).
        Not the cached blocks of group 0: a chunked-local group's hit holds null columns
        whether or not anything is cached (their KV is never read again), which vLLM counts
        as hit tokens. Where no lookup was seen (a release that asks the connector
        otherwise), the cached blocks of group 0 stand in."""
        local = self.oracle.connector_hits.get(record.request)
        if local is None:
            null = self.oracle.run.null_block
            loading = record.loading[0]
            cached = [b for b in record.block_ids[0] if b != null and b not in loading]
            local = len(cached) * self.oracle.scenario.model.groups[0].block_size
        prompt = self.requests[record.request].prompt_len
        self._loads.append((record.request, prompt, local, record.tokens))

    def received(self, requests: set[str]) -> None:
        """The output being fabricated reports these requests' KV loads done."""
        self._received |= requests

    def sampled(self, rid: str, tokens: list[int]) -> list[int]:
        """The step's sampled tokens for ``rid``, its stop token in place at ``stop_at``."""
        before = self.outputs[rid]
        self.outputs[rid] = before + len(tokens)
        stop_at = self.requests[rid].stop_at
        if stop_at is not None and before < stop_at <= before + len(tokens):
            tokens[stop_at - before - 1] = STOP_TOKEN_IDS[self.requests[rid].stop_with]
            self._stops[rid] = stop_at
        return tokens

    def step(self) -> AppliedStep:
        applied = AppliedStep(
            self.oracle._current, self._rows, self._stops, frozenset(self._received)
        )
        self._stops = {}
        self._received = set()
        return applied

    # what vLLM makes of it

    def ended(self, request: Any) -> None:
        if self.oracle.api.is_errored(request):
            self.errors.add(request.request_id)
        self.ends[request.request_id] = (
            self.oracle.api.is_stopped(request),
            int(request.num_output_tokens),
            self.updates,
        )

    def applied(self, applied: AppliedStep, result: Any) -> None:
        gone = {rid for rid, end in self.ends.items() if end[2] < self.updates}
        for rid, stop_at in applied.stops.items():
            stop = StopApplied(
                stop_at, self.ends.get(rid), self.updates, rid in gone, self._stop_name(rid)
            )
            self._fact(applied.step, rid, stop)
        if self.oracle.limits.spec_decode_metrics != "none":
            self._record_spec_decode_metrics(applied, result, gone)
        self._note_loads_left_empty(applied.received)
        if self.oracle.limits.log_stats:
            # vLLM counts a lookup when it admits: every schedule() before this output is
            # applied (with batches overlapped, the next step's admissions too).
            admissions, self._admissions = tuple(self._admissions), []
            loads, self._loads = tuple(self._loads), []
            resets, self._resets = tuple(self._resets), []
            self._record_stats(applied, result, gone, admissions, loads, resets)
        self.updates += 1

    def _note_loads_left_empty(self, received: frozenset[str]) -> None:
        """Which of the loads this output reports done leave their request nothing computed,
        read once ``update_from_output`` has applied any failure of the load (a whole
        failure resets ``num_computed_tokens`` to 0, a failed block to the valid prefix
        before it); a load of the whole prompt keeps its last token to recompute."""
        for rid in received:
            request = self.oracle.scheduler.requests.get(rid)
            if request is None or not self.oracle.api.is_loading_remote_kv(request):
                continue  # finished: aborted, or failed under kv_load_failure_policy fail
            computed, tokens = int(request.num_computed_tokens), int(request.num_tokens)
            if self.requests[rid].load_failure is not None:
                # _update_waiting_for_remote_kv rewinds a failed load's valid prefix by the
                # replayed window at the next schedule (window_loaded is False for a failed
                # load): a prefix no longer than the window leaves nothing computed, and
                # schedule() looks the request up afresh (explore-s13-9 of the eighth stop).
                computed -= min(self._replay_window(), computed)
            if min(computed, tokens - 1) <= 0:
                self._looked_up_again.add(rid)

    def _record_spec_decode_metrics(
        self, applied: AppliedStep, result: Any, gone: set[str]
    ) -> None:
        """``scheduler.spec_decode_metrics``: a request's ``RequestSpecDecodeMetrics``, handed
        out with its finishing output, count its verifications: per verification one entry of
        the accepted-count histogram and its drafts (``summary``), and with ``detailed`` the
        accepted and drafted counts per verification, in order."""
        for row in applied.rows:
            if row.drafts and row.accepted is not None and row.request not in gone:
                self.verifications.setdefault(row.request, []).append((row.drafts, row.accepted))
        api = self.oracle.vllm.part(Scheduling)
        detailed = self.oracle.limits.spec_decode_metrics == "detailed"
        names: tuple[str, ...] = ("histogram", "num_draft_tokens")
        names += ("per_step_accepted", "per_step_drafted") if detailed else ()
        for rid, metrics in api.finished_spec_decode_metrics(result).items():
            steps = tuple(self.verifications.get(rid, []))
            got = {name: getattr(metrics, name) for name in names}
            self._fact(
                applied.step, rid, SpecDecodeMetrics(got, steps, self.oracle.num_spec, detailed)
            )

    def ended_run(self) -> None:
        """How every request ended, with what the scenario states of it (its stop, an
        expected rejection: ``_reject_on_encoder_cache_embed_mismatch``)."""
        ends = tuple(
            RequestEnd(
                rid,
                self.ends.get(rid),
                req.stop_at,
                self._stop_name(rid),
                bool(req.expect_rejected),
                bool(req.mm_inputs),
                rid in self.errors,
            )
            for rid, req in self.requests.items()
        )
        self._fact(self.oracle._current, "-", RunEnded(ends))

    def _stop_name(self, rid: str) -> str:
        req = self.requests[rid]
        token = STOP_TOKEN_IDS[req.stop_with]
        return f"EOS token ({token})" if req.stop_with == "eos" else f"stop token ({token})"

    def _record_stats(
        self,
        applied: AppliedStep,
        result: Any,
        gone: set[str],
        admissions: Sequence[ScheduledRequest],
        loads: Sequence[tuple[str, int, int, int]],
        resets: Sequence[tuple[bool, bool]],
    ) -> None:
        """The output's ``SchedulerStats`` and what they are held to (judged by
        ``checks.lifecycle``)."""
        oracle = self.oracle
        stats = oracle.api.scheduler_stats(result)
        null = oracle.run.null_block
        held = {
            block
            for rid in oracle.scheduler.requests
            for ids in oracle.manager.get_block_ids(rid)
            for block in ids
            if block != null
        }
        # A finished request's blocks that vLLM holds back while a step that may write them
        # is in flight (defer_block_free) are out of its table but still referenced: in use
        # until the drain at the start of a later update_from_output returns them.
        # So are both ends of a step's block copies, held back until that step is processed.
        held.update(
            block
            for record in chain(oracle.run.deferred_frees, oracle.run.retained_copies)
            if record.returned is None
            for ids in record.held
            for block in ids
            if block != null
        )
        prefix: dict[str, dict[str, int]] = {}
        reset: dict[str, bool] = {}
        spec: dict[str, int] | None = None
        usage = 0.0
        if stats is not None:
            usage = float(stats.kv_cache_usage)
            for kind in ("prefix_cache_stats", "connector_prefix_cache_stats"):
                found = getattr(stats, kind, None)
                if kind == "connector_prefix_cache_stats" and found is None:
                    continue  # no KV connector
                prefix[kind] = {name: int(getattr(found, name, 0)) for name in _PREFIX_STATS}
                reset[kind] = bool(getattr(found, "reset", False))
            found_spec = stats.spec_decoding_stats
            if found_spec is not None:
                spec = {
                    name: int(getattr(found_spec, name))
                    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
                }
        self._fact(
            applied.step,
            "-",
            StepStats(
                stats is not None,
                usage,
                len(held),
                oracle.scenario.model.num_blocks - 1,
                oracle.scenario.model.enable_caching,
                tuple(
                    (
                        row.request,
                        _LOOKED_UP_AGAIN if row.phase == "loaded" else row.phase,
                        row.known_tokens,
                        self._looked_up_hit(row),
                    )
                    for row in admissions
                    if row.phase != "loaded" or row.request in self._looked_up_again
                ),
                tuple(loads),
                prefix,
                tuple(
                    (row.request, row.drafts, row.accepted)
                    for row in applied.rows
                    if row.drafts and row.accepted is not None and row.request not in gone
                ),
                spec,
                tuple(resets),
                reset,
                {
                    row.request: asked
                    for row in admissions
                    if (row.phase != "loaded" or row.request in self._looked_up_again)
                    and (asked := self._connector_asked_past(row)) != self._looked_up_hit(row)
                },
            ),
        )

    def _connector_asked_past(self, row: ScheduledRequest) -> int:
        """The local hit the admission's KV-connector lookup was asked past
        (``connector_prefix_cache_queries`` counts the tokens after it): the hit it
        found, which SWA bounded replay drops afterwards when it is no longer than the
        replayed window (``Scheduler.schedule``: "any other hit no longer than the
        replayed window would be recomputed in full"); where nothing was dropped, the
        hit the stats count."""
        found = self._looked_up_hit(row)
        asked = self.oracle.connector_hits.get(row.request)
        window = self._replay_window()
        if found or asked is None or not window or not 0 < asked <= window:
            return found
        return asked

    def _replay_window(self) -> int:
        """The window a bounded-replay group recomputes of a hit (its sliding window:
        ``SlidingWindowMLASpec.prefix_replay_tokens``); 0 without one."""
        return max((group.replay_tokens for group in self.oracle.scenario.model.groups), default=0)

    def _looked_up_hit(self, row: ScheduledRequest) -> int:
        """The hit an admission's lookup found, which ``record_prefix_cache_stats``
        counts: with SWA bounded replay (``Request.replay_start`` past 0) the scheduler
        counts the hit less its last window (the window of the group that replays,
        ``prefix_replay_tokens``) as computed and recomputes that window, which the other
        groups adopted from the cache; a hit no longer than the window is dropped whole."""
        if not row.replay_start:
            return row.cached
        return row.cached + self._replay_window()


# The phase StepStats gives a first schedule after a KV load that vLLM looks up afresh.
_LOOKED_UP_AGAIN = "looked up again after its KV load"

_PREFIX_STATS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)
