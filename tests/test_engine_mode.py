"""Engine mode on CPU: the hooks with a worker stand-in, the driver on recordings, skipping.

vLLM's real engine needs CUDA; these tests exercise everything around it. The hooks are
installed on stand-ins of the three methods engine mode hooks (a worker whose
``execute_model`` receives vLLM's own ``SchedulerOutput`` objects, a warmup that calls
it, a ``BlockTables`` whose ``compute_slot_mappings`` returns a slot tensor) and must
record what a real run would and remove themselves afterwards. The driver is fed a
recording shaped like the one the H200 run of vLLM 0.25.0 produced (docs/engine-mode.md).
"""

from __future__ import annotations

import types
from dataclasses import replace

import pytest
import torch

from kvconform.errors import EngineFailed
from kvconform.harness.checks import judge
from kvconform.harness.drivers.engine import trajectory_from
from kvconform.harness.runner import exit_status, run_scenario
from kvconform.model.results import Verdict
from kvconform.oracles import engine as engine_party
from kvconform.oracles.vllm.engine import HookPoint, hook_points

ENGINE_SCENARIO = """
    name: tiny-engine
    kind: engine
    model: {block_size: 16, max_model_len: 512}
    speculative: {method: eagle, num_speculative_tokens: 5}
    engine: {target: {layers: 2}, draft: {layers: 1}}
    requests:
      a: {prompt_len: 39, max_tokens: 40}
      b: {prompt_len: 25, max_tokens: 40}
"""


# -- stand-ins for the hooked methods -----------------------------------------------------


class StandInWorker:
    """Calls nothing of vLLM's: the hooks wrap its execute_model as they wrap Worker's."""

    def __init__(self, index_to_req_id: dict[int, str]) -> None:
        self.model_runner = types.SimpleNamespace(
            req_states=types.SimpleNamespace(index_to_req_id=index_to_req_id)
        )
        self.executed: list[object] = []

    def execute_model(self, scheduler_output: object) -> str:
        self.executed.append(scheduler_output)
        return "ran"


