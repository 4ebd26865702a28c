# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An encoder input allocated in a step must be encoded, whoever is preempted.

Under the priority policy ``Scheduler.schedule`` may preempt a running request
that it already scheduled earlier in the same step (the victim is
``max(self.running, key=(priority, arrival_time))``). It then takes the
victim's encoder inputs off the step, but ``_allocate_encoder_inputs`` has
already entered them in the encoder cache and ``_preempt_request`` only drops
the victim's references (``EncoderCacheManager.free``): the entry stays in
``cached``, so the scheduler takes the item as encoded although the encoder
never ran it, and the model runner's ``gather_mm_embeddings`` raises
``RuntimeError("Encoder cache miss")``, which ends EngineCore.

Two forms, each a test below:

* the preempted request itself resumes later and computes the image's
  placeholders with no encoder run scheduled;
* a higher-priority request that uses the same image (same ``mm_hash``) and
  is scheduled in that step found it "cached" before the preemption: the miss
  comes in that very step.

FCFS is not affected: its victim, ``self.running[-1]``, is never a request
already scheduled in the step.

kvconform's scenarios sched-encoder-priority-preemption and
sched-encoder-priority-preemption-shared-image (scenarios/scheduler/) found it
against vLLM 0.31.0 to vLLM 0.34.0. Written by hand for vLLM 0.34.0; it belongs
in tests/v1/core/ of that release's tree and uses its test helpers.
"""

import pytest

from tests.v1.core.utils import create_requests, create_scheduler
from vllm.multimodal.inputs import PlaceholderRange
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 16
# 10 usable blocks (the null block takes one): at step 3 the low-priority
# request holds 8 and the high-priority one needs 2 more than it holds.
NUM_BLOCKS = 11
MAX_STEPS = 40


def _scheduler() -> Scheduler:
    scheduler = create_scheduler(
        scheduling_policy="priority",
        max_num_batched_tokens=64,
        long_prefill_token_threshold=32,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        max_model_len=512,
    )
    # Room for every image at once: nothing is ever evicted.
    scheduler.max_num_encoder_input_tokens = 64
    scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=256)
    return scheduler


def _request(
    request_id: str,
    num_tokens: int,
    image: tuple[str, int, int],
    priority: int,
    arrival_time: float,
    max_tokens: int,
) -> Request:
    mm_hash, offset, length = image
    (request,) = create_requests(
        num_requests=1,
        num_tokens=num_tokens,
        mm_positions=[[PlaceholderRange(offset=offset, length=length)]],
        mm_hashes_list=[[mm_hash]],
        max_tokens=max_tokens,
        req_ids=[request_id],
    )
    request.priority = priority
    request.arrival_time = arrival_time
    return request


class _EncoderCacheOfTheWorker:
    """What the model runner's encoder cache holds, step by step: it drops
    ``free_encoder_mm_hashes``, runs ``scheduled_encoder_inputs``, then gathers
    the embeddings of every placeholder a scheduled chunk covers, raising
    "Encoder cache miss" for an item it does not hold (``gather_mm_embeddings``)."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.outputs: set[str] = set()

    def misses(self, output: SchedulerOutput) -> list[str]:
        self.outputs.difference_update(output.free_encoder_mm_hashes)
        requests = self.scheduler.requests
        for req_id, input_ids in output.scheduled_encoder_inputs.items():
            for input_id in input_ids:
                self.outputs.add(requests[req_id].mm_features[input_id].identifier)
        missing = []
        for req_id, num_scheduled in output.num_scheduled_tokens.items():
            request = requests[req_id]
            # schedule() has already advanced num_computed_tokens by the chunk.
            end = request.num_computed_tokens
            start = end - num_scheduled
            for feature in request.mm_features:
                position = feature.mm_position
                overlaps = position.offset < end and start < position.offset + position.length
                if overlaps and feature.identifier not in self.outputs:
                    missing.append(
                        f"request {req_id} computes positions {start}..{end - 1}, "
                        f"which cover {feature.identifier!r} at "
                        f"{position.offset}..{position.offset + position.length - 1}, "
                        "but no step encoded it"
                    )
        return missing


def _model_output(scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
    req_ids = list(output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=[
            # A chunk that ends inside the prompt samples nothing.
            [100]
            if scheduler.requests[req_id].num_computed_tokens
            >= scheduler.requests[req_id].num_prompt_tokens
            else []
            for req_id in req_ids
        ],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def _run(scheduler: Scheduler, arrivals: dict[int, list[Request]]) -> list[str]:
    """Steps until every request finishes; the encoder cache misses, by step."""
    worker = _EncoderCacheOfTheWorker(scheduler)
    misses = []
    for step in range(1, MAX_STEPS + 1):
        for request in arrivals.get(step, []):
            scheduler.add_request(request)
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        misses += [f"step {step}: {miss}" for miss in worker.misses(output)]
        scheduler.update_from_output(output, _model_output(scheduler, output))
    assert not scheduler.has_requests(), f"unfinished after {MAX_STEPS} steps"
    return misses


def test_preempted_request_resumes_with_its_unencoded_image():
    """Low-priority A is scheduled at step 3 with the chunk 96..127 that holds
    its image; B (higher priority, later in the running list) then needs a block
    and A is preempted. When A resumes, its image must be encoded again."""
    scheduler = _scheduler()
    a = _request("A", 128, ("img-a", 96, 32), priority=1, arrival_time=1.0, max_tokens=2)
    b = _request("B", 32, ("img-b", 0, 16), priority=0, arrival_time=2.0, max_tokens=4)
    misses = _run(scheduler, {1: [a], 2: [b]})
    assert a.num_preemptions == 1, "the scenario must preempt A in the step it was scheduled"
    assert not misses, "\n".join(misses)


def test_request_sharing_the_image_misses_it_in_the_same_step():
    """A (low priority) and B (high priority) show the same image. At step 3 A is
    scheduled over it (allocated), B's chunk covers it too and finds it "cached",
    then B's blocks preempt A: nobody encodes the image B computes in that step."""
    scheduler = _scheduler()
    a = _request("A", 128, ("img", 96, 32), priority=1, arrival_time=1.0, max_tokens=2)
    b = _request("B", 64, ("img", 32, 32), priority=0, arrival_time=2.0, max_tokens=4)
    misses = _run(scheduler, {1: [a], 2: [b]})
    assert a.num_preemptions == 1, "the scenario must preempt A in the step it was scheduled"
    assert not misses, "\n".join(misses)
