"""End to end: vLLM 0.33.0's own tests, fetched from its sdist, kill a real one-line bug.

The bug is the one upstream's V2 warmup lookahead fix closed: the warmup's
``_reserved_block_count`` forgets the speculator's lookahead tokens. It is put
into a copy of the installed vLLM's tree; a peer run restricted to the warmup
test (run on the CPU through the ``cpu_warmup`` plugin) and one core file must
pass on the unmodified tree and fail on the copy, in the warmup test. A tree
that does not import is ``broken``, not killed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.peer import Verdict, prepare
from kvconform.peer.environment import installed_vllm_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(installed_vllm_version() != "0.33.0", reason="needs vLLM 0.33.0 installed"),
]

WARMUP = "vllm/v1/worker/gpu/warmup.py"
WARMUP_TEST = "tests/v1/worker/test_gpu_warmup_blocks.py"
PATHS = [WARMUP_TEST, "tests/v1/core/test_single_type_kv_cache_manager.py"]
LOOKAHEAD = "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)"
NO_LOOKAHEAD = "num_tokens = min(num_tokens, max_model_len)  # injected: no lookahead"


def test_a_peer_run_kills_the_warmup_lookahead_bug(pristine_tree: Path, tmp_path: Path):
    from vllm_copy import tree_with_replacement

    suite = prepare("0.33.0", paths=PATHS)
    base = suite.baseline()
    assert base.files == PATHS and base.counts["passed"] > 30
    assert not any(nodeid.startswith(WARMUP_TEST) for nodeid in base.deselected)  # un-skipped

    assert WARMUP_TEST in suite.tests_reaching(WARMUP, "_reserved_block_count")
    assert suite.tests_reaching(WARMUP, "warmup_kernels") == [WARMUP_TEST]

    clean = suite.run(pristine_tree, {(WARMUP, "_reserved_block_count")}, timeout=600)
    assert clean.verdict is Verdict.SURVIVED, clean
    assert clean.tests_run > 20 and clean.files == [WARMUP_TEST]

    buggy = tree_with_replacement(pristine_tree, tmp_path / "bug", "v1/worker/gpu/warmup.py", LOOKAHEAD, NO_LOOKAHEAD)  # fmt: skip
    killed = suite.run(buggy, {(WARMUP, "_reserved_block_count")}, timeout=600)
    assert killed.verdict is Verdict.KILLED, killed
    assert killed.first_failure is not None
    assert killed.first_failure.nodeid.startswith(WARMUP_TEST)
    assert "lookahead" in killed.first_failure.message or "blocks" in killed.first_failure.message
    assert killed.tests_run < clean.tests_run  # -x: it stopped at the first failure

    broken = tree_with_replacement(pristine_tree, tmp_path / "broken", "v1/worker/gpu/warmup.py", LOOKAHEAD, "num_tokens = min(")  # fmt: skip
    unloadable = suite.run(broken, {(WARMUP, "_reserved_block_count")}, timeout=600)
    assert unloadable.verdict is Verdict.BROKEN, unloadable