class StandInBlockTables:
    """Maps position p of batch row r to slot (table[r][p // 16]) * 16 + p % 16, as vLLM's kernel."""

    def __init__(self, rows: dict[int, list[int]]) -> None:
        self.rows = rows
        self.block_sizes_tensor = torch.tensor([16])
        self.blocks_per_kv_block = [1]

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded):
        out = torch.full((1, num_tokens_padded), -1, dtype=torch.int64)
        for r, state in enumerate(idx_mapping.tolist()):
            for t in range(int(query_start_loc[r]), int(query_start_loc[r + 1])):
                p = int(positions[t])
                out[0, t] = self.rows[state][p // 16] * 16 + p % 16
        return out


def new_request(req_id: str, blocks: list[int], prompt_len: int):
    from vllm.v1.core.sched.output import NewRequestData

    tokens = list(range(prompt_len))
    request = NewRequestData(req_id, tokens, [], None, None, (blocks,), 0, None, *_prefill(tokens))
    return request


def _prefill(tokens: list[int]) -> tuple[list[int], ...]:
    """0.34's NewRequestData also takes the tokens to prefill (prompt, then any outputs)."""
    import inspect

    from vllm.v1.core.sched.output import NewRequestData

    return (tokens,) if "prefill_token_ids" in inspect.signature(NewRequestData).parameters else ()


def scheduler_output(new=(), cached=(), finished=(), drafts=None):
    """vLLM's own SchedulerOutput; cached: (req_id, computed, scheduled, new blocks or None)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = [request for request, _ in new]
    counts = {request.req_id: scheduled for request, scheduled in new}
    data = output.scheduled_cached_reqs
    for req_id, computed, scheduled, blocks in cached:
        data.req_ids.append(req_id)
        data.num_computed_tokens.append(computed)
        data.new_block_ids.append((blocks,) if blocks is not None else None)
        data.num_output_tokens.append(1)
        counts[req_id] = scheduled
    output.num_scheduled_tokens = counts
    output.scheduled_spec_decode_tokens = drafts or {}
    output.finished_req_ids = set(finished)
    return output


def drafter_call(tables, *args):
    """Calls compute_slot_mappings from a frame whose file is the drafter's, as vLLM's does."""
    code = compile("out = tables.compute_slot_mappings(*args)", "vllm/v1/worker/gpu/spec_decode/x.py",
                   "exec")  # fmt: skip
    scope = {"tables": tables, "args": args}
    exec(code, scope)  # noqa: S102 - a frame in the drafter's file, nothing else
    return scope["out"]


def test_hooks_record_warmup_and_serving_steps_then_remove_themselves():
    worker = StandInWorker({0: "_warmup_0_", 1: "a-1234abcd"})
    tables = StandInBlockTables({0: [1, 0], 1: [3, 4, 0]})
    original_execute = StandInWorker.execute_model
    original_slots = StandInBlockTables.compute_slot_mappings

    def warmup_kernels(runner, execute):
        execute(scheduler_output(new=[(new_request("_warmup_0_", [1], 7), 7)]))
        execute(scheduler_output(cached=[("_warmup_0_", 7, 6, None)],
                                 drafts={"_warmup_0_": [0] * 5}))  # fmt: skip
        execute(scheduler_output(finished=["_warmup_0_"]))

    module = types.SimpleNamespace(warmup_kernels=warmup_kernels)
    points = {
        "execute_model": HookPoint(StandInWorker, "execute_model"),
        "warmup_kernels": HookPoint(module, "warmup_kernels"),
        "slot_mappings": HookPoint(StandInBlockTables, "compute_slot_mappings"),
    }
    recording = engine_party.EngineRecording()
    hooks = engine_party.EngineHooks(recording)
    with hooks.installed(points):
        assert StandInWorker.execute_model is not original_execute
        module.warmup_kernels(None, worker.execute_model)
        hooks.phase = "serving"
        assert (
            worker.execute_model(scheduler_output(new=[(new_request("a-1234abcd", [3], 39), 16)]))
            == "ran"
        )
        worker.execute_model(scheduler_output(cached=[("a-1234abcd", 16, 23, [4])]))
        # The drafter maps positions 39..41 of request a (state row 1): column 2, past the
        # two blocks a holds, where the persistent row holds 0, the null block.
        drafter_call(tables, torch.tensor([1]), torch.tensor([0, 3]), torch.tensor([39, 40, 41]), 4)
    assert StandInWorker.execute_model is original_execute
    assert StandInBlockTables.compute_slot_mappings is original_slots
    assert module.warmup_kernels is warmup_kernels
    assert len(worker.executed) == 5  # every call reached the worker

    phases = [(s["phase"], [(r["request"], r["computed"], r["scheduled"], r["drafts"], r["blocks"])
                            for r in s["requests"]], s["finished"]) for s in recording.steps]  # fmt: skip
    assert phases == [
        ("warmup", [("_warmup_0_", 0, 7, 0, [[1]])], []),
        ("warmup", [("_warmup_0_", 7, 6, 5, [[1]])], []),
        ("warmup", [], ["_warmup_0_"]),
        ("serving", [("a-1234abcd", 0, 16, 0, [[3]])], []),
        ("serving", [("a-1234abcd", 16, 23, 0, [[3, 4]])], []),
    ]
    (mapping,) = recording.mappings
    assert mapping["role"] == "drafter" and mapping["step"] == 4
    assert mapping["rows"] == [
        {
            "request": "a-1234abcd",
            "group": 0,
            "positions": [39, 40, 41],
            "slots": [7, 8, 9],
        }  # fmt: skip
    ]
    assert recording.block_sizes == [16] and recording.blocks_per_kv_block == [1]


def test_hooks_are_removed_when_the_engine_raises():
    points = {"execute_model": HookPoint(StandInWorker, "execute_model")}
    original = StandInWorker.execute_model
    recording = engine_party.EngineRecording()
    with pytest.raises(RuntimeError), engine_party.EngineHooks(recording).installed(points):
        raise RuntimeError("engine start failed")
    assert StandInWorker.execute_model is original
    assert "no warmup_kernels" in " ".join(recording.notes)


def test_the_installed_vllm_has_every_hook_point():
    points = hook_points()
    assert points["execute_model"].owner.__name__ == "Worker"
    assert points["warmup_kernels"] is not None
    assert points["slot_mappings"].owner.__name__ == "BlockTables"


# -- the driver on a recording ------------------------------------------------------------


def h200_like_recording(warmup_decode_blocks: list[int]) -> engine_party.EngineRecording:
    """Shaped like vLLM 0.25.0's run on the H200: a warmup request, then request a serving."""
    steps = [
        {"index": 0, "phase": "warmup", "finished": [], "requests": [
            {"request": "_warmup_0_", "new": True, "resumed": False, "computed": 0,
             "scheduled": 7, "drafts": 0, "blocks": [[1]]}]},
        {"index": 1, "phase": "warmup", "finished": [], "requests": [
            {"request": "_warmup_0_", "new": False, "resumed": False, "computed": 7,
             "scheduled": 6, "drafts": 5, "blocks": [warmup_decode_blocks]}]},
        {"index": 2, "phase": "warmup", "finished": ["_warmup_0_"], "requests": []},
        {"index": 3, "phase": "serving", "finished": [], "requests": [
            {"request": "a-0f0f0f0f", "new": True, "resumed": False, "computed": 0,
             "scheduled": 39, "drafts": 0, "blocks": [[5, 6, 7, 8]]}]},
        {"index": 4, "phase": "serving", "finished": ["a-0f0f0f0f"], "requests": []},
    ]  # fmt: skip
    mappings = [
        # The drafter after the warmup's decode step: positions 13..17 (column 1 past 16).
        {"step": 1, "role": "drafter", "rows": [
            {"request": "_warmup_0_", "group": 0, "positions": [13, 16],
             "slots": [1 * 16 + 13, 0 * 16 + 0]}]},
        {"step": 3, "role": "target", "rows": [
            {"request": "a-0f0f0f0f", "group": 0, "positions": [0, 38], "slots": [80, 8 * 16 + 6]}]},
    ]  # fmt: skip
    return engine_party.EngineRecording(
        vllm_version="0.25.0", device="NVIDIA H200", model_runner="v2", lookahead=5,
        lookahead_source="the engine's Scheduler.num_lookahead_tokens",
        kv_groups=[{"spec": "FullAttentionSpec", "block_size": 16}], steps=steps,
        mappings=mappings, block_sizes=[16], blocks_per_kv_block=[1], outputs={"a": 40},
        free_blocks_after=99, pool_blocks=100, seconds={"engine_up": 21.9},
    )  # fmt: skip


def test_warmup_records_below_the_floor_fail_and_serving_conforms(scenario_from):
    scenario = scenario_from(
        ENGINE_SCENARIO.replace("      b: {prompt_len: 25, max_tokens: 40}\n", "")
    )
    run = trajectory_from(scenario, h200_like_recording([1]))
    failures = judge(run, ("lookahead", "floor", "agree", "sanity", "slots")).failures
    by_check = {f.check for f in failures}
    assert by_check == {"floor", "slots"}
    (floor,) = [f for f in failures if f.check == "floor"]
    assert floor.request == "_warmup_0_" and floor.warmup == 1 and floor.floor == 2
    assert "7 computed + 6 scheduled, 5 drafts" in floor.message
    assert "the drafter's positions 16..17 have no block" in floor.message
    (slots,) = [f for f in failures if f.check == "slots"]
    assert slots.request == "_warmup_0_" and slots.detail["positions"] == [16]
    assert "null block" in slots.message
    serving = [o for o in run.observations if o.live is not None]
    assert [o.request for o in serving] == ["a"] and serving[0].live >= serving[0].floor


def test_the_fixed_warmup_conforms(scenario_from):
    scenario = scenario_from(
        ENGINE_SCENARIO.replace("      b: {prompt_len: 25, max_tokens: 40}\n", "")
    )
    recording = h200_like_recording([1, 2])
    recording.mappings[0]["rows"][0]["slots"] = [1 * 16 + 13, 2 * 16 + 0]
    run = trajectory_from(scenario, recording)
    assert judge(run, ("lookahead", "floor", "agree", "sanity", "slots")).failures == []


def test_a_request_finished_short_of_its_max_tokens_is_a_sanity_failure(scenario_from):
    scenario = scenario_from(ENGINE_SCENARIO)
    recording = h200_like_recording([1, 2])
    recording.outputs = {"a": 12}
    failures = {
        f.request: f for f in judge(trajectory_from(scenario, recording), ("sanity",)).failures
    }
    assert failures.keys() == {"a", "b"}
    assert failures["a"].message.endswith(
        "the engine finished request a with 12 tokens, not its max_tokens 40"
    )
    assert failures["b"].message.endswith("the engine never finished request b (max_tokens 40)")
    assert {f.detail["invariant"] for f in failures.values()} == {"leaves requests unfinished"}


def test_a_leaked_block_after_the_run_is_a_sanity_failure(scenario_from):
    scenario = scenario_from(
        ENGINE_SCENARIO.replace("      b: {prompt_len: 25, max_tokens: 40}\n", "")
    )
    recording = h200_like_recording([1, 2])
    recording.free_blocks_after = 97
    (failure,) = judge(trajectory_from(scenario, recording), ("sanity",)).failures
    assert "97 free blocks, not all 99" in failure.message


def test_the_engines_lookahead_is_checked_against_kvconforms_table(scenario_from):
    scenario = scenario_from(
        ENGINE_SCENARIO.replace("      b: {prompt_len: 25, max_tokens: 40}\n", "")
    )
    recording = h200_like_recording([1, 2])
    recording.lookahead = 4
    (failure,) = judge(trajectory_from(scenario, recording), ("lookahead",)).failures
    assert "num_lookahead_tokens is 4" in failure.message


# -- without CUDA ---------------------------------------------------------------------------


def test_without_cuda_an_engine_scenario_is_skipped_with_the_reason(vllm, scenario_from):
    if not engine_party.unavailable_reason():
        pytest.skip("engine mode can run here")
    result = run_scenario(scenario_from(ENGINE_SCENARIO), vllm)
    assert result.verdict is Verdict.SKIPPED and result.ok
    assert "engine mode cannot run here: no CUDA device" in (result.skip_reason or "")
    assert exit_status([result]) == 0


def test_a_python_only_vllm_tree_cannot_run_the_engine(monkeypatch, tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "vllm", raising=False)
    assert "without its compiled extensions" in (engine_party.unavailable_reason() or "")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert "VLLM_TARGET_DEVICE=cpu" in (engine_party.unavailable_reason() or "")


def test_settings_travel_to_the_child_as_json(scenario_from):
    from kvconform.harness.drivers.engine import settings_for

    settings = settings_for(scenario_from(ENGINE_SCENARIO))
    again = engine_party.EngineSettings.from_json(settings.to_json())
    assert again == settings
    assert again.method == "eagle" and again.draft is not None and again.draft.layers == 1
    prompts = [r.prompt_token_ids for r in again.requests]
    assert [len(p) for p in prompts] == [39, 25] and prompts[0][:16] != prompts[1][:16]


def test_the_model_folder_is_a_transformers_config(tmp_path, monkeypatch):
    import json

    from kvconform.model.tiny_model import TinyModel
    from kvconform.oracles.tiny_models import model_folder

    monkeypatch.setenv("KVCONFORM_CACHE", str(tmp_path))
    folder = model_folder(TinyModel(layers=1))
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert model_folder(TinyModel(layers=1)) == folder


# -- the H200 recording: judged, and replayed on CPU -----------------------------------------

H200_RECORDING = "tests/data/engine/vllm-0.25.0-h200-eagle-k5-block16.json"
H200_SCENARIO = "scenarios/engine/engine-eagle-k5-block16.yaml"


def h200_run():
    from kvconform.harness.loader import load_file

    (scenario,) = load_file(H200_SCENARIO)
    recording = engine_party.EngineRecording.from_json(open(H200_RECORDING).read())
    return scenario, recording


def test_the_h200_run_of_vllm_0_25_0_shows_the_warmup_bug_and_a_conforming_serving_run():
    scenario, recording = h200_run()
    run = trajectory_from(scenario, recording)
    failures = judge(run, ("lookahead", "floor", "agree", "sanity", "slots")).failures
    assert [(f.check, f.request, f.warmup, f.floor) for f in failures] == [
        ("floor", f"_warmup_{i}_", 1, 2) for i in range(4)
    ]
    serving = [o for o in run.observations if o.live is not None]
    assert {o.request for o in serving} == {"a", "b", "c"}
    assert all(o.live == o.floor for o in serving)  # every serving step held exactly the floor
    assert run.slots is not None and run.slots.positions > 1000 and not run.slots.escapes


@pytest.mark.parametrize(
    ("scenario_file", "recording_file"),
    [
        (H200_SCENARIO, H200_RECORDING),
        (H200_SCENARIO, "tests/data/engine/vllm-0.26.0-h200-eagle-k5-block16.json"),
        # The V1 runner, a 150-token prompt prefilled in chunks of 64.
        ("scenarios/engine/engine-eagle-v1-runner.yaml",
         "tests/data/engine/vllm-0.26.0-h200-eagle-v1-runner.json"),
    ],
)  # fmt: skip
def test_the_recorded_serving_steps_replay_on_cpu_with_the_engines_counts(
    vllm, write_scenario, scenario_file, recording_file
):
    from kvconform.harness.engine_record import trajectory_yaml
    from kvconform.harness.loader import load_file

    (scenario,) = load_file(scenario_file)
    recording = engine_party.EngineRecording.from_json(open(recording_file).read())
    (replay,) = load_file(write_scenario(trajectory_yaml(scenario, recording), "replay.yaml"))
    result = run_scenario(replay, vllm)
    assert result.verdict is Verdict.PASSED, result.headline()
    engine_rows = [
        (row["request"].rpartition("-")[0], row["computed"], row["scheduled"], len(row["blocks"][0]))
        for step in recording.steps if step["phase"] == "serving" for row in step["requests"]
    ]  # fmt: skip
    replayed = [
        (o.request, o.computed, o.scheduled, o.live) for o in result.trajectory.observations
    ]
    # vLLM 0.33.0's allocator, asked for the engine's counts, holds what the engine held.
    assert sorted(replayed) == sorted(engine_rows)


# -- the fronts: doctor, reports, bad input --------------------------------------------------


def test_doctor_says_whether_engine_mode_can_run_here(vllm):
    from kvconform.fronts.doctor import doctor

    lines: list[str] = []
    doctor(vllm, lines.append)
    (line,) = [line for line in lines if line.startswith("engine mode")]
    reason = engine_party.unavailable_reason()
    assert line.endswith("can run here") if reason is None else reason in line


def test_every_report_says_why_an_engine_scenario_was_skipped(vllm, write_scenario, tmp_path):
    import json

    from kvconform.fronts.cli import main

    if not engine_party.unavailable_reason():
        pytest.skip("engine mode can run here")
    path = write_scenario(ENGINE_SCENARIO)
    assert main(["run", str(path), "--report-dir", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    (result,) = report["scenarios"]
    assert result["verdict"] == "skipped" and "no CUDA device" in result["skip_reason"]
    assert (
        'skipped message="skipped: engine mode cannot run here'
        in (tmp_path / "r" / "junit.xml").read_text()
    )
    assert "## Skipped here" in (tmp_path / "r" / "summary.md").read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("engine: {", "engine: {model_runner: v3, "),
            "engine.model_runner: must be one of v2, v1",
        ),
        (("max_tokens: 40}\n      b", "max_tokens: 480}\n      b"), "exceed max_model_len 512"),
        (("kind: engine", "kind: engine\n    steps: []"), "an engine scenario has no steps"),
        (("model: {", "model: {groups: [mamba], "), "remove model.groups"),
        (("a: {prompt_len: 39,", "a: {prompt_len: 39, temperature: 0.5,"), "needs a seed"),
    ],
)
def test_a_bad_engine_scenario_names_file_line_and_field(scenario_from, change, message):
    from kvconform.errors import ScenarioError

    with pytest.raises(ScenarioError, match=message):
        scenario_from(ENGINE_SCENARIO.replace(*change))


