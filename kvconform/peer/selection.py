"""Which of vLLM's tests are the peer yardstick.

The yardstick is the part of vLLM's own suite that runs on a CPU and reaches
the KV-cache reservation code kvconform conforms vLLM against:

* ``tests/v1/core/``: the block pool, the single-type managers, the
  coordinator, ``KVCacheManager`` and the scheduler;
* the V2 warmup's reservation tests: ``test_gpu_warmup_blocks.py`` (runs here
  through :mod:`kvconform.peer.plugins.cpu_warmup`),
  ``test_mixed_warmup_gate.py`` and spec decode's ``test_dflash_lookahead.py``;
* the other files of ``tests/v1/worker/`` and ``tests/v1/spec_decode/`` found
  to reach reservation functions with tests that pass on a CPU
  (:data:`FOUND`): every file of both folders was run once under coverage
  with per-test contexts on vLLM 0.33.0, and a file is listed when one of its
  passing tests executes a function of :data:`kvconform.model.vllm_code.RESERVATION_CODE`
  (``docs/peer-tests.md`` has the files that were not: they are skipped
  without CUDA, need weights, or never reach that code).

A file a release does not have is left out, so the selection of an older or
newer release is the part of this list it has.
"""

from __future__ import annotations

from pathlib import Path

CORE = ("tests/v1/core",)
NAMED = (
    "tests/v1/worker/test_gpu_warmup_blocks.py",
    "tests/v1/worker/test_mixed_warmup_gate.py",
    "tests/v1/spec_decode/test_dflash_lookahead.py",
)
FOUND = (
    "tests/v1/spec_decode/test_dynamic_sd.py",
    "tests/v1/spec_decode/test_ngram.py",
    "tests/v1/worker/test_dsv4_packed_zeroer_geometry.py",
    "tests/v1/worker/test_gpu_model_runner_v2.py",
)


def selection(suite: Path) -> list[str]:
    """The selected paths (relative to ``suite``) that this release's tests have."""
    return [path for path in (*CORE, *NAMED, *FOUND) if (suite / path).exists()]
