"""The predicted party: vLLM's warmup predictor ``_reserved_block_count``.

vLLM's V2 warmup (``vllm/v1/worker/gpu/warmup.py``) builds its scheduler
outputs by hand and sizes each request's blocks with ``_reserved_block_count``
(vLLM 0.28.0 on). This oracle calls that very function; where a release lacks
it the party is *unavailable*, said so in the report, and never replaced by a
re-implementation.
"""

from __future__ import annotations

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
        assert self._fn is not None
        return int(
            self._fn(
                num_tokens,
                spec,
                num_lookahead_tokens=self._lookahead,
                max_model_len=self._max_model_len,
                max_encoder_len=encoder_len,
            )
        )