def test_at_k10_the_real_drafter_writes_the_warmups_kv_into_the_null_block():
    from kvconform.harness.loader import load_file

    scenario = next(
        s
        for s in load_file("scenarios/engine/engine-eagle-vary.yaml")
        if s.id.endswith("[k10-bs16]")
    )
    recording = engine_party.EngineRecording.from_json(
        open("tests/data/engine/vllm-0.25.0-h200-eagle-k10-block16.json").read()
    )
    failures = judge(trajectory_from(scenario, recording), ("floor", "slots")).failures
    slots = [f for f in failures if f.check == "slots"]
    assert [f.request for f in slots] == [f"_warmup_{i}_" for i in range(4)]
    assert all(
        f.detail["positions"] == [16, 17, 18, 19, 20] and f.detail["block"] == 0 for f in slots
    )
    assert (
        "drafter positions 16..20 (column 1)" in slots[0].message
        and "the null block" in slots[0].message
    )
    assert len([f for f in failures if f.check == "floor"]) == 8  # prefill and decode of 4 requests


def test_the_file_recorded_on_the_h200_by_engine_record_replays_on_cpu(vllm):
    from kvconform.harness.loader import load_file

    (replay,) = load_file("tests/data/engine/vllm-0.26.0-h200-eagle-k5-block16-serving.yaml")
    result = run_scenario(replay, vllm, ("lookahead", "floor", "agree", "sanity"))
    assert result.verdict is Verdict.PASSED, result.headline()
    assert {o.request for o in result.trajectory.observations} == {"a", "b", "c"}


