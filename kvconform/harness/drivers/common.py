"""What every driver does around its parties: the predictor and the pool facts."""

from __future__ import annotations

from kvconform.errors import StepDenied
from kvconform.model.observations import Denial, Trajectory
from kvconform.model.parties import Party
from kvconform.model.scenario import ModelSpec
from kvconform.oracles.predictor import Predictor
from kvconform.oracles.vllm import Vllm


def attach_predictor(
    trajectory: Trajectory, vllm: Vllm, model: ModelSpec, null_block: int
) -> Predictor:
    """vLLM's predictor for ``trajectory``, and the pool facts every driver records.

    Where the installed vLLM has no predictor, the party is dropped from
    ``trajectory.parties`` and a note says why: reported unavailable, never faked.
    """
    predictor = Predictor(vllm, model, trajectory)
    if not predictor.available:
        trajectory.parties = tuple(p for p in trajectory.parties if p != Party.PREDICTED)
        trajectory.notes.append(f"predictor unavailable: {predictor.unavailable_reason}")
    trajectory.null_block = null_block
    trajectory.num_blocks = model.num_blocks
    trajectory.exclusive_blocks = not model.enable_caching
    return predictor


def denial(denied: StepDenied, step: int, line: int | None) -> Denial:
    """The record of a step vLLM refused although the floor fits it."""
    call = denied.call
    return Denial(
        step, line, call.request, call.label, denied.who, denied.need, denied.available,
        denied.free, denied.detail,
    )  # fmt: skip
