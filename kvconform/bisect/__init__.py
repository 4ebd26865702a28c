"""Bisection: find the vLLM release or commit where conformance changed.

``kvconform bisect --releases A..B`` bisects the PyPI releases between A and B
(:mod:`.releases_mode`); ``kvconform bisect --repo DIR --good REV --bad REV``
drives ``git bisect run`` in a private clone of a vLLM checkout
(:mod:`.git_mode`). Both probe one vLLM at a time in a fresh process running
``kvconform check`` (:mod:`.probe`), cache every probe's result and report
(:mod:`.selection` names what a result depends on), save their progress in a
state file so that an interrupted bisection resumes (:mod:`.state`), and end
with the boundary and the scenarios whose verdict flipped there
(:mod:`.summary`). :mod:`.outcome` maps run statuses to git bisect's exit
codes, and :mod:`.search` is the version-list bisection itself.
"""
