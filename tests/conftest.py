"""Shared fixtures: one vLLM per test process, and scenario files written on the fly."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from kvconform.harness.loader import load_file
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm, load, prepare_slot_kernel
from kvconform.paths import cache_dir

# The slots tests run vLLM's slot-mapping kernel in this process: on a machine
# without CUDA, Triton's interpreter has to be chosen before vLLM is imported.
prepare_slot_kernel()

# Hypothesis' example database lives with kvconform's other caches, never in the
# repository (its default is .hypothesis/ in the working directory).
settings.register_profile(
    "kvconform", database=DirectoryBasedExampleDatabase(str(cache_dir("hypothesis")))
)
settings.load_profile("kvconform")


@pytest.fixture(scope="session")
def vllm() -> Vllm:
    """The installed vLLM, imported once for the whole test session."""
    return load()


@pytest.fixture(scope="session")
def pristine_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed vLLM's Python tree (the folder holding vllm/), once per session."""
    from vllm_copy import copy_pristine

    return copy_pristine(tmp_path_factory.mktemp("vllm-pristine"))


# The release whose code the older injected-bug tests edit: their `old` texts are 0.33.0's
# (kept so that each injected bug stays the bug it was written as), whatever vLLM is pinned.
INJECTED_RELEASE = "0.33.0"


@pytest.fixture(scope="session")
def pristine_tree_033() -> Path:
    """vLLM 0.33.0's Python tree (the folder holding vllm/; downloaded once and cached), for the
    tests whose injected text is 0.33.0's; run ahead of the installed compiled parts."""
    from kvconform.harness.releases import release_tree

    return release_tree(INJECTED_RELEASE)


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


# -- fuzzing budgets ---------------------------------------------------------------------
# CI runs the in-suite fuzz test with a small, fixed budget and seed; the nightly job
# raises both (docs/fuzzing.md):
#   pytest tests/test_fuzz.py --kvconform-fuzz-examples 20000 --kvconform-fuzz-seed 20261130
# or the same through the environment (KVCONFORM_FUZZ_EXAMPLES, KVCONFORM_FUZZ_SEED).


def pytest_addoption(parser: pytest.Parser) -> None:
    from kvconform.fuzz import CI_EXAMPLES

    group = parser.getgroup("kvconform fuzz")
    group.addoption(
        "--kvconform-fuzz-examples",
        type=int,
        default=int(os.environ.get("KVCONFORM_FUZZ_EXAMPLES", CI_EXAMPLES)),
        help=f"examples for the in-suite fuzz run (default {CI_EXAMPLES}; nightly 20000)",
    )
    group.addoption(
        "--kvconform-fuzz-seed",
        type=int,
        default=int(os.environ.get("KVCONFORM_FUZZ_SEED", 0)),
        help="seed of the in-suite fuzz run (default 0: every CI run draws the same examples)",
    )


@dataclass(frozen=True)
class FuzzBudget:
    examples: int
    seed: int


@pytest.fixture(scope="session")
def fuzz_budget(request: pytest.FixtureRequest) -> FuzzBudget:
    return FuzzBudget(
        request.config.getoption("kvconform_fuzz_examples"),
        request.config.getoption("kvconform_fuzz_seed"),
    )
