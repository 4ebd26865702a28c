"""The findings as vLLM would take them: reproducers and fixes checked in vLLM's own tree.

``make upstream-check`` (``python -m kvconform.upstream``) takes each finding of
``docs/reproducers/upstream.yaml`` (:mod:`~kvconform.upstream.catalogue`) into a copy
of its release's test tree and shows that its reproducer fails on the release, passes
with the fix, and that vLLM's own CPU-runnable tests stay green with the fix
(:mod:`~kvconform.upstream.checking`; the tests are run through :mod:`kvconform.peer`).
It is slow (vLLM's own suite: 12 minutes on two cores for the 0.33.0 entries, about 30
more for the 0.34.0 ones, once the peer surveys are cached),
so it is one of ``make campaigns``, not ``.ci/run``; the fast part, each reproducer failing on the installed release, is in ``make test``
(``tests/test_reproducers.py``).
"""

from kvconform.upstream.catalogue import CATALOGUE, Catalogue, Finding, load_catalogue
from kvconform.upstream.checking import Step, check

__all__ = ["CATALOGUE", "Catalogue", "Finding", "Step", "check", "load_catalogue"]
