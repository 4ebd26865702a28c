"""``kvconform fuzz``: Hypothesis-generated trajectories, shrunk to YAML reproducers.

Hand-written scenarios find what their authors thought of; generated ones find
the rest. The fuzzer draws whole scenario *documents* -- plain dicts in the v1
YAML format -- renders each to YAML text, loads that text through the real
loader and runs it through :func:`kvconform.harness.runner.run_scenario`, the
same engine as ``kvconform run``. A failure is shrunk by Hypothesis and the
shrunk text, which is exactly what was run, is written out as a reproducer.

Modules, one job each:

* :mod:`.space` -- what may be drawn on the vLLM in use: the group types it can
  build (each tried once on a probe scenario), its speculative methods and their
  lookahead.
* :mod:`.strategies` -- the Hypothesis strategies that draw legal scenario
  documents.
* :mod:`.pool` -- an upper bound of the blocks a trajectory holds at once, so
  the pool can be sized for pressure without running dry.
* :mod:`.document` -- documents to YAML text, and the reproducer's header.
* :mod:`.findings` -- what makes two failures "the same finding".
* :mod:`.runner` -- the search loop: rounds of Hypothesis ``find``, one finding
  per round, progress lines, statistics, reproducers.

Hypothesis is imported by those modules only, so the command line starts (and
``kvconform run`` works) without it; ``kvconform fuzz`` asks for it.
"""

from __future__ import annotations

from typing import Any

# Example budgets: the test suite's CI run, a plain `kvconform fuzz`, the nightly job.
CI_EXAMPLES = 500
DEFAULT_EXAMPLES = 2000
NIGHTLY_EXAMPLES = 20000
DEFAULT_MAX_FINDINGS = 10

__all__ = [
    "CI_EXAMPLES",
    "DEFAULT_EXAMPLES",
    "NIGHTLY_EXAMPLES",
    "FuzzStats",
    "run_fuzz",
    "shard_budget",
]


def shard_budget(examples: int, seed: int, index: int, count: int) -> tuple[int, int]:
    """Shard ``index`` of ``count`` (1-based) of a fuzz run: its examples and its seed.

    The budget is split as evenly as it goes; each shard searches with a seed of
    its own (``seed * count + index - 1``: shard 1 of 1 is the unsharded run), so
    the shards of a CI job draw different examples and every machine draws the
    same ones for the same shard. The returned pair is what a reproducer's
    ``found by`` line names, so a finding reruns without the shard.
    """
    share = examples // count + (1 if index <= examples % count else 0)
    return share, seed * count + index - 1


def __getattr__(name: str) -> Any:
    # run_fuzz and FuzzStats on first use, so importing the package needs no Hypothesis.
    if name in ("run_fuzz", "FuzzStats"):
        from kvconform.fuzz import runner

        return getattr(runner, name)
    raise AttributeError(name)
