"""The recorded warmup: vLLM's own ``warmup_kernels`` and mixed warmup, step by step.

vLLM's V2 model runner warms its kernels up with ``SchedulerOutput``s it builds
by hand (``vllm/v1/worker/gpu/warmup.py``), reserving blocks for each warmup
request itself instead of asking the ``KVCacheManager``. That reservation is
where the upstream bug lived (vLLM 0.25.0-0.27.1 ignored the drafter's
lookahead), in code the predictor alone never exercises. This oracle runs the
real entry points with a stub model runner (see :mod:`kvconform.oracles.vllm.warmup_stubs`:
vLLM's own warmup test stubs the runner the same way), records every
``SchedulerOutput`` handed to ``worker_execute_model``, and rebuilds from them,
per step, per request and per group, how many blocks each warmup request
holds:

* a request in ``scheduled_new_reqs`` holds its ``block_ids``;
* a request in ``scheduled_cached_reqs`` adds its ``new_block_ids`` (``None``:
  nothing new);
* its computed tokens are the output's ``num_computed_tokens``, its scheduled
  tokens ``num_scheduled_tokens``; ``finished_req_ids`` end requests.

On a machine without CUDA, ``warmup_kernels`` emits every step and then fails
in its final ``torch.accelerator.synchronize()``; there, and only there, the
recorder runs it with that call replaced by a no-op for the duration of the
call, and says so in the recording's notes. With CUDA it runs unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.errors import NotOffered
from kvconform.model.kind_specs import WarmupPass, WarmupSpec
from kvconform.model.observations import Trajectory
from kvconform.model.scenario import Scenario
from kvconform.oracles.resolve import group_specs
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.warmup_stubs import RunnerSettings, StubModelRunner, Warmup

# The run-level line reports carry when warmup scenarios ran without CUDA.
CPU_RUN_NOTE = (
    "no CUDA device: vLLM's warmup_kernels ran with its final "
    "torch.accelerator.synchronize() replaced by a no-op for the duration of the call; "
    "every SchedulerOutput it emits comes before that call, so the recording is complete"
)


@dataclass(frozen=True)
class WarmupCall:
    """One request in one recorded ``SchedulerOutput``."""

    request: str
    new: bool  # listed in scheduled_new_reqs (it enters; its block_ids are all it holds)
    computed: int
    scheduled: int
    held: tuple[tuple[int, ...], ...]  # block ids per group after this output
    prompt_len: int
    encoder_len: int  # encoder tokens of its encoder inputs (cross-attention)
    num_draft_tokens: int  # scheduled_spec_decode_tokens

    @property
    def label(self) -> str:
        if self.new:
            return f"prefill {self.scheduled}"
        if self.num_draft_tokens:
            return f"spec {self.num_draft_tokens}"
        return "decode" if self.scheduled == 1 else f"{self.scheduled} tokens"


@dataclass(frozen=True)
class WarmupStep:
    """One ``SchedulerOutput`` the warmup handed to ``worker_execute_model``."""

    index: int
    entry_point: str
    number: int  # position within its entry point's outputs, from 1
    finished: tuple[str, ...]  # finished_req_ids: freed before this step's requests
    calls: tuple[WarmupCall, ...]
    # Blocks of the KV cache committed when the step ran, where the runner grows its
    # cache on demand (0.34's extensible KV cache); None: the whole pool is backed.
    committed: int | None = None


@dataclass
class WarmupRecording:
    steps: list[WarmupStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # warmup_kernels' passes: each step that enters new requests starts one.
    passes: list[WarmupPass] = field(default_factory=list)


class SchedulerOutputRecorder:
    """``worker_execute_model``: rebuilds the block tables the warmup hands out."""

    def __init__(self, recording: WarmupRecording, is_encoder_decoder: bool) -> None:
        self.recording = recording
        self.is_encoder_decoder = is_encoder_decoder
        self.entry_point = ""
        self.number = 0
        self.runner: StubModelRunner | None = None
        self._held: dict[str, list[tuple[int, ...]]] = {}
        self._prompt_len: dict[str, int] = {}
        self._encoder_len: dict[str, int] = {}

    def execute_model(self, output: Any) -> None:
        self.number += 1
        finished = tuple(sorted(output.finished_req_ids or ()))
        for name in finished:
            self._held.pop(name, None)
        drafts = output.scheduled_spec_decode_tokens or {}
        calls: list[WarmupCall] = []
        for new in output.scheduled_new_reqs:
            name = new.req_id
            self._held[name] = [tuple(ids) for ids in new.block_ids]
            self._prompt_len[name] = len(new.prompt_token_ids or ())
            self._encoder_len[name] = self._encoder_tokens(new)
            calls.append(self._call(name, True, new.num_computed_tokens, output, drafts))
        if self.entry_point == "warmup_kernels" and output.scheduled_new_reqs:
            kinds = {_sampling(new) for new in output.scheduled_new_reqs}
            sampling = kinds.pop() if len(kinds) == 1 else "mixed"
            self.recording.passes.append(WarmupPass(len(output.scheduled_new_reqs), sampling))
        cached = output.scheduled_cached_reqs
        for i, name in enumerate(cached.req_ids):
            added = cached.new_block_ids[i]
            if added is not None:
                self._held[name] = [
                    held + tuple(ids) for held, ids in zip(self._held[name], added, strict=True)
                ]
            calls.append(self._call(name, False, cached.num_computed_tokens[i], output, drafts))
        self.recording.steps.append(
            WarmupStep(
                len(self.recording.steps),
                self.entry_point,
                self.number,
                finished,
                tuple(calls),
                self.runner.committed_blocks() if self.runner is not None else None,
            )
        )

    def sample_tokens(self, grammar_output: Any) -> None:
        return None

    def _encoder_tokens(self, new: Any) -> int:
        # What the scheduler passes as num_encoder_tokens for a request entering:
        # the lengths of its encoder inputs, for encoder-decoder models only.
        if not self.is_encoder_decoder:
            return 0
        return sum(int(f.mm_position.length) for f in (new.mm_features or ()))

    def _call(
        self, name: str, new: bool, computed: int, output: Any, drafts: dict[str, Any]
    ) -> WarmupCall:
        return WarmupCall(
            name,
            new,
            int(computed),
            int(output.num_scheduled_tokens[name]),
            tuple(self._held[name]),
            self._prompt_len[name],
            self._encoder_len[name],
            len(drafts.get(name, ())),
        )


def _sampling(new: Any) -> str:
    """How a new request samples: ``greedy`` (vLLM's SamplingType.GREEDY), ``random``,
    or ``none`` for a pooling request (no sampling parameters)."""
    params = new.sampling_params
    if params is None:
        return "none"
    return "greedy" if params.sampling_type.name == "GREEDY" else "random"


def record_warmup(
    vllm: Vllm,
    settings: RunnerSettings,
    entry_points: Sequence[str],
    mixed_num_tokens: int,
) -> WarmupRecording:
    """Run the named warmup entry points of ``vllm`` and record what they schedule.

    Raises ``VllmUnavailable`` when an entry point is missing or reads a model
    runner attribute the stub of this release family lacks.
    """
    recording = WarmupRecording()
    recorder = SchedulerOutputRecorder(recording, settings.is_encoder_decoder)
    warmup = vllm.part(Warmup)
    for entry_point in entry_points:
        fn = warmup.warmup_entry_point(entry_point)
        runner = warmup.stub_model_runner(settings)
        recorder.entry_point, recorder.number, recorder.runner = entry_point, 0, runner
        args: tuple[Any, ...] = (runner, recorder.execute_model, recorder.sample_tokens)
        if entry_point == "run_mixed_prefill_decode_warmup":
            args += (mixed_num_tokens,)
        logging.disable(logging.WARNING)  # the mixed warmup warns when it skips itself
        try:
            with warmup.without_final_synchronize() as skipped:
                returned = fn(*args)
        except Exception as exc:
            shortfall = warmup.stub_shortfall(runner)
            if shortfall is not None:
                raise shortfall from exc
            raise
        finally:
            logging.disable(logging.NOTSET)
        if skipped:
            recording.notes.append(
                f"{entry_point} ran on CPU without its torch.accelerator.synchronize() "
                f"(no CUDA device; skipped {len(skipped)}x); every SchedulerOutput was recorded"
            )
        if runner.stub_misses:
            # Read with getattr(..., default): vLLM ran on without it.
            recording.notes.append(
                f"{entry_point} asked the stub runner for {', '.join(runner.stub_misses)}, "
                f"which {type(runner).__name__} lacks; vLLM {vllm.version} used its default"
            )
        if returned is False:
            recording.notes.append(
                f"{entry_point}(num_tokens={mixed_num_tokens}) returned False: vLLM skipped it "
                "(a pooling model, max_num_seqs < 2, num_tokens < 3, or too few KV blocks)"
            )
    return recording


def scenario_settings(vllm: Vllm, scenario: Scenario, trajectory: Trajectory) -> RunnerSettings:
    """The stub runner's settings for a ``kind: warmup`` scenario.

    Its KV groups, the lookahead ``run`` resolved, the method's
    ``SpeculativeConfig`` (built without a model, as vLLM's own test does),
    ``max_num_seqs``, ``max_num_batched_tokens``, ``num_blocks``,
    ``max_model_len`` and, with a cross-attention group, ``max_encoder_len``.
    """
    model = scenario.model
    warmup = scenario.warmup or WarmupSpec()
    encoder_decoder = model.encoder_decoder
    spec = scenario.speculative
    speculative_config = None
    if spec is not None:
        refusal = vllm.budget_refusal(
            trajectory.method or spec.method,
            spec.num_speculative_tokens,
            spec.sample_from_anchor,
            warmup.max_num_batched_tokens,
        )
        if refusal is not None:
            # The stub runner has no VllmConfig to refuse it: the engine would not start.
            raise NotOffered(vllm.version, "a warmup of this token budget", refusal)
        speculative_config = vllm.speculative_config(
            spec.method, spec.num_speculative_tokens, spec.sample_from_anchor
        )
    specs = group_specs(vllm, model, trajectory.num_speculative_tokens)
    return RunnerSettings(
        kv_cache_config=vllm.kv_cache_config(model.num_blocks, specs),
        num_speculative_tokens=trajectory.num_speculative_tokens,
        num_lookahead_tokens=trajectory.lookahead,
        speculative_config=speculative_config,
        max_num_seqs=warmup.max_num_seqs,
        max_num_batched_tokens=warmup.max_num_batched_tokens,
        max_model_len=model.max_model_len,
        max_encoder_len=model.max_encoder_len if encoder_decoder else 0,
        is_encoder_decoder=encoder_decoder,
        is_pooling_model=warmup.pooling,
        redirect_writes_to_null_block=warmup.redirect_writes_to_null_block,
        parallel_config=vllm.predictor_vllm_config(model.dcp_world_size).parallel_config,
        use_mla=any(vllm.is_mla(spec) for spec in specs),
        block_size=model.scheduler_block_size,
    )
