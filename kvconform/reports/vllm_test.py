"""``kvconform export SCENARIO --vllm-test``: a scenario's finding as a test for vLLM itself.

The file it writes is one self-contained pytest module in the style of vLLM's
``tests/v1/core``: it imports vLLM (and torch) only, builds the scenario's
``KVCacheSpec``s, its ``KVCacheConfig`` and a ``KVCacheManager`` as vLLM's
scheduler builds it, replays the scenario's ``allocate_slots`` calls on vLLM's own
``Request`` objects, and asserts what the scenario found broken:

* ``floor`` -- every group holds at least the blocks the written positions need
  (``cdiv(min(computed + scheduled + lookahead, max_model_len), block span)`` for a
  token-indexed group; the numbers are kvconform's floor table, written into the
  test so that it needs nothing else), for the live manager and for the warmup
  predictor ``_reserved_block_count``;
* ``agree`` -- ``_reserved_block_count`` (its running maximum since the request
  started, as vLLM never returns blocks on a rollback) equals what the live
  manager holds;
* a crash -- the replay itself raises (vLLM's exception is the failure).

The test fails against the vLLM the finding was made on and passes once vLLM is
fixed, so it can go upstream as it is. Only trajectory scenarios without prefix
caching can be exported: their calls are fixed by the file; a warmup or scheduler
scenario's calls are decided by vLLM.

The specs and keyword arguments are rendered from the objects kvconform built
for the run, filtered by the installed vLLM's signatures, so the file is valid
for that vLLM release (named in its docstring).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import textwrap
from typing import Any

from kvconform import __version__
from kvconform.errors import UsageError
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.live import first_output_token
from kvconform.oracles.resolve import group_specs, new_trajectory
from kvconform.oracles.vllm import Vllm

__all__ = ["render_vllm_test", "test_name"]

EXPORTED_CHECKS = ("floor", "agree")


def test_name(scenario: Scenario) -> str:
    return "test_" + re.sub(r"[^0-9a-zA-Z]+", "_", scenario.id).strip("_").lower()


def _value(value: Any) -> str:
    """A spec field's value as Python source (torch dtypes by name)."""
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return f"torch.{str(value).removeprefix('torch.')}"
    if isinstance(value, tuple):
        return "(" + "".join(f"{_value(v)}, " for v in value).rstrip(" ") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _spec_source(spec: Any) -> str:
    """``FullAttentionSpec(block_size=16, ...)``: the fields that differ from their defaults."""
    parts = []
    for f in dataclasses.fields(spec):
        if not f.init:
            continue
        value = getattr(spec, f.name)
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if has_default and value == default:
            continue
        parts.append(f"{f.name}={_value(value)}")
    return f"{type(spec).__name__}({', '.join(parts)})"


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


def _kwargs_source(kwargs: dict[str, Any], indent: str) -> str:
    return "".join(f"{indent}{k}={_value(v)},\n" for k, v in kwargs.items())


