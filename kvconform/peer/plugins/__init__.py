"""pytest plugins that run *inside* the pytest process driving vLLM's tests.

kvconform's own process never loads them: :mod:`kvconform.peer.runner` names
them with ``-p kvconform.peer.plugins.<name>`` on the command line of the
subprocess. Each does one thing:

* :mod:`~kvconform.peer.plugins.record` writes every test's outcome, and every
  collection error, as one JSON line to the file the runner reads back;
* :mod:`~kvconform.peer.plugins.deselect` deselects the node ids a baseline
  found failing on this machine;
* :mod:`~kvconform.peer.plugins.cpu_warmup` lets the V2 warmup test run
  without CUDA;
* :mod:`~kvconform.peer.plugins.light_cleanup` skips vLLM's teardown after
  each test, with vLLM's own marker;
* :mod:`~kvconform.peer.plugins.tree` lets a ``.py``-only vLLM tree find the
  installed package's compiled extensions.
"""
