"""tools/explore_hits_reach.py: the count docs/explore.md quotes is a chain of narrowing filters.

Each line of its output counts a subset of the line above it (admissions with prefix caching,
those sharing an earlier prompt, those with a hit rule for every group, those the hits bound
applies to, those it asks a hit of); a tool that miscounted would break the chain or the
number of examples drawn.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "explore_hits_reach", REPO / "tools" / "explore_hits_reach.py"
)
assert _spec is not None and _spec.loader is not None
reach = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reach)


@pytest.mark.slow
def test_the_counts_narrow_and_cover_every_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["explore_hits_reach", "--examples", "40", "--seed", "1"])
    reach.main()
    counts = json.loads(capsys.readouterr().out)
    assert counts["examples"] == 40, counts
    chain = [
        "scheduler workloads",
        "first admissions with prefix caching",
        "... with an earlier request sharing the prompt",
        "... with a hit rule for every group",
        "... the bound applies",
        "... the bound asks for a hit (> 0 tokens)",
    ]
    assert counts[chain[0]] <= counts["examples"]
    present = [counts.get(name, 0) for name in chain[1:]]
    assert present == sorted(present, reverse=True), dict(zip(chain[1:], present, strict=True))
    assert present[0] > 0, "40 examples drew no admission with prefix caching"
    shared = present[1]
    # Every shared lookup is either bounded by a hit rule for each group or has a reason why not.
    assert present[2] + sum(counts["no bound, why"].values()) == shared, counts
    if "follow-ups" in counts:
        assert counts.get("... their source finished before they arrived", 0) <= counts["follow-ups"]