def render_vllm_test(scenario: Scenario, result: ScenarioResult, vllm: Vllm) -> str:
    """The pytest module reproducing ``result`` (see the module's docstring)."""
    if scenario.kind != "trajectory":
        raise UsageError(
            f"{scenario.id}: export --vllm-test takes trajectory scenarios; a {scenario.kind} "
            "scenario's calls are decided by vLLM, not by the file"
        )
    if any(c.refused for step in scenario.steps for c in step.calls):
        raise UsageError(f"{scenario.id}: export --vllm-test takes scenarios without refused calls")
    if scenario.model.enable_caching:
        raise UsageError(
            f"{scenario.id}: export --vllm-test takes scenarios without prefix caching"
        )
    crashed = result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH
    checks = sorted({f.check for f in result.failures} & set(EXPORTED_CHECKS))
    if not checks and not crashed:
        found = ", ".join(sorted({f.check for f in result.failures})) or result.verdict.value
        raise UsageError(
            f"{scenario.id}: nothing to export ({found}); --vllm-test reproduces a floor "
            "shortfall, a disagreement or a crash"
        )
    # vLLM's classes through the compatibility package, for their signatures only.
    manager_module = vllm.optional_module("vllm.v1.core.kv_cache_manager")
    request_module = vllm.optional_module("vllm.v1.request")
    if manager_module is None or request_module is None:
        raise vllm.missing("vllm.v1.core.kv_cache_manager and vllm.v1.request")
    run = new_trajectory(scenario, vllm)
    model = scenario.model
    specs = group_specs(vllm, model, run.num_speculative_tokens)
    options = vllm.manager_options(
        run.method, run.num_speculative_tokens, run.sample_from_anchor, model.enable_caching
    )
    manager_kwargs = _accepted(
        manager_module.KVCacheManager,
        dict(
            max_model_len=model.max_model_len,
            scheduler_block_size=model.scheduler_block_size,
            hash_block_size=model.hash_block_size,
            enable_caching=False,
            dcp_world_size=model.dcp_world_size,
            log_stats=False,
            **dict(options),
        ),
    )
    request_keywords = _accepted(
        request_module.Request,
        dict(pooling_params=None, block_hasher=None, request_id=1, prompt_token_ids=1),
    )
    spec_classes = sorted({type(s).__name__ for s in specs})
    encoder = scenario.encoder_lens()
    prompts = {
        request: ((index + 1) * 1_000_000, spec.prompt_len)
        for index, (request, spec) in enumerate(scenario.requests.items())
    }
    outputs = {name: first_output_token(i) for i, name in enumerate(scenario.requests)}
    calls = []
    for step in scenario.steps:
        for c in step.calls:
            calls.append(
                (
                    step.index,
                    c.request,
                    c.action.value,
                    c.computed,
                    c.scheduled,
                    c.rejected,
                    c.sampled,
                    c.first_chunk,
                )
            )
    floors: dict[tuple[int, str, int], int] = {}
    if result.trajectory is not None:
        for obs in result.trajectory.observations:
            floors[(obs.step, obs.request, obs.group)] = obs.floor
    records = [" ".join(f.message.split()) for f in result.failures if f.check in checks]
    finding = (result.error or "") if crashed else "; ".join(records[:2])
    if len(records) > 2:
        finding += f"; and {len(records) - 2} more such records"
    summary = textwrap.fill(finding, 88, initial_indent="    ", subsequent_indent="    ")
    what = (
        "building and driving the KVCacheManager must not raise"
        if crashed
        else " and ".join(
            {
                "floor": "every party holds the blocks its written positions need",
                "agree": "_reserved_block_count reserves what KVCacheManager holds",
            }[c]
            for c in checks
        )
    )
    name = test_name(scenario)
    steps_source = "".join(f"    {c!r},\n" for c in calls)
    floors_source = "".join(f"    {k!r}: {v},\n" for k, v in sorted(floors.items()))
    assert_floor = "floor" in checks
    assert_agree = "agree" in checks
    lines = [
        f'"""{scenario.id}: {what}.',
        "",
        *textwrap.wrap(
            f"Against vLLM {vllm.version}, the scenario {scenario.id} ({scenario.file}) found:",
            88,
        ),
        "",
        summary,
        "",
        "This test replays the scenario's calls on vLLM's own KVCacheManager, as the",
        "scheduler makes them around allocate_slots, and asks the warmup predictor",
        "_reserved_block_count for the same token counts. It fails while the finding holds.",
        f"Written by `kvconform export {scenario.id} --vllm-test` (kvconform {__version__});",
        "it needs vLLM only.",
        '"""',
        "",
        "import torch  # noqa: F401 - the specs' dtypes",
        "",
        "from vllm import SamplingParams",
        "from vllm.v1.core.kv_cache_manager import KVCacheManager",
        "from vllm.v1.kv_cache_interface import (",
        *[f"    {c}," for c in sorted({*spec_classes, "KVCacheConfig", "KVCacheGroupSpec"})],
        ")",
        "from vllm.v1.request import Request, RequestStatus",
        "from vllm.v1.worker.gpu.warmup import _reserved_block_count",
        "",
        f"MAX_MODEL_LEN = {model.max_model_len}",
        f"NUM_BLOCKS = {model.num_blocks}",
        f"# The lookahead vLLM reserves with ({run.lookahead_source}).",
        f"LOOKAHEAD = {run.lookahead}",
        "SPECS = [",
        *[f"    {_spec_source(s)}," for s in specs],
        "]",
        "# Per request: (first token id, prompt length) and its encoder tokens.",
        f"PROMPTS = {prompts!r}",
        f"ENCODER_LENS = {dict(encoder)!r}",
        f"FIRST_OUTPUT = {outputs!r}",
        "# (step, request, action, computed, scheduled, rejected, sampled, first chunk)",
        "CALLS = [",
        steps_source.rstrip("\n"),
        "]",
        "# Blocks each (step, request, group) needs: the positions written, target and drafter.",
        "FLOORS = {" + ("" if floors else "}  # none: the replay fails before it allocates"),
        *([floors_source.rstrip("\n"), "}"] if floors else []),
        "",
        "",
        "def new_manager() -> KVCacheManager:",
        '    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(SPECS)]',
        "    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)",
        "    return KVCacheManager(",
        "        kv_cache_config=config,",
        _kwargs_source(manager_kwargs, "        ").rstrip("\n"),
        "    )",
        "",
        "",
        "def new_request(name: str) -> Request:",
        "    first, length = PROMPTS[name]",
        "    return Request(",
        "        request_id=name,",
        "        prompt_token_ids=list(range(first, first + length)),",
        "        sampling_params=SamplingParams(max_tokens=1 << 20, ignore_eos=True),",
        *(["        pooling_params=None,"] if "pooling_params" in request_keywords else []),
        *(["        block_hasher=None,"] if "block_hasher" in request_keywords else []),
        "    )",
        "",
        "",
        f"def {name}():",
        "    manager = new_manager()",
        "    requests = {name: new_request(name) for name in PROMPTS}",
        "    outputs = dict(FIRST_OUTPUT)",
        "    predicted_max: dict[str, list[int]] = {}",
        "    problems = []",
        "    for step, name, action, computed, scheduled, rejected, sampled, first in CALLS:",
        "        request = requests[name]",
        '        if action in ("finish", "preempt"):',
        "            manager.free(request)",
        "            predicted_max.pop(name, None)",
        '            if action == "preempt":',
        "                request.status = RequestStatus.PREEMPTED",
        "                request.num_computed_tokens = 0",
        "            continue",
        "        encoder = ENCODER_LENS[name] if first else 0",
        '        extra = {"num_encoder_tokens": encoder} if first else {}',
        "        blocks = manager.allocate_slots(",
        "            request, scheduled, num_lookahead_tokens=LOOKAHEAD, **extra",
        "        )",
        '        assert blocks is not None, f"step {step}: the pool cannot serve {name}"',
        "        request.status = RequestStatus.RUNNING",
        "        request.num_computed_tokens = computed + scheduled",
        "        held = manager.get_block_ids(name)",
        "        maxima = predicted_max.setdefault(name, [0] * len(SPECS))",
        "        for group, spec in enumerate(SPECS):",
        "            predicted = _reserved_block_count(",
        "                computed + scheduled,",
        "                spec,",
        "                num_lookahead_tokens=LOOKAHEAD,",
        "                max_model_len=MAX_MODEL_LEN,",
        "                max_encoder_len=ENCODER_LENS[name],",
        "            )",
        "            maxima[group] = max(maxima[group], predicted)",
        "            live = len(held[group])",
        '            where = f"step {step}, request {name}, group {group} ({type(spec).__name__}), "',
        '            where += f"{computed} + {scheduled} tokens, lookahead {LOOKAHEAD}"',
        *(
            [
                "            floor = FLOORS[(step, name, group)]",
                "            if live < floor or predicted < floor:",
                "                problems.append(",
                '                    f"{where}: live {live}, predicted {predicted}, floor {floor}"',
                "                )",
            ]
            if assert_floor
            else []
        ),
        *(
            [
                "            if maxima[group] != live:",
                "                problems.append(",
                '                    f"{where}: KVCacheManager holds {live}, "',
                '                    f"_reserved_block_count reserves {maxima[group]}"',
                "                )",
            ]
            if assert_agree
            else []
        ),
        "        request.num_computed_tokens -= rejected",
        "        if sampled:",
        "            request.append_output_token_ids(list(range(outputs[name], outputs[name] + sampled)))",
        "            outputs[name] += sampled",
        '    assert not problems, "\\n".join(problems[:10])',
        "",
    ]
    return "\n".join(lines)
