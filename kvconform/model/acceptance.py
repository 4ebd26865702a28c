"""How many drafts the fabricated model output accepts, verification by verification.

In scheduler mode no model runs: kvconform answers each step's output for the
scheduler, and a request's :class:`~kvconform.model.scenario.Acceptance`
pattern decides how many of the drafts scheduled for it are accepted. A
verification is one step in which the request had drafts scheduled; steps
without drafts (prefill chunks, plain decodes) do not consume the pattern.

The answer never exceeds the drafts actually scheduled: vLLM may schedule fewer
than ``num_speculative_tokens`` (near ``max_model_len``, or before the first
drafts exist), and a model cannot accept drafts it was not given.
"""

from __future__ import annotations

import random

from kvconform.model.scenario import Acceptance


class AcceptanceStream:
    """The accepted-draft counts of one request, one :meth:`next` per verification."""

    def __init__(self, pattern: Acceptance, request: str) -> None:
        self.pattern = pattern
        self.index = 0
        # A string seed is hashed deterministically (random.seed version 2), so
        # the same scenario accepts the same drafts on every run and machine.
        self._rng = random.Random(f"{pattern.seed}/{request}")

    def next(self, num_drafts: int) -> int:
        pattern, i = self.pattern, self.index
        self.index += 1
        if pattern.kind == "rate":
            accepted = 0
            while accepted < num_drafts and self._rng.random() < pattern.rate:
                accepted += 1
            return accepted
        if pattern.kind == "list":
            wanted = pattern.values[i] if i < len(pattern.values) else num_drafts
        elif pattern.kind == "repeat" and pattern.values:
            wanted = pattern.values[i % len(pattern.values)]
        else:
            wanted = num_drafts
        return min(wanted, num_drafts)
