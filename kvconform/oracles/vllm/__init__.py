"""The one package that imports vLLM, torch and Triton, and knows how vLLM releases differ.

Everything kvconform asks of vLLM goes through a :class:`Vllm` object returned
by :func:`load`: build a ``KVCacheSpec`` for a scenario group, build a
``KVCacheManager``, make a ``Request``, call ``allocate_slots``, ask
``_reserved_block_count`` and ``VllmConfig.num_lookahead_tokens``, enumerate the
spec types and speculative methods the installed vLLM declares, find the warmup
entry points and build the stub model runner they read. No other package branches
on vLLM's version: the parties in :mod:`kvconform.oracles` ask this package for
everything that differs between releases.

Split by consumer, one job a module:

* :mod:`.versions` -- which vLLM: its source and release, read without importing it;
* :mod:`.loading` -- :func:`load`, the one import of vLLM per process;
* :mod:`.core` -- the :class:`Vllm` facade every party uses (specs, manager,
  requests, predictor, methods and lookahead);
* :mod:`.scheduling` -- scheduler mode's configs, scheduler and outputs;
* :mod:`.warmup_stubs` -- the warmup entry points and the stub model runners;
* :mod:`.slot_kernel` -- the slot-mapping kernel and its process set-up;
* :mod:`.engine` -- where a release keeps what engine mode hooks in its real engine,
  and the engine's construction (imported only by the engine child);
* :mod:`.calls` -- calling by signature.

How releases differ (measured on the PyPI wheels 0.25.0 - 0.33.0; see
``docs/releases.md``) is handled here in four ways, in this order of
preference:

1. *By signature*: keyword arguments a release does not accept are dropped
   (``KVCacheManager`` gains and reorders keywords between releases;
   ``allocate_slots`` gains ``skip_zeroing_group_ids`` in 0.32), so every call
   passes everything by keyword and lets the signature decide.
2. *By presence*: a name that a release lacks (``_reserved_block_count`` before
   0.28, ``CircularBufferSpec`` before 0.29, ``KpoolTailSpec`` after 0.31)
   raises :class:`~kvconform.errors.VllmUnavailable` naming the version and the
   missing name, or, where the name is optional to a run (the predictor, the
   lookahead property), is reported as unavailable rather than faked.
3. *By shape*: results whose shape changed (``get_computed_blocks`` returns two
   or three values) are read positionally.
4. *By release family*, where nothing else can tell: the model-runner attributes
   vLLM's warmup reads (``warmup_kernels`` takes a ``GPUModelRunner``; kvconform
   passes a stub, as vLLM's own warmup test does) differ between releases, and
   an absent attribute only shows when the warmup reads it. ``STUB_FAMILIES``
   maps each release family to its stub; a warmup that reads an attribute its
   stub lacks raises :class:`VllmUnavailable` naming the version and the
   attribute.
"""

from kvconform.oracles.vllm.core import Vllm
from kvconform.oracles.vllm.loading import load
from kvconform.oracles.vllm.slot_kernel import KernelSetup, prepare_slot_kernel
from kvconform.oracles.vllm.versions import (
    MINIMUM_SUPPORTED,
    VllmSource,
    installed_version,
    tree_version,
)

__all__ = [
    "MINIMUM_SUPPORTED",
    "KernelSetup",
    "Vllm",
    "VllmSource",
    "installed_version",
    "load",
    "prepare_slot_kernel",
    "tree_version",
]
