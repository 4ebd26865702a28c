"""vLLM's own tests as a peer yardstick for kvconform.

kvconform's corpus claims to catch bugs in vLLM's KV-cache block reservation.
The fair comparison is with what vLLM's *own* tests catch on the same broken
trees, so this package runs them: the CPU-runnable part of the release's test
suite that reaches the reservation code, in pytest subprocesses, against the
installed vLLM or a mutated copy of it.

The pieces, each in a module of its own:

* :mod:`~kvconform.peer.index` and :mod:`~kvconform.peer.fetch`: the tests
  come from the release's source distribution, found on the package index's
  simple page, checked against its sha256, cached;
* :mod:`~kvconform.peer.deps`, :mod:`~kvconform.peer.models` and
  :mod:`~kvconform.peer.environment`: what the tests need to run offline on a
  CPU (pinned pytest plugins, config-only model folders, the environment);
* :mod:`~kvconform.peer.plugins`: pytest plugins loaded in the subprocess;
* :mod:`~kvconform.peer.selection`, :mod:`~kvconform.peer.baseline`: which
  tests, minus those that fail here already;
* :mod:`~kvconform.peer.reach` and :mod:`~kvconform.peer.coverage_report`:
  which test reaches which function, and how much of the code they cover;
* :mod:`~kvconform.peer.runner` and :mod:`~kvconform.peer.verdict`: one run
  and what it says (killed, survived, broken, timeout);
* :mod:`~kvconform.peer.suite`: :func:`prepare` and :class:`PeerSuite`, the API.

Nothing here imports vLLM, torch or triton; of kvconform it uses only
:mod:`kvconform.paths` and :mod:`kvconform.errors`. ``docs/peer-tests.md``
has the measurements.
"""

from kvconform.peer.suite import PeerOutcome, PeerSuite, prepare
from kvconform.peer.verdict import Failure, Verdict

__all__ = ["Failure", "PeerOutcome", "PeerSuite", "Verdict", "prepare"]
