"""The engine party: vLLM's real engine, watched while it runs.

Every other party drives vLLM's parts from the harness. This one runs
``vllm.LLM`` itself -- the real ``EngineCore`` and its ``Scheduler``, the V2 GPU
model runner with its persistent block tables, its real ``warmup_kernels`` at
start-up and the real drafter -- with a tiny model kvconform writes itself
(:func:`~kvconform.oracles.tiny_models.model_folder`: a ``transformers`` config, dummy
weights, no tokenizer),
and records through hooks installed for the run and removed after it
(:class:`EngineHooks`):

* every ``SchedulerOutput`` the worker executes, as per-request, per-group
  block holdings with the computed, scheduled and draft counts, labelled
  ``warmup`` (issued by ``warmup_kernels``) or ``serving``;
* every slot mapping ``BlockTables.compute_slot_mappings`` returns to the model
  runner (``target``) or the drafter (``drafter``), as positions -> slots per
  request and group, with the blocks the request held at that moment.

The run happens in a child process (``python -m kvconform.oracles.engine``):
vLLM's engine takes a share of the GPU's memory and its process-wide state
(distributed groups, compiled kernels) for the life of the process, so each
scenario gets a fresh one, and the hooks live exactly as long as the engine.
The child writes an :class:`EngineRecording` as JSON; the harness's engine
driver turns it into observations the floor, slots and sanity checks judge.

Where a release keeps the hooked methods is :mod:`kvconform.oracles.vllm.engine`'s
business. Engine mode needs CUDA and a CUDA build of vLLM:
:func:`unavailable_reason` says why it cannot run where it cannot.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvconform.errors import EngineFailed, NotOffered, VllmUnavailable
from kvconform.model.kind_specs import EngineRequest
from kvconform.model.methods import REGISTRY_FILE, method_for
from kvconform.model.tiny_model import ARCHITECTURES, TinyModel
from kvconform.oracles.tiny_models import model_folder
from kvconform.paths import cache_dir

# One engine run: vLLM's import, the engine's start (about 22 s cold on an H200) and serving.
ENGINE_TIMEOUT_S = 480


@dataclass(frozen=True)
class EngineSettings:
    """Everything the child needs to build and drive one engine (JSON-able)."""

    target: TinyModel
    draft: TinyModel | None
    requests: tuple[EngineRequest, ...]
    method: str | None = None
    num_speculative_tokens: int = 0
    # The method's SpeculativeConfig options from kvconform's registry (n-gram's windows).
    speculative_options: dict[str, Any] = field(default_factory=dict)
    model_runner: str = "v2"  # v2 | v1
    block_size: int = 16
    max_model_len: int = 512
    max_num_seqs: int = 4
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    # None leaves a setting to vLLM's engine (its default).
    enable_prefix_caching: bool | None = None
    scheduler_reserve_full_isl: bool | None = None
    async_scheduling: bool | None = None
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.2
    num_gpu_blocks_override: int | None = None
    max_steps: int = 5000

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EngineSettings:
        raw = json.loads(text)
        raw["target"] = TinyModel.from_json(raw["target"])
        raw["draft"] = TinyModel.from_json(raw["draft"]) if raw["draft"] else None
        raw["requests"] = tuple(
            EngineRequest(**{**r, "prompt_token_ids": tuple(r["prompt_token_ids"])})
            for r in raw["requests"]
        )
        return cls(**raw)


@dataclass
class EngineRecording:
    """What the child saw; plain data, written and read as JSON."""

    vllm_version: str = ""
    device: str = ""
    model_runner: str = ""
    lookahead: int | None = None
    lookahead_source: str = ""
    # Per KV-cache group: {spec, block_size, backend} (backend: recorded from 2026-12).
    kv_groups: list[dict[str, Any]] = field(default_factory=list)
    # What the engine ran with, as vLLM resolved it (kvconform.oracles.vllm.engine.
    # engine_config); empty in recordings made before kvconform recorded it.
    config: dict[str, Any] = field(default_factory=dict)
    # Per executed SchedulerOutput: {index, phase, finished, requests: [{request, new,
    # resumed, computed, scheduled, drafts, blocks (per group, what it holds after)}]}.
    steps: list[dict[str, Any]] = field(default_factory=list)
    # Per compute_slot_mappings call: {step, role, rows: [{request, group, positions, slots}]},
    # with the slot kernel's block size per group in block_sizes.
    mappings: list[dict[str, Any]] = field(default_factory=list)
    block_sizes: list[int] = field(default_factory=list)
    blocks_per_kv_block: list[int] = field(default_factory=list)
    outputs: dict[str, int] = field(default_factory=dict)  # request -> tokens generated
    free_blocks_after: int | None = None
    pool_blocks: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The exception that stopped the engine, as "Type: its first meaningful line"
    # (kvconform.oracles.vllm.messages.first_line); None when the run completed.
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EngineRecording:
        return cls(**json.loads(text))


# -- can engine mode run here? ----------------------------------------------------------


def unavailable_reason() -> str | None:
    """Why vLLM's real engine cannot run in this environment, or None when it can.

    Asked without importing vLLM's engine: torch must see a CUDA device, and the
    vLLM on the path must be a CUDA build (its compiled ``_C`` extension present, and
    not forced onto its CPU platform by ``VLLM_TARGET_DEVICE``).
    """
    from kvconform.oracles.vllm.engine import cuda_available

    cuda = cuda_available()
    if cuda is None:
        return "torch is not installed"
    if not cuda:
        return "no CUDA device: engine mode runs vLLM's real engine, which needs a GPU"
    target = os.environ.get("VLLM_TARGET_DEVICE", "cuda")
    if target != "cuda":
        return f"VLLM_TARGET_DEVICE={target}: vLLM runs on its {target} platform here"
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return "vLLM is not installed"
    compiled = any(
        path.name.startswith(("_C.", "_C_stable_libtorch."))
        for location in spec.submodule_search_locations
        for path in Path(location).glob("_C*.so")
    )
    if not compiled:
        return "the vLLM on the path is a Python tree without its compiled extensions (vllm._C)"
    return None


def check_buildable(settings: EngineSettings, version: str) -> None:
    """Refuse a target or drafter the loaded vLLM's model registry lacks, before any run.

    The loader refused what no supported release builds, from kvconform's own data
    (the method's :class:`~kvconform.model.methods.EngineDraft`); this asks the
    selected release itself, on any machine: its model registry, and, for a method
    whose draft vLLM renames, what its ``EAGLEConfig`` names the drafter. Raises
    :class:`NotOffered` (the scenario is ``unsupported`` on this release).
    """
    from kvconform.oracles.vllm import engine as vllm_engine

    if not vllm_engine.offers_runner(settings.model_runner):
        raise NotOffered(version, f"the {settings.model_runner.upper()} GPU model runner",
                         "removed in 0.34.0 (vllm/v1/worker/gpu_model_runner.py)")  # fmt: skip
    offered = vllm_engine.registered_architectures()
    target = settings.target.architecture
    if target not in offered:
        raise NotOffered(version, f"the target architecture {target}",
                         "its model registry does not list it")  # fmt: skip
    method = method_for(settings.method)
    rule = method.engine_draft if method is not None else None
    if method is None or rule is None or settings.draft is None:
        return
    draft = settings.draft.architecture
    named = (
        vllm_engine.drafter_architecture(method.name, draft, ARCHITECTURES[draft])
        if rule.renamed
        else draft
    )
    if named in offered:
        return
    expected = rule.drafter_class(draft)
    stale = (
        "" if named == expected else f"; kvconform's registry ({REGISTRY_FILE}) expected {expected}"
    )
    raise NotOffered(
        version,
        f"the drafter class {named}",
        f"method {method.name!r} with a {target} target and a {draft} draft: vLLM names the "
        f"drafter {named}, which its model registry lacks{stale}",
    )


# -- the hooks ---------------------------------------------------------------------------


class EngineHooks:
    """Watches a running engine; installed by :meth:`installed`, removed when it exits.

    ``execute_model`` records each SchedulerOutput the worker receives before the
    worker runs it (so a crash inside still leaves the record); ``warmup_kernels``
    labels the steps issued while it runs; ``compute_slot_mappings`` records what
    the V2 runner and its drafter map, after the kernel ran.
    """

    def __init__(self, recording: EngineRecording) -> None:
        self.recording = recording
        self.phase = "startup"
        self.held: dict[str, list[list[int]]] = {}
        self.worker: Any = None
        self._restore: list[Callable[[], None]] = []

    @contextmanager
    def installed(self, points: dict[str, Any] | None = None) -> Iterator[EngineHooks]:
        from kvconform.oracles.vllm import engine as vllm_engine

        points = vllm_engine.hook_points() if points is None else points
        try:
            self._wrap(points["execute_model"], self._execute_model)
            if points.get("warmup_kernels") is not None:
                self._wrap(points["warmup_kernels"], self._warmup_kernels)
            else:
                self.recording.notes.append("this release has no warmup_kernels to label")
            if points.get("slot_mappings") is not None:
                self._wrap(points["slot_mappings"], self._slot_mappings)
            else:
                self.recording.notes.append(
                    "slot mappings not recorded: this runner has no BlockTables.compute_slot_mappings"
                )
            yield self
        finally:
            while self._restore:
                self._restore.pop()()

    def _wrap(self, point: Any, make: Callable[[Any], Any]) -> None:
        owner, name = point.owner, point.name
        # A method a class inherits is put back by deleting the wrapper, not by copying
        # the base class's function onto the subclass.
        had = name in vars(owner)
        original = vars(owner)[name] if had else getattr(owner, name)
        setattr(owner, name, make(original))

        def restore() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._restore.append(restore)

    # execute_model(self, scheduler_output, ...)
    def _execute_model(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def execute_model(worker: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            hooks.worker = worker
            hooks.record_step(scheduler_output)
            return original(worker, scheduler_output, *args, **kwargs)

        return execute_model

    def _warmup_kernels(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def warmup_kernels(*args: Any, **kwargs: Any) -> Any:
            before, hooks.phase = hooks.phase, "warmup"
            try:
                return original(*args, **kwargs)
            finally:
                hooks.phase = before

        return warmup_kernels

    def _slot_mappings(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def compute_slot_mappings(tables: Any, idx_mapping: Any, query_start_loc: Any,
                                  positions: Any, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
            out = original(tables, idx_mapping, query_start_loc, positions, *args, **kwargs)
            hooks.record_mapping(tables, idx_mapping, query_start_loc, positions, out)
            return out

        return compute_slot_mappings

    def record_step(self, scheduler_output: Any) -> None:
        from kvconform.oracles.vllm import engine as vllm_engine

        finished = sorted(vllm_engine.finished_requests(scheduler_output))
        for name in finished:
            self.held.pop(name, None)
        rows = []
        for req in vllm_engine.scheduled_requests(scheduler_output):
            if req.new or req.resumed:
                held = [list(ids) for ids in (req.new_block_ids or ())]
            else:
                held = self.held.get(req.request, [])
                if req.new_block_ids is not None:
                    held = [h + list(n) for h, n in zip(held, req.new_block_ids, strict=False)]
            self.held[req.request] = held
            row = {
                "request": req.request,
                "new": req.new,
                "resumed": req.resumed,
                "computed": req.computed,
                "scheduled": req.scheduled,
                "drafts": req.drafts,
                "blocks": [list(ids) for ids in held],
            }
            if req.new and req.prompt_token_ids is not None:
                row["prompt_len"] = len(req.prompt_token_ids)
            rows.append(row)
        if rows or finished:
            self.recording.steps.append(
                {
                    "index": len(self.recording.steps),
                    "phase": self.phase,
                    "finished": finished,
                    "requests": rows,
                }  # fmt: skip
            )

    def record_mapping(self, tables: Any, idx_mapping: Any, query_start_loc: Any,
                       positions: Any, out: Any) -> None:  # fmt: skip
        from kvconform.oracles.vllm import engine as vllm_engine

        if vllm_engine.is_capturing() or not self.recording.steps:
            return
        if not self.recording.block_sizes:
            sizes, per = vllm_engine.block_table_geometry(tables)
            self.recording.block_sizes, self.recording.blocks_per_kv_block = sizes, per
        index = vllm_engine.request_index(self.worker)
        rows_of = [int(i) for i in idx_mapping.tolist()]
        starts = [int(s) for s in query_start_loc[: len(rows_of) + 1].tolist()]
        total = starts[-1] if starts else 0
        all_positions = positions[:total].tolist()
        slots = out[:, :total].tolist()
        caller = sys._getframe(2).f_code.co_filename
        role = "drafter" if "spec_decode" in caller else "target"
        rows = []
        for r, state_row in enumerate(rows_of):
            lo, hi = starts[r], starts[r + 1]
            if hi <= lo:
                continue
            for g, group_slots in enumerate(slots):
                rows.append(
                    {
                        "request": index.get(state_row, f"<row {state_row}>"),
                        "group": g,
                        "positions": all_positions[lo:hi],
                        "slots": group_slots[lo:hi],
                    }  # fmt: skip
                )
        self.recording.mappings.append(
            {"step": len(self.recording.steps) - 1, "role": role, "rows": rows}
        )


# -- the child: build the engine, drive it, write the recording ---------------------------


ENGINE_ENV = {
    # The engine core in this process, so that the hooks see the worker's calls.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def child_environment(settings: EngineSettings) -> dict[str, str]:
    env = dict(os.environ, **ENGINE_ENV)
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if settings.model_runner == "v2" else "0"
    env.setdefault("VLLM_CACHE_ROOT", str(cache_dir("vllm-cache")))
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def run_engine(settings: EngineSettings, timeout: float = ENGINE_TIMEOUT_S) -> EngineRecording:
    """Run the engine in a child process and read what it recorded.

    Raises :class:`VllmUnavailable` when the engine could not be built here, and
    :class:`EngineFailed` when it failed on a valid scenario: first vLLM's own cause
    (:func:`failure_cause`), then the child's last lines.
    """
    with tempfile.TemporaryDirectory(prefix="kvconform-engine-") as tmp:
        settings_file, out_file = Path(tmp) / "settings.json", Path(tmp) / "recording.json"
        settings_file.write_text(settings.to_json())
        done = subprocess.run(
            [sys.executable, "-m", "kvconform.oracles.engine", str(settings_file), str(out_file)],
            env=child_environment(settings), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        recording = EngineRecording.from_json(out_file.read_text()) if out_file.exists() else None
        if recording is not None and done.returncode == 0:
            return recording
        log = (done.stdout + done.stderr).strip()
        if os.environ.get(LOG_DIR_VARIABLE):
            folder = Path(os.environ[LOG_DIR_VARIABLE])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"engine-{os.getpid()}-{time.time_ns()}.log").write_text(log)
        lines = log.splitlines()
        if done.returncode == UNAVAILABLE_STATUS:
            raise VllmUnavailable("?", "vLLM's engine", lines[-1] if lines else "")
        tail = "\n".join(lines[-15:])
        raise EngineFailed(
            f"vLLM's engine failed (exit {done.returncode}): {failure_cause(recording, log)}\n{tail}"
        )


def failure_cause(recording: EngineRecording | None, log: str) -> str:
    """Why the engine child failed, in vLLM's words: the exception it recorded, else the log's.

    The report shows this line; the whole log stays in the exception's text (its last
    lines) and, with ``KVCONFORM_ENGINE_LOGS`` set, in a file.
    """
    from kvconform.oracles.vllm.messages import first_line

    if recording is not None and recording.error:
        return recording.error
    return first_line(log) or "no output"


UNAVAILABLE_STATUS = 3
# Where a failed child's whole output is kept, when set (tools/gpu-engine-run.sh sets it).
LOG_DIR_VARIABLE = "KVCONFORM_ENGINE_LOGS"


def _engine_arguments(settings: EngineSettings, target: Path, draft: Path | None) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": str(target),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "enforce_eager": settings.enforce_eager,
        "max_model_len": settings.max_model_len,
        "block_size": settings.block_size,
        "max_num_seqs": settings.max_num_seqs,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "dtype": settings.target.dtype,
        "seed": 0,
    }
    optional = {
        "enable_prefix_caching": settings.enable_prefix_caching,
        "scheduler_reserve_full_isl": settings.scheduler_reserve_full_isl,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "async_scheduling": settings.async_scheduling,
        "num_gpu_blocks_override": settings.num_gpu_blocks_override,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    if settings.method is not None:
        spec: dict[str, Any] = {
            "method": settings.method,
            "num_speculative_tokens": settings.num_speculative_tokens,
            **settings.speculative_options,
        }
        if draft is not None:
            spec["model"] = str(draft)
        args["speculative_config"] = spec
    return args


def drive(llm: Any, settings: EngineSettings) -> dict[str, int]:
    """Add each request at its arrival step, step the engine until all finish."""
    from kvconform.oracles.vllm import engine as vllm_engine

    pending = sorted(settings.requests, key=lambda r: r.arrival)
    generated: dict[str, int] = {}
    engine = llm.llm_engine
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].arrival <= step:
            request = pending.pop(0)
            params = vllm_engine.sampling_params(
                request.max_tokens, request.temperature, request.seed
            )
            engine.add_request(request.name, {"prompt_token_ids": list(request.prompt_token_ids)},
                               params)  # fmt: skip
        for output in engine.step():
            if output.finished:
                generated[output.request_id] = len(output.outputs[0].token_ids)
        step += 1
        if step > settings.max_steps:
            raise RuntimeError(f"the engine did not finish within {settings.max_steps} steps")
    return generated


@contextmanager
def _cause_recorded(recording: EngineRecording) -> Iterator[None]:
    """Records an exception's type and first meaningful line, then lets it propagate."""
    from kvconform.oracles.vllm.messages import first_line

    try:
        yield
    except BaseException as exc:
        recording.error = f"{type(exc).__name__}: {first_line(exc)}"
        raise


