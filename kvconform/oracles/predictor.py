"""The predicted party: vLLM's warmup predictor ``_reserved_block_count``.

vLLM's V2 warmup (``vllm/v1/worker/gpu/warmup.py``) builds its scheduler
outputs by hand and sizes each request's blocks with ``_reserved_block_count``
(vLLM 0.28.0 on). This oracle calls that very function; where a release lacks
it the party is *unavailable*, said so in the report, and never replaced by a
re-implementation.
"""

from __future__ import annotations

from collections.abc import Callable

from kvconform.model.observations import Trajectory
from kvconform.model.scenario import ModelSpec
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.vllm import Vllm


class Predictor:
    """``_reserved_block_count`` for one scenario's groups, with its lookahead, its
    ``max_model_len`` and, where the release takes them, its DCP size and ``VllmConfig``."""

    def __init__(self, vllm: Vllm, model: ModelSpec, trajectory: Trajectory) -> None:
        # Bound once per scenario as the warmup binds it (_warmup_block_counter): the
        # keywords a release takes are the facade's business (Vllm.block_counter).
        self._fn = vllm.block_counter(
            num_lookahead_tokens=trajectory.lookahead,
            max_model_len=model.max_model_len,
            dcp_world_size=model.dcp_world_size,
        )
        # An asynchronous KV load's blocks are allocated with no lookahead
        # (Scheduler.schedule: effective_lookahead_tokens is 0 under load_kv_async), so
        # the count for them is the same function without it.
        self._load_fn = vllm.block_counter(
            num_lookahead_tokens=0,
            max_model_len=model.max_model_len,
            dcp_world_size=model.dcp_world_size,
        )
        self.unavailable_reason = None if self._fn is not None else vllm.predictor_missing_reason()
        self.specs = group_specs(vllm, model, trajectory.num_speculative_tokens)

    @property
    def available(self) -> bool:
        return self._fn is not None

    def for_group(self, group: int) -> Callable[[int, int], int]:
        """The prediction for one group: (num_tokens, encoder_len) -> blocks.

        The driver asks once per step and group; binding the spec and the fixed
        keywords once keeps that call close to vLLM's own cost.
        """
        return self._bound(self._fn, group)

    def for_load(self, group: int) -> Callable[[int, int], int]:
        """The predictor's count for the blocks of an asynchronous KV load in one group:
        (num_tokens, encoder_len) -> blocks, with no lookahead. ``Scheduler.schedule``
        allocates a load's slots without the drafter's lookahead
        (``effective_lookahead_tokens``, "Allocate speculative lookahead slots later"), so
        the load holds no lookahead blocks until its first step.
        """
        return self._bound(self._load_fn, group)

    def _bound(self, fn: Callable[..., int] | None, group: int) -> Callable[[int, int], int]:
        spec = self.specs[group]
        if fn is None:
            raise ValueError(f"the predictor is unavailable: {self.unavailable_reason}")

        def blocks(num_tokens: int, encoder_len: int) -> int:
            return int(fn(num_tokens, spec, max_encoder_len=encoder_len))

        return blocks