def test_a_hooked_method_the_class_inherits_is_put_back_by_deleting_the_wrapper():
    class Subclass(StandInWorker):
        pass

    with engine_party.EngineHooks(engine_party.EngineRecording()).installed(
        {"execute_model": HookPoint(Subclass, "execute_model")}
    ):
        assert "execute_model" in vars(Subclass)
        assert Subclass({}).execute_model(scheduler_output()) == "ran"
    assert "execute_model" not in vars(Subclass)
    assert StandInWorker.execute_model is StandInWorker.__dict__["execute_model"]


def test_the_slot_mapping_hook_reads_vllms_own_block_tables_and_kernel(vllm):
    """The hook on the real BlockTables.compute_slot_mappings (Triton's interpreter on CPU)."""
    from kvconform.oracles.vllm.slot_kernel import slot_kernel_of

    tables = slot_kernel_of(vllm).tables([16], 2, 16, [4])
    tables.write_rows([((5, 6),), ((9,),)])
    recording = engine_party.EngineRecording()
    hooks = engine_party.EngineHooks(recording)
    hooks.worker = StandInWorker({0: "a", 1: "b"})
    recording.steps.append({"index": 0, "phase": "serving", "finished": [], "requests": []})
    owner = hook_points()["slot_mappings"].owner
    original = vars(owner)["compute_slot_mappings"]
    with hooks.installed():
        tables.map([0, 1], [0, 3, 4], [14, 15, 16, 3])
    assert vars(owner)["compute_slot_mappings"] is original
    (mapping,) = recording.mappings
    assert mapping["role"] == "target" and recording.block_sizes == [16]
    assert mapping["rows"] == [
        {"request": "a", "group": 0, "positions": [14, 15, 16], "slots": [5 * 16 + 14, 5 * 16 + 15, 6 * 16]},
        {"request": "b", "group": 0, "positions": [3], "slots": [9 * 16 + 3]},
    ]  # fmt: skip


