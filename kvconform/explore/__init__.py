"""``kvconform explore``: generated scheduler workloads over vLLM's real scheduler.

Where ``kvconform fuzz`` draws trajectories (kvconform decides every step), the
explorer draws whole workloads -- a model's KV-cache groups, the scheduler's
settings, requests arriving over time -- and lets vLLM's own ``Scheduler`` (or
``AsyncScheduler``, in lockstep or overlapped) decide every step, as
``kind: scheduler`` scenarios do; one example in ten is instead a ``kind:
startup`` document (vLLM's startup planning handed a pool at the edge of one
``max_model_len`` request) and one a ``kind: warmup`` document (the model
runner's warmup). Each document is loaded by the real loader, run by the same
driver as ``kvconform run`` and judged by every registered check; a failure is shrunk by Hypothesis
to the smallest workload that still fails the same way and written out as a
YAML scenario that ``kvconform run`` reproduces.

Modules, one job each:

* :mod:`.space` -- what may be drawn on the vLLM in use (group types, methods,
  optional settings), each probed once;
* :mod:`.strategies` -- the kind of an example; for a scheduler workload swarm
  testing (its features, then the workload within them); startup and warmup
  documents; the options a method's registry entry declares;
* :mod:`.runner` -- the explorer's example source for the shared search loop
  (:mod:`kvconform.fuzz.search`), its statistics, and ``--jobs`` workers;
* :mod:`.command` -- the command line's options and the command.

docs/explore.md describes the distribution and the statistics printed.
"""

from __future__ import annotations

# Seconds of search: make explore (a pull request's budget), a plain run, the nightly job.
PR_BUDGET = 120
DEFAULT_BUDGET = 120
NIGHTLY_BUDGET = 1800
DEFAULT_MAX_FINDINGS = 10
