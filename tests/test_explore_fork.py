"""``kvconform explore --jobs N`` forks its workers: the parent must not initialize CUDA first.

On a CUDA host the nightly's explorer (0.33.0 and 0.34.0, ``--jobs 7``) reported
``crash / RuntimeError / vllm/v1/worker/gpu/warmup.py:801 _warmup_kernels``: "Cannot
re-initialize CUDA in forked subprocess", from every worker's first warmup document. The
parent had run vLLM's ``warmup_kernels`` in the set-up's warmup probe, whose
``torch.accelerator.synchronize()`` initialized CUDA there, and torch refuses CUDA in a
fork of a process that did.

There is no GPU here, so a fake CUDA stands in where kvconform decides it runs on one:
``Warmup.without_final_synchronize`` (kvconform/oracles/vllm/warmup_stubs.py), which on a
CUDA host leaves vLLM's synchronize as it is. Like torch's, the fake initializes on first
use and raises torch's error in a forked child of a process that initialized it. Each
worker uses it first thing, as its first warmup document would on a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvconform.errors import VllmUnavailable
from kvconform.explore import runner
from kvconform.explore.space import build_explore_space
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.warmup_stubs import Warmup

# torch's words (torch/cuda/__init__.py, _lazy_init), as the nightly's reproducers quote them.
REFUSAL = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
    "you must use the 'spawn' start method"
)


class FakeCuda:
    """CUDA as torch initializes it: on first use, once per process; a forked child of a
    process that initialized it is refused. Each initialization appends ``init PID`` to
    ``log`` (a file: the children's memory is their own), each worker ``worker PID``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.initialized_by: int | None = None  # copied into a fork, as torch's state is

    def synchronize(self, *args: Any, **kwargs: Any) -> None:
        pid = os.getpid()
        if self.initialized_by == pid:
            return
        if self.initialized_by is not None:
            raise RuntimeError(REFUSAL)
        self.initialized_by = pid
        self.note("init")

    def note(self, event: str) -> None:
        with self.log.open("a", encoding="utf-8") as log:
            log.write(f"{event} {os.getpid()}\n")

    def events(self) -> list[tuple[str, int]]:
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return [(event, int(pid)) for event, pid in (line.split() for line in lines)]

    @contextmanager
    def on_a_gpu(self, warmup: Warmup) -> Iterator[list[int]]:
        """``Warmup.without_final_synchronize`` on a CUDA host: nothing skipped, vLLM's
        ``torch.accelerator.synchronize()`` runs (here: this fake's)."""
        import torch

        original = torch.accelerator.synchronize
        torch.accelerator.synchronize = self.synchronize
        try:
            yield []
        finally:
            torch.accelerator.synchronize = original


@pytest.fixture
def cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda(tmp_path / "initialized-by")
    monkeypatch.setattr(Warmup, "without_final_synchronize", lambda warmup: fake.on_a_gpu(warmup))
    search = runner._search_one

    def worker_search(*args: Any, **kwargs: Any) -> Any:
        fake.note("worker")
        fake.synchronize()  # the worker's first warmup document's call
        return search(*args, **kwargs)

    monkeypatch.setattr(runner, "_search_one", worker_search)
    return fake


def test_the_parent_forks_its_workers_before_anything_initializes_cuda(
    vllm: Vllm, cuda: FakeCuda
) -> None:
    run = runner.run_explore(vllm, 600, seed=0, jobs=2, examples=1, max_findings=1)
    # The set-up probed vLLM's warmup (through the fake CUDA) and offers warmup documents.
    assert "warmup" not in run.stats.excluded, run.stats.excluded
    assert run.stats.examples == 2
    events = cuda.events()
    workers = {pid for event, pid in events if event == "worker"}
    # The set-up's child initialized CUDA first (its warmup probe), then each worker that
    # took a call (one may take both); the parent never did before it forked (after the
    # workers, it may rerun a warmup reproducer: CUDA is then its own).
    (setup, *_) = [pid for event, pid in events if event == "init"]
    assert setup != os.getpid() and setup not in workers, events
    assert os.getpid() not in workers and workers, events
    last_worker = max(i for i, (event, _) in enumerate(events) if event == "worker")
    assert ("init", os.getpid()) not in events[:last_worker], events
    assert all(("init", pid) in events for pid in workers), events


def test_a_parent_that_initialized_cuda_does_not_fork_workers(
    vllm: Vllm, cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    space = build_explore_space(vllm)  # in this process: the fake CUDA is initialized here
    assert cuda.initialized_by == os.getpid()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(VllmUnavailable, match="initialized CUDA before forking"):
        runner.run_explore(vllm, 600, seed=0, jobs=2, examples=1, space=space)
