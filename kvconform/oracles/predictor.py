"""The predicted party: vLLM's warmup predictor ``_reserved_block_count``.

vLLM's V2 warmup (``vllm/v1/worker/gpu/warmup.py``) builds its scheduler
outputs by hand and sizes each request's blocks with ``_reserved_block_count``
(vLLM 0.28.0 on). This oracle calls that very function; where a release lacks
it the party is *unavailable*, said so in the report, and never replaced by a
re-implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvconform.oracles.vllm_compat import Vllm


class Predictor:
    def __init__(self, vllm: Vllm, max_model_len: int, lookahead: int) -> None:
        self._fn = vllm.reserved_block_count
        self.unavailable_reason = None if self._fn is not None else vllm.predictor_missing_reason()
        self._max_model_len = max_model_len
        self._lookahead = lookahead

    @property
    def available(self) -> bool:
        return self._fn is not None

    def blocks(self, num_tokens: int, spec: Any, encoder_len: int) -> int:
        """Only where :attr:`available`; called per step and group, so kept bare."""
        return int(
            self._fn(  # type: ignore[misc]
                num_tokens,
                spec,
                num_lookahead_tokens=self._lookahead,
                max_model_len=self._max_model_len,
                max_encoder_len=encoder_len,
            )
        )

    def for_group(self, spec: Any) -> Callable[[int, int], int]:
        """:meth:`blocks` for one group's spec: (num_tokens, encoder_len) -> blocks.

        The driver asks once per step and group; binding the spec and the fixed
        keywords once keeps that call close to vLLM's own cost.
        """
        fn, lookahead, max_model_len = self._fn, self._lookahead, self._max_model_len
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
