"""The three shapes of an exported test (:mod:`kvconform.reports.vllm_test`): ``lookahead``,
``warmup`` and ``manager``, each the lines of a pytest module for vLLM's own test tree."""

from __future__ import annotations

from kvconform.errors import UsageError
from kvconform.model.floors import TOKEN_COLUMNS
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kinds import Kind
from kvconform.model.methods import method_for
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.resolve import group_specs, new_trajectory
from kvconform.oracles.vllm import Vllm
from kvconform.reports.vllm_test_source import (
    dict_source,
    docstring_lines,
    spec_imports,
    specs_block,
    string_lines,
    test_name,
)


def lookahead_test(scenario: Scenario, result: ScenarioResult, vllm: Vllm) -> list[str]:
    spec = scenario.speculative
    entry = method_for(spec.method if spec is not None else None)
    if spec is None or entry is None:
        raise UsageError(f"{scenario.id}: no speculative method kvconform knows to export")
    k = spec.num_speculative_tokens
    if entry.anchor_layouts:
        cases = [
            ({"sample_from_anchor": True}, entry.lookahead(k, True)),
            ({"sample_from_anchor": False}, entry.lookahead(k, False)),
        ]
    else:
        cases = [({}, entry.lookahead(k))]
    expected = {
        entry.lookahead(k, anchor): f"NUM_SPEC_STEPS + {entry.lookahead(k, anchor) - k}"
        if entry.lookahead(k, anchor) > k
        else "NUM_SPEC_STEPS"
        for anchor in (True, False)
    }
    params = "".join(
        f"        ({dict_source(config)}, {expected[value]}),\n" for config, value in cases
    ).rstrip("\n")
    name = test_name(scenario)
    return [
        *docstring_lines(
            f"VllmConfig.num_lookahead_tokens must reserve what {spec.method}'s drafter writes.",
            scenario,
            result,
            vllm,
            "lookahead",
            "The scheduler and the warmup both reserve VllmConfig.num_lookahead_tokens KV "
            "slots past the scheduled tokens, where the drafter writes. "
            f"{spec.method}: {entry.rule.reason}. A lookahead one short leaves the "
            "drafter's last query without a block at a block boundary.",
        ),
        "",
        "from types import SimpleNamespace",
        "",
        "import pytest",
        "",
        "from vllm.config.speculative import SpeculativeConfig",
        "from vllm.config.vllm import VllmConfig",
        "",
        f"NUM_SPEC_STEPS = {k}",
        "",
        "",
        "def _config(method: str, draft_hf_config: dict) -> VllmConfig:",
        '    """A real VllmConfig built without __post_init__ (which needs a resolvable draft',
        '    model); the lookahead property reads the speculative and diffusion configs only."""',
        "    speculative_config = object.__new__(SpeculativeConfig)",
        '    object.__setattr__(speculative_config, "method", method)',
        '    object.__setattr__(speculative_config, "num_speculative_tokens", NUM_SPEC_STEPS)',
        "    object.__setattr__(",
        "        speculative_config,",
        '        "draft_model_config",',
        "        SimpleNamespace(hf_config=SimpleNamespace(**draft_hf_config)),",
        "    )",
        "    config = object.__new__(VllmConfig)",
        '    object.__setattr__(config, "speculative_config", speculative_config)',
        '    object.__setattr__(config, "diffusion_config", None)',
        "    return config",
        "",
        "",
        "@pytest.mark.parametrize(",
        '    ("draft_hf_config", "expected"),',
        "    [",
        params,
        "    ],",
        ")",
        f"def {name}(draft_hf_config: dict, expected: int):",
        f'    config = _config("{spec.method}", draft_hf_config)',
        "    assert config.num_lookahead_tokens == expected, (",
        f'        f"{spec.method} with {{draft_hf_config}}: num_lookahead_tokens is "',
        '        f"{config.num_lookahead_tokens}, but the drafter writes {expected} KV positions "',
        *string_lines(
            f"past the scheduled range ({entry.rule.formula}: {entry.rule.reason}); the "
            "scheduler and the warmup reserve num_lookahead_tokens, so the drafter's last "
            "query lands outside the request's blocks at a block boundary",
            "        ",
        ),
        "    )",
    ]


# -- warmup ------------------------------------------------------------------------------

