"""What every driver does around its parties: the predictor and the pool facts."""

from __future__ import annotations

from kvconform.model.observations import Trajectory
from kvconform.model.scenario import ModelSpec
from kvconform.oracles.predictor import Predictor
from kvconform.oracles.vllm import Vllm


def attach_predictor(
    trajectory: Trajectory, vllm: Vllm, model: ModelSpec, null_block: int
) -> Predictor:
    """vLLM's predictor for ``run``, and the pool facts every driver records.

    Where the installed vLLM has no predictor, the party is dropped from
    ``run.parties`` and a note says why: reported unavailable, never faked.
    """
    predictor = Predictor(vllm, model, trajectory)
    if not predictor.available:
        trajectory.parties = tuple(p for p in trajectory.parties if p != "predicted")
        trajectory.notes.append(f"predictor unavailable: {predictor.unavailable_reason}")
    trajectory.null_block = null_block
    trajectory.num_blocks = model.num_blocks
    trajectory.exclusive_blocks = not model.enable_caching
    return predictor
