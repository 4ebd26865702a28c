"""What every driver does around its parties: the predictor, the pool facts, and the
recording in progress that the runner keeps when a party raises."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

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


@dataclass
class InProgress:
    """What a driver has recorded so far, for the runner to keep if a party raises.

    A driver hands its :class:`Trajectory` over (:func:`keep_in_progress`) as soon as it
    has one and fills it as it goes (trajectory, warmup), or hands over what it built
    from its oracle's records up to the exception (scheduler mode).
    """

    trajectory: Trajectory | None = None


_IN_PROGRESS: ContextVar[InProgress | None] = ContextVar("kvconform_in_progress", default=None)


@contextmanager
def recording_in_progress() -> Iterator[InProgress]:
    """The runner's side: what the driver run inside records, kept past an exception."""
    holder = InProgress()
    token = _IN_PROGRESS.set(holder)
    try:
        yield holder
    finally:
        _IN_PROGRESS.reset(token)


def keep_in_progress(trajectory: Trajectory) -> None:
    """The driver's side: ``trajectory`` is what it recorded so far (a no-op where no
    runner asked, as when a test calls a driver itself)."""
    holder = _IN_PROGRESS.get()
    if holder is not None:
        holder.trajectory = trajectory