# Why the warmup must hold what the manager holds, by what the scenario varies.
_WHY_DCP = (
    "with decode context parallelism a block of a dcp_sharded spec spans block_size x "
    "dcp_world_size tokens in KVCacheManager (SingleTypeKVCacheManager.__init__)"
)
_WHY_ENCODER = (
    "the mixed warmup's requests carry no encoder input (mm_features=[]), and the "
    "scheduler reserves cross-attention blocks only for the encoder tokens it schedules"
)


def warmup_test(scenario: Scenario, result: ScenarioResult, vllm: Vllm) -> list[str]:
    model = scenario.model
    run = new_trajectory(scenario, vllm)
    specs = group_specs(vllm, model, run.num_speculative_tokens)
    k = run.num_speculative_tokens
    cross = any(GROUP_TYPES[g.type].encoder for g in model.groups)
    dcp = model.dcp_world_size
    if scenario.kind is Kind.WARMUP and scenario.warmup is not None:
        sizes = [scenario.warmup.mixed_num_tokens]
    else:
        sizes = sorted(
            {c.scheduled + 1 for step in scenario.steps for c in step.calls if c.first_chunk}
        )
    why = "; ".join(([_WHY_DCP] if dcp > 1 else []) + ([_WHY_ENCODER] if cross else []))
    if not why:
        why = "the warmup hand-builds its SchedulerOutputs"
    name = test_name(scenario)
    dcp_param = [1, dcp] if dcp > 1 else [1]
    return [
        *docstring_lines(
            "The V2 mixed warmup must reserve the KV blocks the scheduler would reserve.",
            scenario,
            result,
            vllm,
            "warmup",
            "run_mixed_prefill_decode_warmup hand-builds its SchedulerOutputs and sizes "
            "every request with _warmup_block_counter; what it hands the model runner must "
            "be what KVCacheManager.allocate_slots gives the same request at the same step, "
            f"or the warmup reserves other blocks than serving does ({why}).",
        ),
        "",
        "from types import SimpleNamespace",
        "",
        "import pytest",
        "import torch",
        "",
        "from tests.v1.core.test_prefix_caching import make_kv_cache_manager",
        "from tests.v1.core.utils import create_requests",
        *spec_imports(specs, "KVCacheConfig", "KVCacheGroupSpec"),
        "from vllm.v1.worker.gpu.warmup import run_mixed_prefill_decode_warmup",
        "",
        f"HASH_BLOCK_SIZE = {model.hash_block_size}",
        f"SCHEDULER_BLOCK_SIZE = {model.scheduler_block_size}",
        f"MAX_MODEL_LEN = {model.max_model_len}",
        f"MAX_ENCODER_LEN = {model.max_encoder_len}",
        f"NUM_SPEC_STEPS = {k}",
        f"NUM_LOOKAHEAD_TOKENS = {run.lookahead}  # VllmConfig.num_lookahead_tokens",
        "NUM_BLOCKS = 1024",
        *specs_block(specs),
        "",
        "",
        "def _make_runner(dcp_world_size: int) -> SimpleNamespace:",
        '    """Stub model runner exposing only what the warmup entry points read."""',
        "    return SimpleNamespace(",
        "        num_speculative_steps=NUM_SPEC_STEPS,",
        "        speculative_config=SimpleNamespace() if NUM_SPEC_STEPS else None,",
        "        adaptive_verification=None,",
        "        rejection_sampler=None,",
        "        decode_query_len=NUM_SPEC_STEPS + 1,",
        "        is_pooling_model=False,",
        f"        is_encoder_decoder={cross},",
        "        is_last_pp_rank=True,",
        "        max_num_reqs=4,",
        "        max_model_len=MAX_MODEL_LEN,",
        "        dcp_size=dcp_world_size,",
        "        model_config=SimpleNamespace(get_vocab_size=lambda: 64),",
        "        model_state=SimpleNamespace(max_encoder_len=MAX_ENCODER_LEN),",
        "        scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=2048),",
        "        kv_cache_config=SimpleNamespace(",
        "            kv_cache_groups=_kv_cache_groups(), num_blocks=NUM_BLOCKS",
        "        ),",
        "        vllm_config=SimpleNamespace(",
        "            num_lookahead_tokens=NUM_LOOKAHEAD_TOKENS, is_mm_encoder_only=False",
        "        ),",
        "        kv_block_zeroer=None,",
        "        kv_connector=SimpleNamespace(set_disabled=lambda disabled: None),",
        "    )",
        "",
        "",
        "class _StepRecorder:",
        '    """Per warmup request, its steps: (num_computed, num_scheduled, blocks held per group)."""',
        "",
        "    def __init__(self) -> None:",
        "        self.steps: dict[str, list[tuple[int, int, list[int]]]] = {}",
        "        self._held: dict[str, list[int]] = {}",
        "",
        "    def execute_model(self, scheduler_output) -> None:",
        "        for new_req in scheduler_output.scheduled_new_reqs:",
        "            self._held[new_req.req_id] = [len(ids) for ids in new_req.block_ids]",
        "            self._record(new_req.req_id, new_req.num_computed_tokens, scheduler_output)",
        "        cached = scheduler_output.scheduled_cached_reqs",
        "        for i, req_id in enumerate(cached.req_ids):",
        "            new_block_ids = cached.new_block_ids[i]",
        "            if new_block_ids is not None:",
        "                self._held[req_id] = [",
        "                    held + len(ids)",
        "                    for held, ids in zip(self._held[req_id], new_block_ids)",
        "                ]",
        "            self._record(req_id, cached.num_computed_tokens[i], scheduler_output)",
        "",
        "    def _record(self, req_id: str, num_computed: int, scheduler_output) -> None:",
        "        num_scheduled = scheduler_output.num_scheduled_tokens[req_id]",
        "        self.steps.setdefault(req_id, []).append(",
        "            (num_computed, num_scheduled, list(self._held[req_id]))",
        "        )",
        "",
        "    def sample_tokens(self, grammar_output=None) -> None:",
        "        return None",
        "",
        "",
        "def _scheduler_holds(",
        "    steps: list[tuple[int, int, list[int]]], dcp_world_size: int",
        ") -> list[list[int]]:",
        '    """What KVCacheManager holds per group after each step of one request, allocated as',
        "    the scheduler allocates (no encoder tokens: the warmup's requests carry none).\"\"\"",
        "    manager = make_kv_cache_manager(",
        "        _kv_cache_config(),",
        "        max_model_len=MAX_MODEL_LEN,",
        "        scheduler_block_size=SCHEDULER_BLOCK_SIZE,",
        "        hash_block_size=HASH_BLOCK_SIZE,",
        "        enable_caching=False,",
        "        dcp_world_size=dcp_world_size,",
        "    )",
        "    num_computed, num_scheduled, _ = steps[-1]",
        "    (request,) = create_requests(",
        "        num_requests=1,",
        "        num_tokens=num_computed + num_scheduled,",
        "        block_size=HASH_BLOCK_SIZE,",
        "    )",
        "    held = []",
        "    for num_computed, num_scheduled, _ in steps:",
        "        request.num_computed_tokens = num_computed",
        "        blocks = manager.allocate_slots(",
        "            request, num_scheduled, num_lookahead_tokens=NUM_LOOKAHEAD_TOKENS",
        "        )",
        '        assert blocks is not None, f"{NUM_BLOCKS} blocks cannot serve the step"',
        "        held.append([len(ids) for ids in manager.get_block_ids(request.request_id)])",
        "    return held",
        "",
        "",
        f"@pytest.mark.parametrize(\"dcp_world_size\", {dcp_param!r})",
        f"@pytest.mark.parametrize(\"num_tokens\", {sizes!r})",
        f"def {name}(num_tokens: int, dcp_world_size: int):",
        "    recorder = _StepRecorder()",
        "    assert run_mixed_prefill_decode_warmup(",
        "        _make_runner(dcp_world_size),",
        "        worker_execute_model=recorder.execute_model,",
        "        worker_sample_tokens=recorder.sample_tokens,",
        "        num_tokens=num_tokens,",
        '    ), "the mixed warmup skipped itself"',
        "",
        "    for req_id, steps in recorder.steps.items():",
        "        expected = _scheduler_holds(steps, dcp_world_size)",
        "        warmup = [held for _, _, held in steps]",
        "        assert warmup == expected, (",
        '            f"{req_id}, steps (computed, scheduled) {[s[:2] for s in steps]}: the warmup "',
        '            f"holds {warmup} blocks per group, KVCacheManager.allocate_slots {expected}. "',
        *string_lines(f"The warmup must reserve what the scheduler reserves: {why}", " " * 12),
        "        )",
    ]