def child_main(settings_file: str, out_file: str) -> int:
    settings = EngineSettings.from_json(Path(settings_file).read_text())
    recording = EngineRecording()
    reason = unavailable_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return UNAVAILABLE_STATUS
    target = model_folder(settings.target)
    draft = model_folder(settings.draft) if settings.draft is not None else None
    from kvconform.oracles.vllm import engine as vllm_engine

    recording.vllm_version, recording.device = vllm_engine.runtime()
    recording.model_runner = settings.model_runner
    hooks = EngineHooks(recording)
    try:
        with _cause_recorded(recording), hooks.installed():
            started = time.perf_counter()
            llm = vllm_engine.new_llm(_engine_arguments(settings, target, draft))
            recording.seconds["engine_up"] = round(time.perf_counter() - started, 1)
            recording.lookahead, recording.lookahead_source = vllm_engine.engine_lookahead(llm)
            worker = hooks.worker or vllm_engine.engine_worker(llm)
            recording.kv_groups = vllm_engine.kv_groups(llm, worker)
            recording.config = vllm_engine.engine_config(llm, worker)
            recording.model_runner = recording.config["model_runner"] or settings.model_runner
            hooks.phase = "serving"
            started = time.perf_counter()
            recording.outputs = drive(llm, settings)
            recording.seconds["serving"] = round(time.perf_counter() - started, 1)
            recording.free_blocks_after, recording.pool_blocks = vllm_engine.pool_state(llm)
    finally:
        Path(out_file).write_text(recording.to_json())
    return 0


if __name__ == "__main__":
    from kvconform.oracles.code_tracing import measure_child

    # Measured when the parent measures vLLM's code (kvconform coverage --vllm-code).
    with measure_child():
        status = child_main(sys.argv[1], sys.argv[2])
    sys.exit(status)
