"""The scheduler party: vLLM's own ``Scheduler`` / ``AsyncScheduler``, stepped offline.

In allocator mode a scenario decides every ``allocate_slots`` call. In
scheduler mode vLLM's scheduler decides chunking, admission, preemption and
the lookahead, exactly as in production, and this module records what it
reserved. It

* writes tiny *config-only* model folders under kvconform's cache (a Llama
  config; a MiMo config for MTP, whose target carries the MTP modules; a
  one-layer draft for EAGLE and draft models; a DFlash draft config): no
  weights, no tokenizer, no download;
* builds the ``VllmConfig`` an engine with the scenario's limits would build.
  vLLM's first ``ModelConfig`` / ``SpeculativeConfig`` of a process inspects
  model architectures (seconds; cached on disk under ``VLLM_CACHE_ROOT``, which
  :func:`kvconform.oracles.vllm.load` points at kvconform's cache), so
  they are built once per process and handed out as deep copies;
* steps the scheduler the way vLLM's engine core does: ``sync`` like
  ``EngineCore.step`` (schedule, output, then the drafter's next drafts through
  ``update_draft_token_ids``); ``async`` the same with ``AsyncScheduler``,
  which inserts draft placeholders itself; ``overlapped`` like
  ``EngineCore.step_with_batch_queue``, scheduling step N+1 before step N's
  output is applied;
* answers every step with a fabricated ``ModelRunnerOutput``: nothing for a
  prefill chunk that ends inside the prompt, otherwise one sampled token plus
  the accepted drafts, as the request's acceptance pattern says;
* records, right after every ``schedule()``, each scheduled request's counts as
  the scheduler keeps them and the block ids it holds per group, and every
  release of blocks (the manager's ``free``, wrapped to observe it, not to
  change it) with the pool's free count around it;
* for a request prefilled remotely (``remote_prefill``), runs vLLM's
  ``NixlConnector`` on the scheduler side (a P/D decode instance): the
  ``schedule()`` that admits it allocates blocks for the prompt's KV and parks it
  in ``WAITING_FOR_REMOTE_KVS``, which is recorded with the blocks it holds
  then; the fabricated output of the ``remote_prefill``-th step from there
  reports the transfer received (``finished_recving``), as the worker would;
* with ``scheduler.kv_connector: decode_bench``, runs vLLM's ``DecodeBenchConnector``, which
  loads each new request's prompt synchronously in the step that admits it;
* for requests with multimodal inputs (``mm_inputs``), gives the scheduler an encoder budget
  and cache as vLLM's own scheduler tests do on a text model, and follows the worker's
  encoder cache through each step's ``scheduled_encoder_inputs`` and
  ``free_encoder_mm_hashes`` (:func:`step_facts.record_encoder_step`).

The driver (:mod:`kvconform.harness.drivers.scheduler`) turns these records into
observations. What the fabricated output does not model is listed in
``docs/scheduler-mode.md``.

The package's modules, by concern: :mod:`.config` builds the configuration and the
scheduler; :mod:`.stepping` steps it, recording each ``schedule()`` and every release;
:mod:`.inputs` makes the requests and feeds the multimodal and connector inputs;
:mod:`.records` holds what is recorded per step; :mod:`.step_facts`, :mod:`.lifecycle`,
:mod:`.sessions` and :mod:`.queues` record the facts the checks judge (zeroing, encoder work,
KV events; stops and stats; streaming sessions; each ``schedule()``'s queues).
"""

from __future__ import annotations

from kvconform.oracles.scheduler.config import (
    BuiltScheduler,
    build_scheduler,
    model_and_speculative_config,
)
from kvconform.oracles.scheduler.lifecycle import AppliedStep, Lifecycle
from kvconform.oracles.scheduler.records import (
    AbortRecord,
    DeferredFreeRecord,
    FreeRecord,
    LoadDoneRecord,
    LoadRecord,
    ResetRecord,
    ScheduledRequest,
    SchedulerRun,
    StallRecord,
    StepFact,
    StepRecord,
)
from kvconform.oracles.scheduler.sessions import Sessions
from kvconform.oracles.scheduler.step_facts import KvEventMirror
from kvconform.oracles.scheduler.stepping import SchedulerOracle, run_scheduler

__all__ = [
    "AbortRecord",
    "AppliedStep",
    "BuiltScheduler",
    "DeferredFreeRecord",
    "FreeRecord",
    "KvEventMirror",
    "Lifecycle",
    "LoadDoneRecord",
    "LoadRecord",
    "ResetRecord",
    "ScheduledRequest",
    "SchedulerOracle",
    "SchedulerRun",
    "Sessions",
    "StallRecord",
    "StepFact",
    "StepRecord",
    "build_scheduler",
    "model_and_speculative_config",
    "run_scheduler",
]