# -- manager -----------------------------------------------------------------------------


def manager_test(scenario: Scenario, result: ScenarioResult, vllm: Vllm) -> list[str]:
    model = scenario.model
    run = new_trajectory(scenario, vllm)
    specs = group_specs(vllm, model, run.num_speculative_tokens)
    crashed = result.verdict is Verdict.ERROR
    if not crashed and any(
        GROUP_TYPES[g.type].floor is not TOKEN_COLUMNS for g in model.groups
    ):
        raise UsageError(
            f"{scenario.id}: export --vllm-test writes a floor shortfall of token-indexed "
            "groups only"
        )
    sizes = sorted({r.prompt_len for r in scenario.requests.values()})
    lookaheads = sorted({0, run.lookahead})
    name = test_name(scenario)
    types = sorted({type(s).__name__ for s in specs})
    what = ", ".join(types)
    lines = [
        *docstring_lines(
            f"KVCacheManager must build and reserve for a {what} group."
            if crashed
            else "KVCacheManager must hold a block for every position a request writes.",
            scenario,
            result,
            vllm,
            "manager",
            f"Every registered spec gets its manager, and a {what} group's table is indexed "
            "by token position: after allocate_slots a request holds cdiv(num_tokens + "
            "num_lookahead_tokens, block_size) blocks, the columns the target and the "
            "drafter write.",
        ),
        "",
        "import pytest",
        "import torch",
        "",
        "from tests.v1.core.test_prefix_caching import make_kv_cache_manager",
        "from tests.v1.core.utils import create_requests",
        "from vllm.utils.math_utils import cdiv",
        *spec_imports(specs, "KVCacheConfig", "KVCacheGroupSpec"),
        "",
        f"HASH_BLOCK_SIZE = {model.hash_block_size}",
        f"MAX_MODEL_LEN = {model.max_model_len}",
        f"NUM_BLOCKS = {model.num_blocks}",
        *specs_block(specs),
        "",
        "",
        f'@pytest.mark.parametrize("num_lookahead_tokens", {lookaheads!r})',
        f'@pytest.mark.parametrize("num_tokens", {sizes!r})',
        f"def {name}(num_tokens: int, num_lookahead_tokens: int):",
    ]
    build = [
        "manager = make_kv_cache_manager(",
        "    _kv_cache_config(),",
        "    max_model_len=MAX_MODEL_LEN,",
        "    hash_block_size=HASH_BLOCK_SIZE,",
        "    enable_caching=False,",
        ")",
    ]
    if crashed:
        lines += [
            "    try:",
            *[f"        {line}" for line in build],
            "    except TypeError as exc:",
            "        pytest.fail(",
            '            "KVCacheManager must build a manager for every spec it registers; the "',
            '            "coordinator passes every manager the same keywords, so a manager "',
            '            "that spells out its own list breaks when one is added: "',
            '            f"{type(exc).__name__}: {exc}"',
            "        )",
        ]
    else:
        lines += [f"    {line}" for line in build]
    lines += [
        "    (request,) = create_requests(",
        "        num_requests=1, num_tokens=num_tokens, block_size=HASH_BLOCK_SIZE",
        "    )",
        "    blocks = manager.allocate_slots(",
        "        request, num_tokens, num_lookahead_tokens=num_lookahead_tokens",
        "    )",
        '    assert blocks is not None, f"{NUM_BLOCKS} blocks cannot serve {num_tokens} tokens"',
        "",
        "    held = [len(ids) for ids in manager.get_block_ids(request.request_id)]",
        "    num_written = min(num_tokens + num_lookahead_tokens, MAX_MODEL_LEN)",
        "    need = [",
        "        cdiv(num_written, group.kv_cache_spec.block_size)",
        "        for group in _kv_cache_groups()",
        "    ]",
        "    assert all(h >= n for h, n in zip(held, need)), (",
        '        f"{num_tokens} tokens, lookahead {num_lookahead_tokens}: the manager holds {held} "',
        '        f"blocks per group, but the target and the drafter write {need} blocks\' worth of "',
        '        "positions; a position past the held blocks is written wherever its block-table "',
        '        "column points"',
        "    )",
    ]
    return lines
