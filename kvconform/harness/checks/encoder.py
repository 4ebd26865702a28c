"""``sanity``, the encoder family: multimodal encoder inputs in scheduler mode.

The model runner drops the encoder outputs a step frees (``free_encoder_mm_hashes``),
runs the encoder on the inputs the step schedules (``scheduled_encoder_inputs``) and
then gathers, for every placeholder token the step computes, its input's encoder output
from its cache ("Encoder cache miss" otherwise: ``GPUModelRunner._gather_mm_embeddings``).
So: every input a row's tokens ``computed .. computed + scheduled`` overlap is held then;
the inputs run in one step take at most the encoder budget and those held at most the
encoder cache; under ``disable_chunked_mm_input`` no chunk that starts at or before an
input ends inside it (issue #52306); and with ``scheduler.log_iteration_details`` the
step's ``scheduled_encoder_input_stats`` count the inputs it schedules and their
embeddings (None in a step that schedules none). The worker's encoder cache is followed
here, over the steps the scheduler oracle records (:class:`~kvconform.model.facts.EncoderStep`).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import at_request, fact_failure, facts_of
from kvconform.model.facts import EncoderInputStats, EncoderStep, Fact
from kvconform.model.observations import (
    ENCODER_BUDGET_EXCEEDED,
    ENCODER_CACHE_OVERFLOW,
    ENCODER_OUTPUT_MISSING,
    ENCODER_STATS_DIFFER,
    MM_INPUT_SPLIT,
    Trajectory,
)
from kvconform.model.results import Failure


def _step(trajectory: Trajectory, fact: Fact, held: dict[str, int]) -> Iterator[Failure]:
    what = fact.what
    assert isinstance(what, EncoderStep)
    for mm_hash in what.freed:
        held.pop(mm_hash, None)
    run_now: list[str] = []
    embeddings = 0
    for rid, index in what.run:
        mm = what.inputs[rid][index]
        held[mm.identifier] = mm.length
        run_now.append(f"{rid}[{index}] {mm.length}")
        embeddings += mm.length
    if embeddings > what.budget:
        yield fact_failure(
            fact,
            f"the step runs the encoder on {', '.join(run_now)}: {embeddings} embeddings, "
            f"past the encoder budget of {what.budget}",
            ENCODER_BUDGET_EXCEEDED,
        )
    if sum(held.values()) > what.cache_size:
        yield fact_failure(
            fact,
            f"the worker's encoder cache holds {sum(held.values())} embeddings after the "
            f"step's frees ({', '.join(sorted(held))}), past its size of {what.cache_size}",
            ENCODER_CACHE_OVERFLOW,
        )
    for request, computed, scheduled in what.rows:
        start, end = computed, computed + scheduled
        for index, mm in enumerate(what.inputs[request]):
            if not (mm.offset < end and start < mm.end):
                continue
            where = f"input {index} ({mm.identifier}, placeholders {mm.offset}..{mm.end - 1})"
            if mm.identifier not in held:
                yield fact_failure(
                    at_request(trajectory, fact, request),
                    f"the step computes tokens {start}..{end - 1}, which overlap {where}, "
                    "but its encoder output is neither run in this step nor held from an "
                    "earlier one: the model runner has no embeddings for them",
                    ENCODER_OUTPUT_MISSING,
                )
            if what.no_split and start <= mm.offset and end < mm.end:
                yield fact_failure(
                    at_request(trajectory, fact, request),
                    f"the chunk {start}..{end - 1} ends inside {where} under "
                    "disable_chunked_mm_input",
                    MM_INPUT_SPLIT,
                )


def _told(stats: tuple[int, int] | None) -> str:
    return "none" if stats is None else f"{stats[0]} inputs, {stats[1]} embeddings"


def judge(trajectory: Trajectory) -> Iterator[tuple[int, Failure]]:
    """(fact index, failure) of the encoder family, in recording order."""
    # The worker's encoder cache: the embeddings it holds, by mm hash.
    held: dict[str, int] = {}
    for index, fact in facts_of(trajectory, EncoderStep, EncoderInputStats):
        what = fact.what
        if isinstance(what, EncoderStep):
            for failure in _step(trajectory, fact, held):
                yield index, failure
            continue
        assert isinstance(what, EncoderInputStats)
        scheduled = what.scheduled
        expected = (len(scheduled), sum(length for _, length in scheduled)) if scheduled else None
        if what.reported == expected:
            continue
        message = (
            f"the step's scheduled_encoder_input_stats report {_told(what.reported)}, but it "
            f"schedules {_told(expected)}"
            + (f" ({', '.join(name for name, _ in scheduled)})" if scheduled else "")
        )
        yield index, fact_failure(fact, message, ENCODER_STATS_DIFFER)
