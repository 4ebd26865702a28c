"""``kvconform export SCENARIO --vllm-test``: a scenario's finding as a test for vLLM's own tree.

The file belongs in the test tree of the vLLM release the finding was made on, in
the folder whose tests it resembles, and it uses that tree's helpers:
``create_requests`` of ``tests/v1/core/utils.py`` and ``make_kv_cache_manager`` of
``tests/v1/core/test_prefix_caching.py``. It imports no kvconform, tests vLLM's
public entry points where they exist, parametrizes what the scenario varies, and
makes one assertion per expectation the finding states, with a message saying what
vLLM should do and why. What the scenario found decides the shape
(:class:`VllmTest.shape`):

``lookahead`` (``tests/v1/worker/``)
    ``VllmConfig.num_lookahead_tokens`` differs from what the method's drafter
    writes (check ``lookahead``): the test asks the property for each layout of
    the method, on a config built without ``__post_init__`` as vLLM's own
    ``test_gpu_warmup_blocks.py`` does.
``warmup`` (``tests/v1/worker/``)
    the warmup predictor or the recorded warmup disagrees with the allocator
    (check ``agree``): the test runs vLLM's public mixed warmup
    ``run_mixed_prefill_decode_warmup`` on a stub model runner with the
    scenario's groups (the caller of ``_warmup_block_counter``, where the
    reservation policy is bound) and replays every warmup request's steps on a
    ``KVCacheManager`` built as the scheduler builds it; the warmup must hold what
    the manager holds.
``manager`` (``tests/v1/core/``)
    building or driving the ``KVCacheManager`` raises (an error), or it holds
    fewer blocks than a token-indexed group's written positions need (check
    ``floor``): the test builds the manager for the scenario's groups and
    allocates for each request's prompt, with and without the lookahead.

The specs are rendered from the objects kvconform built for the run, so the file
is valid for the vLLM release named in its docstring. Findings of other shapes
(a scheduler scenario's, a prefix-cache hit's) are refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconform.errors import UsageError
from kvconform.model.kinds import Kind
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm
from kvconform.reports.vllm_test_shapes import lookahead_test, manager_test, warmup_test
from kvconform.reports.vllm_test_source import SHAPES, test_name

__all__ = ["SHAPES", "VllmTest", "render_vllm_test", "test_name"]

LICENSE = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


@dataclass(frozen=True)
class VllmTest:
    """One exported test file: its shape, where it belongs in vLLM's tree, its source."""

    scenario: str
    shape: str
    folder: str
    source: str



def _shape(scenario: Scenario, result: ScenarioResult) -> str:
    checks = {f.check for f in result.failures}
    crashed = result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH
    if "lookahead" in checks:
        return "lookahead"
    if "agree" in checks:
        if scenario.kind is Kind.WARMUP and "run_mixed_prefill_decode_warmup" not in (
            scenario.warmup.entry_points if scenario.warmup else ()
        ):
            raise UsageError(
                f"{scenario.id}: export --vllm-test reproduces a warmup disagreement through "
                "run_mixed_prefill_decode_warmup (warmup_kernels needs an accelerator)"
            )
        return "warmup"
    if scenario.kind is not Kind.TRAJECTORY:
        found = ", ".join(sorted(checks)) or result.verdict.value
        raise UsageError(
            f"{scenario.id}: export --vllm-test takes a {scenario.kind} scenario's lookahead "
            f"or warmup disagreement only ({found})"
        )
    if crashed or "floor" in checks:
        if scenario.model.enable_caching:
            raise UsageError(
                f"{scenario.id}: export --vllm-test takes scenarios without prefix caching"
            )
        return "manager"
    found = ", ".join(sorted(checks)) or result.verdict.value
    raise UsageError(
        f"{scenario.id}: nothing to export ({found}); --vllm-test reproduces a lookahead, a "
        "floor shortfall, a disagreement or a crash"
    )



def render_vllm_test(scenario: Scenario, result: ScenarioResult, vllm: Vllm) -> VllmTest:
    """The pytest module reproducing ``result`` (see the module's docstring)."""
    shape = _shape(scenario, result)
    render = {"lookahead": lookahead_test, "warmup": warmup_test, "manager": manager_test}[shape]
    source = LICENSE + "\n".join(render(scenario, result, vllm)) + "\n"
    return VllmTest(scenario.id, shape, SHAPES[shape], source)