# -- when vLLM's engine fails: its own cause, not pydantic's link -----------------------------


def _validation_error() -> Exception:
    """A real pydantic ValidationError from one of vLLM's config validators."""
    from vllm.config import SchedulerConfig

    try:
        SchedulerConfig(max_num_batched_tokens=8, max_model_len=512, enable_chunked_prefill=False,
                        is_encoder_decoder=False)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the error is the test's input
        return exc
    raise AssertionError("vLLM accepted max_num_batched_tokens < max_model_len")


def _traceback_of(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


REASON = "max_num_batched_tokens (8) is smaller than max_model_len (512)."


def test_first_line_of_a_pydantic_validation_error_is_vllms_reason():
    from kvconform.oracles.vllm.messages import first_line

    exc = _validation_error()
    assert type(exc).__name__ == "ValidationError"
    assert str(exc).splitlines()[-1].strip().startswith("For further information visit")
    line = first_line(exc)
    assert line.startswith(REASON) and "[type=" not in line and "errors.pydantic.dev" not in line
    # The same error as the engine child prints it: a traceback, then lines printed at exit.
    log = (
        _traceback_of(exc)
        + "[rank0]:[W1201 10:00:00] ProcessGroupNCCL: process group not destroyed\n"
    )
    assert first_line(log) == line


def test_first_line_of_a_field_error_names_the_field():
    from vllm.config import CacheConfig

    from kvconform.oracles.vllm.messages import first_line

    with pytest.raises(ValueError) as caught:  # pydantic's ValidationError is a ValueError
        CacheConfig(block_size=0)
    assert first_line(caught.value) == "block_size: Input should be greater than 0"


def test_first_line_of_a_plain_traceback_is_its_last_exception():
    from kvconform.oracles.vllm.messages import first_line

    def build():
        try:
            raise KeyError("attn_backend")
        except KeyError as inner:
            raise RuntimeError("Engine core initialization failed: no KV cache groups") from inner

    with pytest.raises(RuntimeError) as caught:
        build()
    log = "INFO 12-01 loading the model\n" + _traceback_of(caught.value)
    assert log.count("Traceback (most recent call last):") == 2
    assert first_line(log) == "RuntimeError: Engine core initialization failed: no KV cache groups"
    assert first_line(caught.value) == "Engine core initialization failed: no KV cache groups"
    assert first_line(RuntimeError()) == "RuntimeError"


def test_a_failed_engine_child_reports_vllms_cause_and_keeps_the_log(monkeypatch, tmp_path):
    import subprocess

    exc = _validation_error()
    log = "INFO starting\n" + _traceback_of(exc)

    def child(args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", log)

    monkeypatch.setattr(engine_party.subprocess, "run", child)
    monkeypatch.setenv(engine_party.LOG_DIR_VARIABLE, str(tmp_path))
    settings = engine_party.EngineSettings(engine_party.TinyModel(), None, ())
    with pytest.raises(EngineFailed) as failed:
        engine_party.run_engine(settings)
    headline = str(failed.value).splitlines()[0]
    assert headline.startswith(f"vLLM's engine failed (exit 1): {REASON}")
    assert "errors.pydantic.dev" not in headline
    (kept,) = tmp_path.glob("engine-*.log")
    assert kept.read_text() == log.strip()


def test_the_engine_child_records_the_exception_that_stopped_it():
    recording = engine_party.EngineRecording()
    error = _validation_error()
    with pytest.raises(type(error)), engine_party._cause_recorded(recording):
        raise error
    assert recording.error is not None and recording.error.startswith(f"ValidationError: {REASON}")
    assert engine_party.failure_cause(recording, "ignored") == recording.error
    again = engine_party.EngineRecording.from_json(recording.to_json())
    assert again.error == recording.error


# -- what vLLM can build: the draft kvconform writes, refused combinations ----------------------

TARGET_SCENARIO = """
    name: tiny-engine-target
    kind: engine
    model: {block_size: 16, max_model_len: 512}
    speculative: {method: METHOD, num_speculative_tokens: 3}
    engine:
      target: {architecture: TARGET, layers: 2}
    requests:
      a: {prompt_len: 39, max_tokens: 40}
"""


def engine_scenario(scenario_from, method: str, target: str):
    return scenario_from(TARGET_SCENARIO.replace("METHOD", method).replace("TARGET", target))


@pytest.mark.parametrize("target", ["LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"])
def test_an_eagle_draft_is_written_as_llama_whatever_the_target(scenario_from, target):
    scenario = engine_scenario(scenario_from, "eagle", target)
    draft = scenario.engine.draft
    assert draft.architecture == "LlamaForCausalLM" and draft.layers == 1
    assert (draft.hidden_size, draft.vocab) == (scenario.engine.target.hidden_size,
                                                scenario.engine.target.vocab)  # fmt: skip
    eagle3 = engine_scenario(scenario_from, "eagle3", target).engine.draft
    assert eagle3.architecture == "LlamaForCausalLM"
    assert eagle3.extra["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # a 2-layer target
    # A separate draft model is a copy of the target's architecture.
    assert engine_scenario(scenario_from, "draft_model", target).engine.draft.architecture == target


def test_a_draft_vllm_cannot_build_is_refused_at_load_naming_the_combination(scenario_from):
    from kvconform.errors import ScenarioError

    text = TARGET_SCENARIO.replace("METHOD", "eagle").replace("TARGET", "Qwen2ForCausalLM")
    with pytest.raises(ScenarioError) as refused:
        scenario_from(
            text.replace(
                "    requests:", "      draft: {architecture: Qwen2ForCausalLM}\n    requests:"
            )
        )
    message = str(refused.value)
    assert refused.value.where.field == "engine.draft.architecture"
    assert refused.value.where.line is not None and message.startswith(
        f"{refused.value.where.file}:{refused.value.where.line}: engine.draft.architecture:"
    )
    assert (
        "method 'eagle' with a Qwen2ForCausalLM target and a Qwen2ForCausalLM draft: vLLM would "
        "name the drafter EagleQwen2ForCausalLM, which its model registry lacks" in message
    )


@pytest.mark.parametrize(
    ("method", "engine", "field", "words"),
    [
        ("eagle", "{draft: {hidden_size: 128}}", "engine.draft.hidden_size",
         "the draft's hidden_size (128) must be the target's (256)"),
        ("draft_model", "{draft: {vocab: 512}}", "engine.draft.vocab",
         "verify_equal_vocab_size_if_draft_model"),
        ("eagle3", "{target: {layers: 1}}", "engine.target.layers",
         "the target needs at least 2 layers, not 1"),
        ("eagle3", "{draft: {architecture: MistralForCausalLM}}", "engine.draft.architecture",
         "Eagle3MistralForCausalLM, which its model registry lacks"),
        ("mtp", "{}", "speculative.method", "engine mode cannot run method 'mtp'"),
        ("dflash", "{}", "speculative.method", "engine mode cannot run method 'dflash'"),
        ("ngram", "{draft: {layers: 1}}", "engine.draft", "only methods with a draft model"),
    ],
)  # fmt: skip
def test_what_vllm_cannot_build_is_refused_at_load(scenario_from, method, engine, field, words):
    from kvconform.errors import ScenarioError

    text = TARGET_SCENARIO.replace("METHOD", method).replace(
        "      target: {architecture: TARGET, layers: 2}\n", ""
    ).replace("    engine:\n", f"    engine: {engine}\n")  # fmt: skip
    with pytest.raises(ScenarioError) as refused:
        scenario_from(text)
    assert refused.value.where.field == field and words in str(refused.value)


def test_the_engine_draft_rules_are_what_vllm_offers(vllm):
    """Each rule's architectures are exactly those whose drafter the installed vLLM registers."""
    from kvconform.model.methods import METHODS
    from kvconform.model.tiny_model import ARCHITECTURES, ENGINE_TARGETS
    from kvconform.oracles.vllm.engine import drafter_architecture, registered_architectures

    offered = registered_architectures()
    assert set(ENGINE_TARGETS) <= offered
    for method in METHODS.values():
        rule = method.engine_draft
        if rule is None:
            # A method with a draft model either has an engine draft or is refused, with why.
            assert not method.has_draft_model or method.engine_refusal, method.name
            continue
        assert method.engine_refusal is None, method.name
        buildable = []
        for arch in ENGINE_TARGETS:
            named = (
                drafter_architecture(method.name, arch, ARCHITECTURES[arch])
                if rule.renamed
                else arch
            )
            assert named == rule.drafter_class(arch), (method.name, arch)
            if named in offered:
                buildable.append(arch)
        assert set(rule.architectures or ENGINE_TARGETS) == set(buildable), method.name


def _cached_release_trees():
    from kvconform.harness.releases import cached_releases
    from kvconform.paths import cache_dir

    def release(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split(".")[:3])

    ordered = sorted(cached_releases(), key=release)
    return [(v, cache_dir("releases") / v / "vllm") for v in ordered if release(v) >= (0, 25, 0)]


def test_the_engine_draft_rules_hold_in_every_cached_release_from_0_25():
    """The releases whose engines ran on the H200 (0.25.0, 0.26.0) and the rest, read as text."""
    from kvconform.model.methods import METHODS
    from kvconform.model.tiny_model import ENGINE_TARGETS

    trees = _cached_release_trees()
    if not trees:
        pytest.skip("no vLLM release tree cached (kvconform's release matrix downloads them)")
    for version, tree in trees:
        registry = (tree / "model_executor/models/registry.py").read_text()
        eagle_config = (tree / "transformers_utils/configs/eagle.py").read_text()
        for method in METHODS.values():
            rule = method.engine_draft
            if rule is None or not rule.renamed:
                continue
            prefix = rule.drafter_class("")
            assert f'f"{prefix}{{arch}}"' in eagle_config, (version, method.name)
            for arch in ENGINE_TARGETS:
                registered = f'"{rule.drafter_class(arch)}":' in registry
                assert registered == (arch in rule.architectures), (version, method.name, arch)


def test_a_mistral_target_is_written_without_transformers_sliding_window(vllm):
    """transformers' MistralConfig defaults to a 4096-token window; kvconform writes none."""
    from kvconform.model.tiny_model import TinyModel
    from kvconform.oracles.tiny_models import model_folder
    from kvconform.oracles.vllm.scheduling import Scheduling

    folder = model_folder(TinyModel("MistralForCausalLM"))
    config = vllm.part(Scheduling).model_config(str(folder), 512)
    assert config.architectures == ["MistralForCausalLM"] and config.get_sliding_window() is None


def test_a_drafter_the_selected_vllm_lacks_is_unsupported_before_any_run(
    vllm, scenario_from, monkeypatch
):
    from kvconform.oracles.vllm import engine as vllm_engine

    offered = vllm_engine.registered_architectures()
    monkeypatch.setattr(vllm_engine, "registered_architectures",
                        lambda: offered - {"EagleLlamaForCausalLM"})  # fmt: skip
    result = run_scenario(engine_scenario(scenario_from, "eagle", "Qwen2ForCausalLM"), vllm)
    assert result.verdict is Verdict.UNSUPPORTED
    assert (
        "lacks the drafter class EagleLlamaForCausalLM: method 'eagle' with a Qwen2ForCausalLM "
        "target and a LlamaForCausalLM draft" in (result.error or "")
    )


# -- what the engine ran, compared with what the scenario states --------------------------------


def ran_with(block_size: int = 16, **config) -> engine_party.EngineRecording:
    """The H200-like recording, its group and configuration as a run on CUDA records them."""
    recording = h200_like_recording([1, 2])
    recording.kv_groups = [
        {"spec": "FullAttentionSpec", "block_size": block_size, "backend": "FLASH_ATTN"}
    ]
    recording.config = {
        "block_size": block_size, "user_specified_block_size": True,
        "enable_prefix_caching": False, "max_model_len": 512, "model_runner": "v2",
        "method": "eagle", "num_speculative_tokens": 5, "max_num_seqs": 4,
        "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
        "async_scheduling": True, "scheduler_reserve_full_isl": True,
        "platform": "CudaPlatform", **config,
    }  # fmt: skip
    return recording


ONE_REQUEST = ENGINE_SCENARIO.replace("      b: {prompt_len: 25, max_tokens: 40}\n", "").replace(
    "max_model_len: 512}", "max_model_len: 512, enable_caching: false}"
)


def test_an_engine_that_ran_the_stated_configuration_has_no_difference(scenario_from):
    from kvconform.harness.drivers.engine import engine_differences

    assert engine_differences(scenario_from(ONE_REQUEST), ran_with()) == []


def test_a_block_size_the_engine_chose_is_an_error_naming_both_and_why(scenario_from):
    from kvconform.harness.drivers.engine import engine_differences

    scenario = scenario_from(ONE_REQUEST.replace("block_size: 16", "block_size: 32"))
    (difference,) = engine_differences(scenario, ran_with(16, user_specified_block_size=False))
    assert difference.startswith(
        "block size of group 0 (FullAttentionSpec): the engine ran 16, the scenario states 32 ("
    )
    assert "CacheConfig.block_size became 16 for the 32 kvconform passed" in difference
    assert "Platform.update_block_size_for_backend set the attention backend's preferred size" in (
        difference
    )
    assert difference.endswith("attention backend FLASH_ATTN; platform CudaPlatform)")
    # A group vLLM scaled up to unify page sizes, with CacheConfig as stated.
    recording = ran_with(16)
    recording.kv_groups.append({"spec": "FullAttentionSpec", "block_size": 32, "backend": None})
    (scaled,) = engine_differences(scenario_from(ONE_REQUEST), recording)
    assert "group 1 (FullAttentionSpec): the engine ran 32, the scenario states 16" in scaled
    assert "unify_kv_cache_spec_page_size" in scaled


def test_every_stated_setting_the_engine_changed_is_a_difference(scenario_from):
    from kvconform.harness.drivers.engine import engine_differences

    scenario = scenario_from(ONE_REQUEST.replace("engine: {", "engine: {async_scheduling: true, "))
    recording = ran_with(model_runner="v1", max_model_len=256, async_scheduling=False,
                         num_speculative_tokens=3)  # fmt: skip
    recording.kv_groups[0]["spec"] = "SlidingWindowSpec"
    found = engine_differences(scenario, recording)
    assert found == [
        "group 0 is vLLM's SlidingWindowSpec (attention backend FLASH_ATTN), the scenario "
        "states full_attention (FullAttentionSpec)",
        "max_model_len: the engine ran 256, the scenario states 512 (vLLM's "
        "ModelConfig.max_model_len, capped by what the model's config allows)",
        "model runner: the engine ran v1, the scenario states v2 (kvconform sets "
        "VLLM_USE_V2_MODEL_RUNNER; the worker built the runner VllmConfig.use_v2_model_runner "
        "chose)",
        "num_speculative_tokens: the engine ran 3, the scenario states 5",
        "engine.async_scheduling: the engine ran false, the scenario states true (vLLM's "
        "SchedulerConfig)",
    ]


def test_prefix_caching_is_compared_with_the_resolved_scenario(vllm, scenario_from):
    """A scenario that leaves prefix caching out takes vLLM's default; the engine must run it."""
    from kvconform.harness.drivers.engine import engine_differences, settings_for
    from kvconform.oracles.resolve import resolve_settings

    written = scenario_from(ENGINE_SCENARIO)
    assert "enable_caching" not in written.model.stated
    scenario, record = resolve_settings(written, vllm)
    default = record.defaults["enable_caching"]
    assert scenario.model.enable_caching is default is True  # a decoder: on by default
    # The engine is given the resolved value ...
    assert settings_for(scenario, resolved=True).enable_prefix_caching is True
    # ... and `engine record`, which runs an unresolved scenario, leaves it to vLLM.
    assert settings_for(written).enable_prefix_caching is None
    assert settings_for(scenario_from(ONE_REQUEST)).enable_prefix_caching is False
    assert engine_differences(scenario, ran_with(enable_prefix_caching=True)) == []
    (difference,) = engine_differences(scenario, ran_with(enable_prefix_caching=False))
    assert difference == (
        "prefix caching (enable_prefix_caching): the engine ran false, the scenario takes "
        "vLLM's default for this release, true (vLLM's CacheConfig.enable_prefix_caching "
        "after its checks)"
    )


def test_the_engine_arguments_follow_the_settings(tmp_path):
    target = engine_party.TinyModel()
    settings = engine_party.EngineSettings(target, None, (), method="ngram",
                                           num_speculative_tokens=3,
                                           speculative_options={"prompt_lookup_max": 4},
                                           enable_prefix_caching=True)  # fmt: skip
    args = engine_party._engine_arguments(settings, tmp_path, None)
    assert args["enable_prefix_caching"] is True and "scheduler_reserve_full_isl" not in args
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3,
                                          "prompt_lookup_max": 4}  # fmt: skip
    left = engine_party._engine_arguments(replace(settings, enable_prefix_caching=None), tmp_path,
                                          None)  # fmt: skip
    assert "enable_prefix_caching" not in left


def test_an_engine_that_ran_otherwise_makes_the_scenario_an_error(vllm, scenario_from, monkeypatch):
    scenario = scenario_from(ONE_REQUEST.replace("block_size: 16", "block_size: 32"))
    monkeypatch.setattr(engine_party, "unavailable_reason", lambda: None)
    monkeypatch.setattr(engine_party, "run_engine", lambda settings: ran_with(16))
    result = run_scenario(scenario, vllm)
    assert result.verdict is Verdict.ERROR and result.failures == []
    assert result.error.startswith(
        "vLLM 0.25.0's engine did not run what the scenario states: block size of group 0 "
        "(FullAttentionSpec): the engine ran 16, the scenario states 32"
    )
    # The same run with the stated block size is judged (by the checks), not an error.
    monkeypatch.setattr(engine_party, "run_engine", lambda settings: ran_with(32))
    assert run_scenario(scenario, vllm).verdict in (Verdict.PASSED, Verdict.FAILED)


def test_the_engine_configuration_is_read_from_vllms_config(vllm):
    """The compat layer's reading of a real VllmConfig (built on CPU) and runner class."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2

    from kvconform.model.scenario import GroupSpec, ModelSpec, SchedulerSpec
    from kvconform.model.tiny_model import TinyModel
    from kvconform.oracles.tiny_models import model_folder
    from kvconform.oracles.vllm import engine as vllm_engine
    from kvconform.oracles.vllm.scheduling import Scheduling

    api = vllm.part(Scheduling)
    model = ModelSpec(
        block_size=32, max_model_len=512, num_blocks=64,
        groups=(GroupSpec("full_attention", 32),), enable_caching=True,
    )  # fmt: skip
    limits = SchedulerSpec(mode="sync", max_num_seqs=4, max_num_batched_tokens=2048)
    config = api.scheduler_vllm_config(
        api.model_config(str(model_folder(TinyModel())), 512), None, model, limits, num_blocks=64
    )

    class Runner(RunnerV2):
        pass

    worker = types.SimpleNamespace(vllm_config=config, model_runner=object.__new__(Runner))
    read = vllm_engine.engine_config(None, worker)
    assert read["block_size"] == 32 and read["user_specified_block_size"] is True
    assert read["enable_prefix_caching"] is True and read["max_model_len"] == 512
    assert read["model_runner"] == "v2" and read["method"] is None
    assert (read["max_num_seqs"], read["async_scheduling"]) == (4, False)
    import importlib.util

    # 0.34 removed the V1 GPU model runner: V2 is the only one there is.
    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as RunnerV1

        v1_worker = types.SimpleNamespace(model_runner=object.__new__(RunnerV1))
        assert vllm_engine.model_runner_kind(v1_worker) == "v1"
    assert vllm_engine.model_runner_kind(types.SimpleNamespace()) is None


def _speculative_config(vllm, scenario):
    """vLLM's own SpeculativeConfig for an engine scenario's target and draft (built on CPU)."""
    from kvconform.harness.drivers.engine import settings_for
    from kvconform.oracles.tiny_models import model_folder
    from kvconform.oracles.vllm.scheduling import Scheduling

    settings = settings_for(scenario)
    api = vllm.part(Scheduling)
    target = api.model_config(str(model_folder(settings.target)), scenario.model.max_model_len)
    return api.model_speculative_config(target, settings.method, settings.num_speculative_tokens,
                                        model=str(model_folder(settings.draft)))  # fmt: skip


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
@pytest.mark.parametrize("target", ["LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"])
def test_vllm_builds_the_speculative_config_of_every_draft_kvconform_writes(
    vllm, scenario_from, method, target
):
    from kvconform.model.methods import METHODS

    scenario = engine_scenario(scenario_from, method, target)
    config = _speculative_config(vllm, scenario)
    rule = METHODS[method].engine_draft
    assert config.draft_model_config.architectures == [
        rule.drafter_class(scenario.engine.draft.architecture)
    ]


def test_the_draft_kvconform_wrote_before_for_a_qwen2_target_is_vllms_own_refusal(
    vllm, scenario_from
):
    """What the H200 run hit, reproduced on CPU: and the message kvconform now reports."""
    from kvconform.oracles.vllm.messages import first_line

    scenario = engine_scenario(scenario_from, "eagle", "Qwen2ForCausalLM")
    old_draft = replace(scenario.engine.draft, architecture="Qwen2ForCausalLM")
    scenario = replace(scenario, spec=replace(scenario.engine, draft=old_draft))
    with pytest.raises(ValueError) as refused:
        _speculative_config(vllm, scenario)
    assert str(refused.value).splitlines()[-1].strip().startswith("For further information")
    line = first_line(refused.value)
    assert line.startswith(
        "Model architectures ['EagleQwen2ForCausalLM'] are not supported for now."
    )
    assert len(line) <= 400 and line.endswith(" …")


def test_a_model_runner_the_release_removed_is_unsupported_not_a_crash(vllm, scenario_from):
    """0.34.0 removed the V1 GPU model runner, and its platform check raises at start-up
    on ``VLLM_USE_V2_MODEL_RUNNER=0``: a scenario asking for it does not apply there
    (``unsupported``, on any machine), where a release that ships the runner goes on
    to run it (here: skipped without CUDA, or run)."""
    from pathlib import Path

    scenario = scenario_from(
        ENGINE_SCENARIO.replace("engine: {", "engine: {model_runner: v1, ")
    )
    ships_v1 = (Path(vllm.location) / "v1" / "worker" / "gpu_model_runner.py").exists()
    result = run_scenario(scenario, vllm)
    if ships_v1:
        assert result.verdict is not Verdict.UNSUPPORTED, result.error
    else:
        assert result.verdict is Verdict.UNSUPPORTED, (result.verdict, result.error)
        assert "lacks the V1 GPU model runner" in result.error
        assert "removed in 0.34.0" in result.error
