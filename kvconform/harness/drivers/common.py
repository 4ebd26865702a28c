"""What every driver does around its parties: the predictor and the pool facts."""

from __future__ import annotations

from kvconform.model.observations import Trajectory
from kvconform.model.scenario import ModelSpec
from kvconform.oracles.predictor import Predictor
from kvconform.oracles.vllm import Vllm


def attach_predictor(run: Trajectory, vllm: Vllm, model: ModelSpec, null_block: int) -> Predictor:
    """vLLM's predictor for ``run``, and the pool facts every driver records.

    Where the installed vLLM has no predictor, the party is dropped from
    ``run.parties`` and a note says why: reported unavailable, never faked.
    """
    predictor = Predictor(vllm, model, run)
    if not predictor.available:
        run.parties = tuple(p for p in run.parties if p != "predicted")
        run.notes.append(f"predictor unavailable: {predictor.unavailable_reason}")
    run.null_block = null_block
    run.num_blocks = model.num_blocks
    run.exclusive_blocks = not model.enable_caching
    return predictor
