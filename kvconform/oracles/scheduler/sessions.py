"""Streaming-input sessions (``RequestSpec.stream``) in scheduler mode: each chunk a
resumable request with the session's id, as ``AsyncLLM``'s streaming input submits them,
and what vLLM keeps of a session between its turns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvconform.model.facts import SessionReleased, SessionTurn
from kvconform.model.scenario import RequestSpec, StreamChunk
from kvconform.oracles.live import ID_STRIDE
from kvconform.oracles.scheduler.records import ScheduledRequest, StepFact
from kvconform.oracles.scheduler.state import OracleState

# A session's chunk k (1, 2, ...) takes prompt ids from here up within the request's id range
# (kvconform.oracles.live's layout: prompts from the base, outputs from OUTPUT_OFFSET).
_CHUNK_OFFSET = 300_000
_CHUNK_STRIDE = 10_000


class _Session:
    def __init__(self, spec: RequestSpec) -> None:
        self.chunks = list(spec.stream)  # not added yet
        self.added: list[StreamChunk] = []  # added, waiting for the turn before to end
        self.tokens = spec.prompt_len  # Request.num_tokens, as kvconform counts it
        self.turn_max = spec.max_tokens
        self.turn_outputs = 0
        self.turn = 1
        self.ended_turn = False  # the turn ended; the next chunk not applied yet
        self.frontier: int | None = None  # computed tokens it resumes from
        self.kept: tuple[list[int], ...] = ()  # its tables at its last step
        self.resuming = False  # the next chunk applied, not scheduled since
        self.close_at: int | None = None  # when the stream closes, once the last chunk is in
        self.closed = False


class Sessions:
    """Streaming-input sessions (``stream``), stepped as ``AsyncLLM``'s streaming input
    submits them: each chunk a resumable request with the session's id
    (``Scheduler.add_request`` queues it, or starts the next turn at once when the session
    waits for it), then a non-resumable one that closes the session. vLLM keeps the session's
    blocks between turns: a turn ends when its outputs reach its max_tokens, and
    ``_update_request_as_session`` keeps every token but the last sampled one
    (``_handle_stopped_request`` resumes from the computed frontier). Judged at the first step
    of each next turn (check ``sanity``): it resumes with that many computed tokens, and its
    tables begin with the blocks it held at its last step.
    """

    def __init__(self, oracle: OracleState, hasher: Any) -> None:
        self.oracle = oracle
        self.hasher = hasher
        self.sessions = {
            name: _Session(req) for name, req in oracle.scenario.requests.items() if req.stream
        }
        self._ends: set[str] = set()
        self._index = {name: i for i, name in enumerate(oracle.scenario.requests)}

    def next_chunk(self) -> int | None:
        """The next schedule() call before which a chunk arrives or a stream closes."""
        times = [s.chunks[0].at for s in self.sessions.values() if s.chunks]
        times += [
            s.close_at for s in self.sessions.values() if s.close_at is not None and not s.closed
        ]
        return min(times, default=None)

    def released(self, rid: str, step: int, kind: str) -> None:
        """A release of ``rid``'s blocks: a session's only once its stream has closed, or
        as a preemption while a turn runs (it recomputes)."""
        session = self.sessions.get(rid)
        if session is None or session.closed:
            return
        self.oracle.run.lifecycle.append(
            StepFact(step, rid, SessionReleased(kind, session.turn, session.ended_turn))
        )

    def resuming(self, rid: str) -> bool:
        session = self.sessions.get(rid)
        return session is not None and session.resuming

    def add_chunks(self, step: int) -> None:
        oracle = self.oracle
        for rid, session in self.sessions.items():
            while session.chunks and session.chunks[0].at <= step:
                chunk = session.chunks.pop(0)
                number = len(oracle.scenario.requests[rid].stream) - len(session.chunks)
                first = (self._index[rid] + 1) * ID_STRIDE + _CHUNK_OFFSET
                first += _CHUNK_STRIDE * number
                request = oracle.vllm.new_request(
                    rid,
                    list(range(first, first + chunk.prompt_len)),
                    self.hasher,
                    max_tokens=chunk.max_tokens,
                    resumable=True,
                )
                oracle.scheduler.add_request(request)
                session.added.append(chunk)
                if session.ended_turn:
                    self._next_turn(session)
                if not session.chunks:
                    session.close_at = oracle.scenario.requests[rid].close_at or step
            if session.close_at is not None and session.close_at <= step and not session.closed:
                # The input stream ends: AsyncLLM closes the session with a request that is
                # not resumable (no update: the finished sentinel; vLLM aborts a session
                # waiting for input, else finishes it when its turn ends).
                session.closed = True
                oracle._current = step
                oracle.scheduler.add_request(
                    oracle.vllm.new_request(rid, [0], self.hasher, max_tokens=1)
                )

    def _next_turn(self, session: _Session) -> None:
        chunk = session.added.pop(0)
        session.tokens += chunk.prompt_len
        session.turn_max, session.turn_outputs = chunk.max_tokens, 0
        session.turn += 1
        session.ended_turn, session.resuming = False, True

    def sampled(self, rid: str, count: int) -> None:
        session = self.sessions.get(rid)
        if session is None or session.ended_turn:
            return
        # check_stop ends the turn at its max_tokens-th output and trims the rest.
        count = min(count, session.turn_max - session.turn_outputs)
        session.tokens += count
        session.turn_outputs += count
        if session.turn_outputs >= session.turn_max:
            self._ends.add(rid)

    def applied(self) -> None:
        for rid in sorted(self._ends):
            session = self.sessions[rid]
            if not session.chunks and not session.added:
                continue  # its last turn: the session finishes
            # Every token but the last sampled one is computed, and kept.
            session.tokens -= 1
            session.frontier = session.tokens
            session.ended_turn = True
            if session.added:
                self._next_turn(session)
        self._ends.clear()

    def scheduled(self, step: int, rows: Sequence[ScheduledRequest]) -> None:
        for row in rows:
            session = self.sessions.get(row.request)
            if session is None:
                continue
            if row.phase == "turn":
                session.resuming = False
                turn = SessionTurn(
                    session.turn,
                    row.computed,
                    session.frontier,
                    row.known_tokens,
                    session.tokens,
                    tuple(tuple(ids) for ids in session.kept),
                    tuple(tuple(ids) for ids in row.block_ids),
                )
                self.oracle.run.lifecycle.append(StepFact(step, row.request, turn))
            session.kept = tuple(list(ids) for ids in row.block_ids)
