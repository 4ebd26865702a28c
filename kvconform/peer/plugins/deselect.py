"""Deselect the tests a baseline found failing on this machine, by node id.

A file of node ids, one per line (``$KVCONFORM_PEER_DESELECT``), is read at
collection; every collected item whose node id is listed is deselected through
pytest's own ``pytest_deselected`` hook, so the summary counts them as
deselected, exactly as ``--deselect`` would, without a command line thousands
of characters long. Load with ``-p kvconform.peer.plugins.deselect``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get("KVCONFORM_PEER_DESELECT")
    if not path:
        return
    listed = {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    kept = [item for item in items if item.nodeid not in listed]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in listed])
        items[:] = kept
