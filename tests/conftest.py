"""Shared fixtures: one vLLM per test process, and scenario files written on the fly."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kvconform.harness.loader import load_file
from kvconform.harness.scenario import Scenario
from kvconform.oracles.vllm_compat import Vllm, load, prepare_slot_kernel

# The slots tests run vLLM's slot-mapping kernel in this process: on a machine
# without CUDA, Triton's interpreter has to be chosen before vLLM is imported.
prepare_slot_kernel()


@pytest.fixture(scope="session")
def vllm() -> Vllm:
    """The installed vLLM, imported once for the whole test session."""
    return load()


@pytest.fixture
def write_scenario(tmp_path: Path) -> Callable[..., Path]:
    def write(text: str, name: str = "scenario.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
        return path

    return write


@pytest.fixture
def scenario_from(write_scenario: Callable[..., Path]) -> Callable[..., Scenario]:
    def make(text: str) -> Scenario:
        (scenario,) = load_file(write_scenario(text))
        return scenario

    return make


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` need a CUDA device; elsewhere they are skipped, not failed."""
    needing_cuda = [item for item in items if item.get_closest_marker("cuda")]
    if not needing_cuda:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in needing_cuda:
        item.add_marker(skip)
