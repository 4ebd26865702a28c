"""The core facade: what every party asks of vLLM, through one :class:`Vllm` object.

Build a ``KVCacheSpec`` for a scenario group, build a ``KVCacheManager``, make a
``Request``, call ``allocate_slots``, ask ``_reserved_block_count`` and
``VllmConfig.num_lookahead_tokens``, enumerate the spec types and speculative
methods the loaded vLLM declares. :class:`Vllm` is composed of one class per concern,
each in its own module on the shared :class:`~.base.VllmBase`: :mod:`.specs` (spec types
and vLLM's defaults), :mod:`.managers` (managers, requests and the allocator's calls),
:mod:`.prefix_cache` (the prefix cache, its events and hand-offs), :mod:`.predictor` (the
warmup predictor), :mod:`.methods` (speculative methods and the lookahead). The parts that
serve one consumer only live beside it: :mod:`.scheduling` (scheduler mode),
:mod:`.warmup_stubs` (the warmup party), :mod:`.slot_kernel` (the slots party), :mod:`.engine`
(engine mode's hooks); each attaches to a :class:`Vllm` through :meth:`Vllm.part`.
"""

from __future__ import annotations

from kvconform.oracles.vllm.managers import ManagersPart
from kvconform.oracles.vllm.methods import MethodsPart
from kvconform.oracles.vllm.predictor import PredictorPart
from kvconform.oracles.vllm.prefix_cache import PrefixCachePart
from kvconform.oracles.vllm.specs import SpecsPart

__all__ = ["Vllm"]


class Vllm(SpecsPart, ManagersPart, PrefixCachePart, PredictorPart, MethodsPart):
    """The loaded vLLM, reduced to what kvconform asks of it."""
