"""The release matrix: the corpus against every vLLM release kvconform claims, side by side.

``kvconform matrix --releases A..B [PATH...]`` runs ``kvconform run --checks all
--vllm-release V`` for each PyPI release V from A to B on pip's index (the same
index view as ``kvconform bisect``, :mod:`kvconform.bisect.release_index`),
one fresh process per release: a process can import one vLLM tree only
(:mod:`.runner`). Each release's reports land in ``<report-dir>/<V>/``; the
matrix itself (:mod:`.table`) is one more report over them, written as
``matrix.json``, ``matrix.md`` and ``matrix.html``:

* one row per release with its verdict counts, its exit status and a link to
  its ``report.html``;
* the scenarios whose verdict changed between neighbouring releases;
* for a release older than kvconform's minimum (``MINIMUM_SUPPORTED``), a note
  saying what kvconform does there. Such releases run for bisection only: the
  warmup scenarios fail for the upstream warmup bug the minimum was chosen for,
  so their rows are information and do not decide the exit status.

The exit status is that of the worst supported release (2 bad input, then 1
nonconformance or vLLM raising, then 3 vLLM not exercisable, else 0), so a
release that errors or fails unexpectedly turns the matrix red.
"""
