"""Run the V2 warmup test (``tests/v1/worker/test_gpu_warmup_blocks.py``) on a CPU.

That file, upstream's test of the warmup's lookahead reservation, is skipped
module-wide where CUDA is missing, and only because ``warmup_kernels`` ends in
``torch.accelerator.synchronize()``, which raises on a machine without an
accelerator. Nothing else in it needs a GPU: the model runner is a stub, the
KV blocks are counted, not allocated on a device.

This plugin stubs exactly what the CPU lacks, nothing else:

* it drops the *module-level* ``skipif`` marks of the named files (marks on a
  single test or class are kept);
* while a test of those files runs (setup, call, teardown), it makes
  ``torch.accelerator.synchronize`` a no-op, and puts the real one back after.

The files are given with ``--peer-cpu-file PATH`` (repeatable, a path
relative to the rootdir); without any, the warmup test's path is used. Load
it with ``-p kvconform.peer.plugins.cpu_warmup``. torch is not imported here:
the synchronize call is looked up on the ``torch`` the test module imported.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

WARMUP_TEST = "tests/v1/worker/test_gpu_warmup_blocks.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peer-cpu-file",
        action="append",
        default=[],
        help="a test file whose module-wide skipif is dropped and whose "
        "torch.accelerator.synchronize is a no-op (kvconform.peer)",
    )


def _files(config: pytest.Config) -> set[Path]:
    named = config.getoption("--peer-cpu-file") or [WARMUP_TEST]
    return {(config.rootpath / name).resolve() for name in named}


def _is_target(item: pytest.Item) -> bool:
    return Path(item.path).resolve() in item.config.stash[_TARGETS]


_TARGETS = pytest.StashKey[set[Path]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TARGETS] = _files(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = {id(m): m for i in items if _is_target(i) and (m := i.getparent(pytest.Module))}
    for module in modules.values():
        module.own_markers[:] = [m for m in module.own_markers if m.name != "skipif"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    with _no_sync(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    with _no_sync(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    with _no_sync(item):
        return (yield)


class _no_sync:  # noqa: N801 - used as a context manager, like contextlib's
    """``torch.accelerator.synchronize`` as a no-op, for a target item only."""

    def __init__(self, item: pytest.Item) -> None:
        self.accelerator = None
        torch = sys.modules.get("torch")
        if _is_target(item) and torch is not None:
            self.accelerator = getattr(torch, "accelerator", None)

    def __enter__(self) -> None:
        if self.accelerator is not None:
            self.saved = self.accelerator.synchronize
            self.accelerator.synchronize = _synchronize_nothing

    def __exit__(self, *exc: object) -> None:
        if self.accelerator is not None:
            self.accelerator.synchronize = self.saved


def _synchronize_nothing(device: object = None) -> None:
    """No accelerator, nothing queued on it: nothing to wait for."""
