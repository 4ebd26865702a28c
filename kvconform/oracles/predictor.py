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
    """``_reserved_block_count`` for one scenario's groups, with its lookahead and cap."""

    def __init__(self, vllm: Vllm, model: ModelSpec, trajectory: Trajectory) -> None:
        self._fn = vllm.reserved_block_count
        self.unavailable_reason = None if self._fn is not None else vllm.predictor_missing_reason()
        self._max_model_len = model.max_model_len
        self._lookahead = trajectory.lookahead
        self.specs = group_specs(vllm, model, trajectory.num_speculative_tokens)

    @property
    def available(self) -> bool:
        return self._fn is not None

    def for_group(self, group: int) -> Callable[[int, int], int]:
        """The prediction for one group: (num_tokens, encoder_len) -> blocks.

        The driver asks once per step and group; binding the spec and the fixed
        keywords once keeps that call close to vLLM's own cost.
        """
        fn, lookahead, max_model_len = self._fn, self._lookahead, self._max_model_len
        spec = self.specs[group]
        if fn is None:
            raise ValueError(f"the predictor is unavailable: {self.unavailable_reason}")

        def blocks(num_tokens: int, encoder_len: int) -> int:
            return int(
                fn(
                    num_tokens,
                    spec,
                    num_lookahead_tokens=lookahead,
                    max_model_len=max_model_len,
                    max_encoder_len=encoder_len,
                )
            )

        return blocks
