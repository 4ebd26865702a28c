"""What a ``schedule()`` call found in vLLM's queues, as facts: each request's place and
state, why the coming step may pass it over (``held_back``), the multimodal input it waits
at and the encoder's room. Recorded by the scheduler oracle
(:mod:`kvconform.oracles.scheduler.queues`), judged by the liveness and fairness families
(:mod:`kvconform.harness.checks.liveness`, :mod:`kvconform.harness.checks.fairness`); part of
the payloads of :mod:`kvconform.model.facts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# The reason ``QueuedRequest.held_back`` records for a request with a multimodal input ahead
# (its placeholder not computed past): ``_try_schedule_encoder_inputs`` may cut its tokens
# to 0. Whether that excuses a call is the liveness family's to judge
# (``kvconform/harness/checks/liveness.py``, with :class:`PendingInput`).
ENCODER_HELD_BACK = "the encoder budget or cache"


class PendingInput(NamedTuple):
    """The first multimodal input a request has not computed past (shifted by the
    prefill lookahead), as a ``schedule()`` call found it: its placeholder's ``offset``
    and ``length`` in prompt tokens, the encoder ``embeds`` it takes of the budget and
    the cache (``PlaceholderRange.get_num_embeds``), and whether the encoder cache
    already holds its output (``EncoderCacheManager.cached``: no room needed)."""

    offset: int
    length: int
    embeds: int
    cached: bool


class QueuedRequest(NamedTuple):
    """A live request as a ``schedule()`` call found it (liveness and fairness families):
    ``added``, the order the engine handed requests to the scheduler (``add_request``:
    FCFS's arrival); ``priority`` and ``stamp``, the rank of its ``Request.arrival_time``
    (the priority policy's order, ``(priority, arrival_time)``); its computed and known
    tokens, prompt, ``max_tokens``, the device blocks it holds; ``held_back``: why vLLM may
    pass it over in this step ("" none; the reasons are listed in docs/contract.md);
    ``encoder_input``: the input it is held at where that reason is :data:`ENCODER_HELD_BACK`
    (None: none, or one the oracle cannot read: an encoder-cache connector, an
    encoder-decoder model);
    ``frees_deferred``: a running request whose blocks vLLM may not free in this call (a step
    in flight may still write them), so that a preemption that comes to it gives up the call
    (docs/contract.md, "Liveness and fairness")."""

    request: str
    added: int
    priority: int
    stamp: int
    computed: int
    tokens: int
    prompt: int
    max_tokens: int
    held: int
    held_back: str = ""
    frees_deferred: bool = False
    encoder_input: PendingInput | None = None


class StepQueues(NamedTuple):
    """A ``schedule()`` call's queues and what it made of them (liveness and fairness
    families of ``sanity``): the waiting and running requests before it (running in
    vLLM's order), the tokens it scheduled with the blocks each scheduled request holds
    after it and the position its step ends at (a prefix-cache hit included), the requests it preempted, its token budgets (``max_num_scheduled_tokens``,
    ``max_num_batched_tokens`` and the draft slots each request takes of the latter),
    ``max_num_seqs``, the free blocks before and after it and the admission watermark,
    the steps in flight, the engine's pause, chunked prefill and full-sequence admission,
    and the encoder's budget and room."""

    policy: str
    waiting: tuple[QueuedRequest, ...]
    running: tuple[QueuedRequest, ...]
    # request -> (tokens, blocks held after, computed after: the step's end position)
    scheduled: Mapping[str, tuple[int, int, int]]
    preempted: tuple[str, ...]
    token_budget: int
    input_budget: int
    draft_slots: int
    max_num_seqs: int
    free_before: int
    free_after: int
    watermark: int
    pool: int
    in_flight: int
    paused: bool
    chunked_prefill: bool
    reserve_full: bool
    # The encoder's side of the call (the liveness family's excuse at an input): the
    # encoder budget (``max_num_encoder_input_tokens``), the embeddings the encoder cache
    # could take before the call (``num_freeable_slots``: free, or held by no live request),
    # the drafter's prefill shift (``num_prefill_lookahead``) and
    # ``disable_chunked_mm_input``; and the long-prefill threshold the call caps a
    # request's chunk at (0: none; vLLM lifts it with one request eligible).
    encoder_budget: int = 0
    encoder_room: int = 0
    prefill_shift: int = 0
    whole_inputs: bool = False
    chunk_cap: int = 0
