"""Progress of a long command: a bar on a terminal, plain periodic lines in a CI log.

``kvconform run`` over a large corpus, ``fuzz`` over thousands of examples and
``bisect`` over many releases run for minutes. A person at a terminal wants a
bar that redraws in place; a CI log wants neither carriage returns nor one line
per tick, but a line every so often that says how far the job got and how long
the rest will take. One :class:`Progress` object does both, picked by
:func:`open_progress` from whether the stream is a terminal::

    with open_progress(len(items), "scenarios", mode=args.progress) as progress:
        for item in items:
            result = work(item)
            progress.echo(f"{result.verdict} {item}")  # a line that keeps the bar intact
            progress.advance(tally=result.verdict.value)

``tally`` counts outcomes by name (``3 failed, 1 error``) and shows them next
to the bar and in the lines. Modes: ``bar`` (redrawn in place), ``lines``
(a line every ``every_items`` items or ``every_seconds`` seconds, whichever
comes first, and one at the end), ``off``, and ``auto`` (``bar`` when the
stream is a terminal, ``lines`` otherwise). ``KVCONFORM_PROGRESS`` sets the
default mode, for CI jobs that cannot pass a flag.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

MODES = ("auto", "bar", "lines", "off")
ENV_MODE = "KVCONFORM_PROGRESS"
# A bar redraws at most this often: redrawing per item would cost more than
# the item itself for fast scenarios.
BAR_REFRESH_S = 0.1
# Tallies that are good news are shown without emphasis; others are listed first.
QUIET_TALLIES = ("passed", "xfailed", "ok")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts work done and shows it; see the module docstring for the modes."""

    def __init__(
        self,
        total: int | None,
        label: str,
        stream: TextIO,
        mode: str,
        *,
        every_items: int = 25,
        every_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        if mode not in ("bar", "lines", "off"):
            raise ValueError(f"progress mode {mode!r}: use bar, lines or off")
        self.total = total
        self.label = label
        self.stream = stream
        self.mode = mode
        self.every_items = max(1, every_items)
        self.every_seconds = every_seconds
        self.clock = clock
        self.width = width
        self.done = 0
        self.tally: Counter[str] = Counter()
        self.current = ""
        self.started = clock()
        self._last_line_at = self.started
        self._last_line_done = 0
        self._last_draw = -float("inf")
        self._bar_shown = False
        self._closed = False

    # -- what callers use ----------------------------------------------------------

    def advance(self, n: int = 1, *, tally: str | None = None, current: str = "") -> None:
        """``n`` more items are done; ``tally`` names their outcome."""
        self.done += n
        if tally:
            self.tally[tally] += n
        if current:
            self.current = current
        now = self.clock()
        if self.mode == "bar":
            finished = self.total is not None and self.done >= self.total
            if finished or now - self._last_draw >= BAR_REFRESH_S:
                self._draw(now)
        elif self.mode == "lines":
            if (
                self.done - self._last_line_done >= self.every_items
                or now - self._last_line_at >= self.every_seconds
            ):
                self._line(now)

    def start_item(self, name: str) -> None:
        """Name the item being worked on (shown in the bar; the lines ignore it)."""
        self.current = name
        if self.mode == "bar":
            now = self.clock()
            if now - self._last_draw >= BAR_REFRESH_S:
                self._draw(now)

    def restart(self) -> None:
        """Start the clock now: what came before (vLLM's import) is not the items' work.

        The estimate of the time left divides the time since the start by the items
        done; counted from before a 90 s import, the first item promised hours.
        """
        self.started = self._last_line_at = self.clock()
        self._last_line_done = self.done
        self.current = ""

    def echo(self, text: str, stream: TextIO | None = None) -> None:
        """Print a line of the command's own output without tearing the bar."""
        out = stream or sys.stdout
        if self._bar_shown:
            self._clear()
        print(text, file=out, flush=True)
        if self.mode == "bar" and not self._closed and self.done:
            self._draw(self.clock())

    def close(self) -> None:
        """Finish: the bar is cleared, the lines end with a summary line."""
        if self._closed:
            return
        self._closed = True
        if self.mode == "bar" and self._bar_shown:
            self._clear()
        elif self.mode == "lines" and self.done and self.done != self._last_line_done:
            self._line(self.clock())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rendering ------------------------------------------------------------------

    def summary(self, now: float | None = None) -> str:
        """``12/40 (30%), 3.1 s elapsed, about 7 s left; 1 failed, 11 passed``."""
        now = self.clock() if now is None else now
        elapsed = now - self.started
        if self.total:
            text = f"{self.done}/{self.total} {self.label} ({100 * self.done // self.total}%)"
        else:
            text = f"{self.done} {self.label}"
        text += f", {_duration(elapsed)} elapsed"
        left = self._eta(elapsed)
        if left is not None:
            text += f", about {_duration(left)} left"
        tallies = self._tallies()
        return f"{text}; {tallies}" if tallies else text

    def _eta(self, elapsed: float) -> float | None:
        if not self.total or not self.done or self.done >= self.total:
            return None
        return elapsed / self.done * (self.total - self.done)

    def _tallies(self) -> str:
        loud = sorted((k for k in self.tally if k not in QUIET_TALLIES), key=str)
        quiet = [k for k in QUIET_TALLIES if k in self.tally]
        return ", ".join(f"{self.tally[k]} {k}" for k in [*loud, *quiet])

    def _line(self, now: float) -> None:
        print(f"progress: {self.summary(now)}", file=self.stream, flush=True)
        self._last_line_at = now
        self._last_line_done = self.done

    def _columns(self) -> int:
        if self.width is not None:
            return self.width
        return shutil.get_terminal_size((100, 20)).columns

    def _draw(self, now: float) -> None:
        columns = self._columns()
        elapsed = now - self.started
        if self.total:
            fraction = min(1.0, self.done / self.total)
            cells = 24
            filled = int(fraction * cells)
            bar = "#" * filled + "-" * (cells - filled)
            text = f"[{bar}] {self.done}/{self.total} {self.label}"
        else:
            text = f"{self.done} {self.label}"
        text += f" {_duration(elapsed)}"
        left = self._eta(elapsed)
        if left is not None:
            text += f" (~{_duration(left)} left)"
        tallies = self._tallies()
        if tallies:
            text += f" | {tallies}"
        if self.current:
            text += f" | {self.current}"
        text = text[: max(10, columns - 1)]
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()
        self._bar_shown = True
        self._last_draw = now

    def _clear(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()
        self._bar_shown = False


def resolve_mode(mode: str | None, stream: TextIO, elsewhere: str = "lines") -> str:
    """``auto`` (or nothing) becomes ``bar`` on a terminal and ``elsewhere`` (``lines``)
    elsewhere; a command whose own output already shows progress passes ``off``."""
    mode = mode or os.environ.get(ENV_MODE) or "auto"
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: use one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    isatty = getattr(stream, "isatty", None)
    return (
        "bar" if isatty is not None and isatty() and os.environ.get("TERM") != "dumb" else elsewhere
    )


def open_progress(
    total: int | None,
    label: str,
    *,
    mode: str | None = None,
    stream: TextIO | None = None,
    every_items: int = 25,
    every_seconds: float = 10.0,
    elsewhere: str = "lines",
) -> Progress:
    """A :class:`Progress` on ``stream`` (stderr by default) in the mode that fits it."""
    stream = stream or sys.stderr
    return Progress(
        total,
        label,
        stream,
        resolve_mode(mode, stream, elsewhere),
        every_items=every_items,
        every_seconds=every_seconds,
    )


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress MODE`` for any subcommand that runs long."""
    parser.add_argument(
        "--progress",
        choices=MODES,
        default=None,
        help="progress display on stderr: a bar on a terminal, a line every 25 items or 10 s "
        f"elsewhere (auto, the default; ${ENV_MODE} sets it too)",
    )
