"""The fuzzer finds real bugs put into a copy of vLLM's own code, within the CI budget.

For each bug of issue 5 -- the warmup predictor without the lookahead, the
predictor without the ``max_model_len`` cap, the allocator dropping Mamba's
speculative blocks -- a copy of the installed vLLM's Python tree gets the bug
(:data:`BUGS`, by exact text replacement asserted to happen once), and then, as
a user would:

1. ``kvconform fuzz --vllm-src COPY`` (CI budget, seed 0) exits 1 and writes a
   reproducer of at most three steps whose finding names the broken party;
2. ``kvconform run REPRO --vllm-src COPY`` exits 1: the reproducer reproduces;
3. ``kvconform run REPRO`` on the unmodified vLLM exits 0: it is the bug, not the
   scenario.

Steps 1 and 2 run in subprocesses (a process holds one vLLM); each imports vLLM.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vllm_copy import run_kvconform, tree_with_replacement

from kvconform.fronts.cli import main
from kvconform.fuzz import CI_EXAMPLES
from kvconform.oracles.vllm import Vllm

REPO = Path(__file__).resolve().parents[1]

# The bugs the fuzzer must find (issue 5): module, the text it holds once, its replacement.
BUGS: dict[str, tuple[str, str, str]] = {
    # The warmup predictor forgets the drafter's lookahead slots.
    "predictor-no-lookahead": (
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = min(num_tokens, max_model_len)",
    ),
    # The warmup predictor does not cap the lookahead at max_model_len.
    "predictor-no-cap": (
        "v1/worker/gpu/warmup.py",
        "num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)",
        "num_tokens = num_tokens + num_lookahead_tokens",
    ),
    # The allocator drops Mamba's speculative state blocks (modes other than align).
    "mamba-no-spec-blocks": (
        "v1/core/single_type_kv_cache_manager.py",
        "                num_tokens += self.block_size * self.num_speculative_blocks\n",
        "                pass\n",
    ),
}

# bug -> the signatures (file-name slugs) a finding of it may carry
EXPECTED = {
    "predictor-no-lookahead": ("floor-predicted-token-indexed", "agree-token-indexed-live-above"),
    # Without the cap the predictor counts past max_model_len wherever the cap bounds it:
    # token-indexed groups, and (0.34 on) a Mamba group outside "align" mode.
    "predictor-no-cap": ("agree-token-indexed-live-below", "agree-mamba-state-live-below"),
    "mamba-no-spec-blocks": ("floor-live-mambaspec", "agree-mamba-live-below"),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_fuzz_finds_injected_bug_and_shrinks_it(
    bug: str, tmp_path: Path, vllm: Vllm, pristine_tree: Path
) -> None:
    tree = tree_with_replacement(pristine_tree, tmp_path / "tree", *BUGS[bug])
    out = tmp_path / "found"
    fuzz = run_kvconform(
        "fuzz",
        "--vllm-src",
        tree,
        "--examples",
        CI_EXAMPLES,
        "--seed",
        0,
        "--out",
        out,
        "--max-findings",
        1,
        "--expectations",
        REPO / "scenarios" / "expectations.yaml",
        cwd=tmp_path,
    )
    assert fuzz.returncode == 1, fuzz.stdout + fuzz.stderr
    (repro,) = out.glob("fuzz-*.yaml")
    slug = re.sub(r"^fuzz-s0-1-", "", repro.stem)
    assert slug in EXPECTED[bug], fuzz.stdout
    text = repro.read_text()
    steps = text.split("\nsteps:\n", 1)[1].splitlines()
    assert 1 <= len(steps) <= 3, text
    assert f"--vllm-src {tree}" in text  # the header's reproduce line names the copy

    again = run_kvconform(
        "run", repro, "--vllm-src", tree, "--report-dir", tmp_path / "r1", cwd=tmp_path
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert "FAILED" in again.stdout

    # The unmodified vLLM (this process's) conforms on the same scenario.
    assert main(["run", str(repro), "--report-dir", str(tmp_path / "r2")]) == 0
