"""Skip vLLM's global cleanup after each test, with vLLM's own marker.

vLLM's ``tests/conftest.py`` tears the process down after every test
(``cleanup_dist_env_and_memory``: the distributed groups, a full
``gc.collect()``, the accelerator's cache). On a CPU that teardown is nearly
all of a unit test's cost: in a measured serial run of ``tests/v1/core``,
633 tests spent 1.8 of 35 minutes in their own bodies and the rest around
them, mostly collecting the garbage of a process that holds torch and vLLM.

vLLM offers the way out itself: a test marked ``skip_global_cleanup`` skips
that teardown (the fixture ``should_do_global_cleanup_after_test`` says so,
"a ~10x speedup for non-GPU unit tests"). This plugin puts that marker on
every collected test and changes nothing else. A test that would depend on
the cleanup of the one before it fails on the unmodified tree too, and the
baseline deselects it. Load with ``-p kvconform.peer.plugins.light_cleanup``.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # vLLM's pyproject.toml declares the marker; declared here too for a suite that does not.
    config.addinivalue_line("markers", "skip_global_cleanup: skip vLLM's per-test teardown")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)
