"""What the scheduler oracle feeds vLLM's scheduler: the scenario's requests (prompts, stop
options, multimodal features, a remote prefill's transfer parameters), the encoder budget
a scenario with multimodal inputs needs, and the KV loads a P/D decode instance's
connector starts and the fabricated worker reports received."""

from __future__ import annotations

from typing import Any

from kvconform.errors import ScenarioError
from kvconform.model.scenario import RequestSpec, Scenario
from kvconform.oracles.live import prompt_tokens
from kvconform.oracles.scheduler.records import LoadDoneRecord, LoadRecord
from kvconform.oracles.scheduler.state import OracleState
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.scheduling import Scheduling

# The token a request's stop_at-th output is, by what stops it (RequestSpec.stop_with):
# below every prompt, output and draft id, so nothing else ever samples it.
STOP_TOKEN_IDS = {"stop_token": 7, "eos": 2}


def stop_options(req: RequestSpec) -> dict[str, Any]:
    """``new_request``'s stop options for a request's ``stop_at`` / ``stop_with``."""
    if req.stop_at is None:
        return {}
    token = STOP_TOKEN_IDS[req.stop_with]
    return {"eos_token_id": token} if req.stop_with == "eos" else {"stop_token_ids": [token]}


def new_requests(vllm: Vllm, scenario: Scenario, hasher: Any, block_size: int) -> dict[str, Any]:
    """vLLM's ``Request`` of every request of the scenario, by name, in the scenario's order."""
    api = vllm.part(Scheduling)
    requests: dict[str, Any] = {}
    prompts: dict[str, list[int]] = {}
    for index, req in enumerate(scenario.requests.values()):
        prompt = prompts[req.name] = prompt_tokens(index, req, prompts)
        request = requests[req.name] = vllm.new_request(
            req.name,
            prompt,
            hasher,
            max_tokens=req.max_tokens,
            priority=req.priority,
            mm_features=(
                api.mm_features([(m.offset, m.length, m.identifier) for m in req.mm_inputs])
                if req.mm_inputs
                else None
            ),
            resumable=bool(req.stream),
            **stop_options(req),
        )
        if req.remote_prefill:
            request.kv_transfer_params = api.remote_prefill_params(
                req.name, req.prompt_len, block_size
            )
    return requests


def install_encoder_budget(oracle: OracleState) -> None:
    """An encoder budget and cache for a scenario with multimodal inputs (none otherwise:
    the tiny model is text-only, so vLLM gives its scheduler neither)."""
    inputs = [m for r in oracle.scenario.requests.values() for m in r.mm_inputs]
    if not inputs:
        return
    oracle.run.encoder_budget, oracle.run.encoder_cache_size = oracle.api.install_encoder_budget(
        oracle.scheduler,
        max(m.length for m in inputs),
        oracle.limits.max_num_encoder_input_tokens,
        oracle.limits.encoder_cache_size,
    )


def started_loads(oracle: OracleState) -> list[LoadRecord]:
    """The remote prefills whose asynchronous KV load the last ``schedule()`` started (parked
    in ``WAITING_FOR_REMOTE_KVS``), each recorded with the blocks it holds and those the
    connector writes."""
    vllm, manager, run = oracle.vllm, oracle.manager, oracle.run
    started: list[LoadRecord] = []
    for rid in sorted(oracle._remote - oracle._loaded):
        request = oracle.scheduler.requests.get(rid)
        if request is not None and oracle.api.is_loading_remote_kv(request):
            oracle._loaded.add(rid)
            oracle._loading[rid] = oracle.scenario.requests[rid].remote_prefill
            held = tuple(list(ids) for ids in manager.get_block_ids(rid))
            null = run.null_block
            record = LoadRecord(
                oracle._step,
                rid,
                int(request.num_computed_tokens),
                held,
                tuple(
                    [b for b in ids if b != null and not vllm.block_is_cached(manager, b)]
                    for ids in held
                ),
            )
            run.events.append(record)
            started.append(record)
    return started


def received_loads(oracle: OracleState) -> tuple[set[str], set[str], set[int]]:
    """The KV loads the worker reports received in this step's output, as the requests that
    received them, those whose load failed as a whole, and the blocks a load left unwritten.

    The worker reports a transfer received in the output of the step it finished in, and
    with it whether the load failed (as a whole, or leaving a block unwritten). The block
    left unwritten is one of those the load was given when it began (its
    :class:`LoadRecord`), not of the request's table now: the worker writes into the blocks
    it was handed, whatever the scheduler did with them since. A vLLM that freed them
    meanwhile (a client abort during the load, #32255) leaves the request no table; the
    free is recorded with the run's events, and the ``sanity`` invariant "hands out a block
    a KV load still writes into" judges it.
    """
    received: set[str] = set()
    failed: set[str] = set()
    invalid: set[int] = set()
    for rid in list(oracle._loading):
        oracle._loading[rid] -= 1
        if oracle._loading[rid] <= 0:
            received.add(rid)
            del oracle._loading[rid]
            oracle.run.events.append(LoadDoneRecord(oracle._current, rid))
            failure = oracle.scenario.requests[rid].load_failure
            if failure == "request":
                failed.add(rid)
            elif isinstance(failure, int):
                begun = next(
                    e
                    for e in reversed(oracle.run.events)
                    if isinstance(e, LoadRecord) and e.request == rid
                )
                given = begun.block_ids[0]
                if failure >= len(given):
                    # The loader bounds the index by the prompt's blocks; vLLM's connector may
                    # load fewer tokens (its _prefill_backoff: Mamba, bounded replay,
                    # multi-module MTP recompute the last ones), hence fewer blocks.
                    request = oracle.scenario.requests[rid]
                    where = request.where or oracle.scenario.where.at(f"requests.{rid}")
                    raise ScenarioError(
                        where.at(f"{where.field}.remote_load_fails"),
                        f"block {failure} is past the {len(given)} blocks vLLM's connector "
                        f"gave the load of {rid} ({begun.tokens} tokens: it stops short of the "
                        "tokens the decoder recomputes); name a block below it",
                    )
                if given[failure] == oracle.run.null_block:
                    # A column the table holds as the null block (before a window or a
                    # chunk) is not loaded: the worker reports no block it did not write,
                    # and vLLM would fail every request whose table holds the null block.
                    request = oracle.scenario.requests[rid]
                    where = request.where or oracle.scenario.where.at(f"requests.{rid}")
                    raise ScenarioError(
                        where.at(f"{where.field}.remote_load_fails"),
                        f"block {failure} of the load of {rid} is the null block (a column "
                        "before its window or chunk, which no KV is loaded into); name a "
                        "block the load writes",
                    )
                invalid.add(given[failure])
    return received, failed, invalid
