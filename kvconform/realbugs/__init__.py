"""Real bugs: bugs vLLM shipped in its reservation code and later fixed, replayed.

A mutation score says how much of vLLM's code kvconform would notice changing; a
real bug says whether kvconform notices what actually went wrong upstream. The
catalogue (``realbugs/catalogue.yaml``) lists bugs found in vLLM's history, each
with its upstream PR and issue, the releases it spans, and a patch that puts the
bug back into a named release's Python tree (a revert of the fix, adapted where
the code moved). ``kvconform realbugs`` applies each patch to a copy of that
tree, runs the corpus against it with every check, and records whether the
corpus turned red (*detected*), stayed green (*missed*) or could not judge the
tree (*broken*, with why), with the scenarios and checks that caught it.

Modules: :mod:`.catalogue` (the entries), :mod:`.trees` (patched trees, cached),
:mod:`.replay` (one bug through the corpus), :mod:`.report` (``realbugs.json``,
``realbugs.md``), :mod:`.command` (the command line).
"""
