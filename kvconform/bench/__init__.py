"""``make bench``: what kvconform costs on top of the vLLM allocator it drives.

Not part of the harness: nothing under :mod:`kvconform.harness` or
:mod:`kvconform.oracles` imports this package. It reads the harness from the
outside (the engine, the loader, the registries) and compares it with a bare
loop that makes the same vLLM calls (:mod:`.bare`).

Modules, one job each:

* :mod:`.figures` -- the shape of a figure: measured with its target, or not
  available with the reason.
* :mod:`.timing` -- interleaved passes in one process; call counting.
* :mod:`.bare` -- the bare loop over a scenario's resolved calls.
* :mod:`.overhead` -- ``step_overhead_ratio``.
* :mod:`.scaling` -- generated trajectories: cost against length and width.
* :mod:`.processes` -- import, whole-suite and pytest-xdist timings in
  subprocesses.
* :mod:`.plugins` -- figures for registered machinery (fuzzing, scenario kinds,
  checks), "not available" where it is absent.
* :mod:`.machine`, :mod:`.profiles`, :mod:`.report` -- machine facts, profiles,
  ``build/bench.json`` and the row in ``docs/benchmarks.md``.
* :mod:`.cli` -- ``python -m kvconform.bench``.
"""
