"""What ``kvconform run`` prints on stdout while it runs, at three verbosities, as pytest does.

* default (0): a character per scenario, in rows that end with the share done
  (``.`` passed, ``F`` failed, ``E`` error, ``s`` skipped, ``x`` xfailed, ``X``
  xpassed, ``u`` unsupported); at the end, the skips folded by reason, every
  failure and error with its first message, the root causes and the summary;
* ``-v`` (1): a line per scenario with its verdict and time, the failures' first
  messages under it;
* ``-q`` (-1): nothing per scenario; the summary only (failures and their reruns,
  the counts, the reports).

The rows are written a character at a time (and flushed) when no progress display
shares the output; when one does (a bar on the terminal, or ``--progress lines``
that a CI log interleaves), a row is printed whole through
:meth:`~kvconform.fronts.progress.Progress.echo`, so that the two never tear each
other. The end of the run is :func:`kvconform.fronts.summary.finish_run`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from kvconform.fronts.progress import Progress
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.model.wording import count, shorten

QUIET, NORMAL, VERBOSE = -1, 0, 1

LETTERS = {
    Verdict.PASSED: ".",
    Verdict.FAILED: "F",
    Verdict.ERROR: "E",
    Verdict.SKIPPED: "s",
    Verdict.XFAILED: "x",
    Verdict.XPASSED: "X",
    Verdict.UNSUPPORTED: "u",
}
# A row of characters, then " [ 42%]": 80 columns, as pytest's.
ROW = 72
# A folded line names its scenarios while it stays this short (at least the first);
# then "+N more". Its reason's prose is shortened to fit (never its figures).
FOLDED_LINE = 200


def result_lines(result: ScenarioResult) -> list[str]:
    """``-v``'s lines for one scenario: its verdict and time, then why (failures: the
    first three messages)."""
    skipped = "".join(f"; {name} skipped" for name in result.skipped_checks)
    lines = [
        f"{result.verdict.value.upper():8} {result.id}  ({result.duration * 1000:.0f} ms{skipped})"
    ]
    pad = " " * 9
    if result.verdict in (Verdict.FAILED, Verdict.ERROR):
        messages = ([result.error] if result.error else []) + [
            f"[{f.check}] {f.message}" for f in result.failures[:3]
        ]
        lines += [pad + m for m in messages]
        if len(result.failures) > 3:
            lines.append(f"{pad}... {len(result.failures) - 3} more failures in report.json")
    elif result.verdict is Verdict.SKIPPED:
        lines.append(f"{pad}{result.skip_reason}")
    elif result.verdict is Verdict.UNSUPPORTED:
        lines.append(f"{pad}not offered here, not counted against it: {result.error}")
    elif result.verdict is Verdict.XPASSED:
        lines.append(
            f"{pad}listed as a known divergence ({result.expectation}) but conforms now: "
            "narrow the entry (kvconform run --update-expectations)"
        )
    elif result.expectation:
        lines.append(f"{pad}known divergence: {result.expectation}")
    return lines


class Console:
    """Shows each scenario's verdict as it comes, at the run's verbosity."""

    def __init__(
        self,
        verbosity: int,
        total: int,
        progress: Progress,
        stream: TextIO | None = None,
    ) -> None:
        self.verbosity = verbosity
        self.total = max(1, total)
        self.progress = progress
        self.stream = stream or sys.stdout
        self.done = 0
        self.row = ""
        # Characters go straight out unless progress shares the output (a bar redrawn on
        # the terminal, lines that a CI log would interleave): then whole rows.
        self.stream_chars = progress.mode == "off"

    def say(self, text: str) -> None:
        """A line of the command's own, after any row in progress."""
        self.end_row()
        self.progress.echo(text, stream=self.stream)

    def result(self, result: ScenarioResult) -> None:
        self.done += 1
        if self.verbosity >= VERBOSE:
            for line in result_lines(result):
                self.progress.echo(line, stream=self.stream)
        elif self.verbosity == NORMAL:
            self._char(LETTERS[result.verdict])

    def _char(self, letter: str) -> None:
        self.row += letter
        if self.stream_chars:
            self.stream.write(letter)
            self.stream.flush()
        if len(self.row) >= ROW or self.done >= self.total:
            self._close_row()

    def _close_row(self) -> None:
        share = f"[{100 * self.done // self.total:3d}%]"
        if self.stream_chars:
            self.stream.write(" " * (ROW - len(self.row)) + f" {share}\n")
            self.stream.flush()
        else:
            self.progress.echo(f"{self.row:{ROW}} {share}", stream=self.stream)
        self.row = ""

    def end_row(self) -> None:
        """Finish a row cut short (the run ended or was interrupted)."""
        if self.row:
            self._close_row()


def folded(
    results: Sequence[ScenarioResult],
    verdict: Verdict,
    why: Callable[[ScenarioResult], str],
    label: str,
) -> list[str]:
    """One line per reason: ``SKIPPED 11 scenarios: no CUDA device: ... (a, b, +9 more)``,
    the ids named while the line stays within :data:`FOLDED_LINE` characters."""
    by_reason: dict[str, list[str]] = {}
    for result in results:
        if result.verdict is verdict:
            by_reason.setdefault(why(result) or verdict.value, []).append(result.id)
    lines = []
    for reason, ids in by_reason.items():
        head = f"{label:11} {count(len(ids), 'scenario')}: "
        reason = shorten(reason, max(40, FOLDED_LINE - len(head) - 40))
        named = ids[:1]
        for index, scenario_id in enumerate(ids[1:], 1):
            rest = len(ids) - index - 1
            more = f", +{rest} more" if rest else ""
            if len(head + reason) + len(" (" + ", ".join([*named, scenario_id]) + more + ")") > (
                FOLDED_LINE
            ):
                break
            named.append(scenario_id)
        more = f", +{len(ids) - len(named)} more" if len(ids) > len(named) else ""
        lines.append(f"{head}{reason} ({', '.join(named)}{more})")
    return lines


def folded_lines(results: Sequence[ScenarioResult]) -> list[str]:
    """The verdicts a default run does not list one by one, folded by reason."""
    return [
        *folded(results, Verdict.SKIPPED, lambda r: r.skip_reason or "skipped", "SKIPPED"),
        *folded(
            results,
            Verdict.UNSUPPORTED,
            lambda r: f"not offered here, not counted against it: {r.error}",
            "UNSUPPORTED",
        ),
    ]
