"""Progress: a bar redrawn in place on a terminal, periodic plain lines in a CI log."""

from __future__ import annotations

import io

import pytest

from kvconform.fronts.progress import Progress, open_progress, resolve_mode


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_mode_follows_the_stream(monkeypatch):
    monkeypatch.delenv("KVCONFORM_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert resolve_mode(None, Terminal()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "lines"
    monkeypatch.setenv("KVCONFORM_PROGRESS", "off")
    assert resolve_mode(None, Terminal()) == "off"
    with pytest.raises(ValueError, match="progress mode"):
        resolve_mode("fancy", Terminal())


def test_lines_every_n_items_and_a_final_line():
    out, clock = io.StringIO(), Clock()
    with Progress(10, "scenarios", out, "lines", every_items=4, clock=clock) as progress:
        for i in range(10):
            clock.now += 0.5
            progress.advance(tally="failed" if i == 2 else "passed")
    lines = out.getvalue().splitlines()
    assert lines == [
        "progress: 4/10 scenarios (40%), 2 s elapsed, about 3 s left; 1 failed, 3 passed",
        "progress: 8/10 scenarios (80%), 4 s elapsed, about 1 s left; 1 failed, 7 passed",
        "progress: 10/10 scenarios (100%), 5 s elapsed; 1 failed, 9 passed",
    ]
    assert "\r" not in out.getvalue()


def test_lines_every_n_seconds_when_items_are_slow():
    out, clock = io.StringIO(), Clock()
    progress = Progress(
        100, "examples", out, "lines", every_items=50, every_seconds=10, clock=clock
    )
    for _ in range(3):
        clock.now += 6
        progress.advance()
    # 6 s: nothing yet; 12 s: a line; 18 s: only 6 s since that line.
    assert out.getvalue().splitlines() == [
        "progress: 2/100 examples (2%), 12 s elapsed, about 9 min 48 s left"
    ]


def test_bar_redraws_in_place_and_echo_keeps_it_intact():
    err, out, clock = Terminal(), io.StringIO(), Clock()
    progress = Progress(4, "scenarios", err, "bar", clock=clock, width=120)
    progress.start_item("first")
    assert err.getvalue() == "\r[------------------------] 0/4 scenarios 0 s | first\x1b[K"
    clock.now += 1
    progress.advance(tally="passed")
    frame = err.getvalue().split("\r")[-1]
    assert (
        frame == "[######------------------] 1/4 scenarios 1 s (~3 s left) | 1 passed | first\x1b[K"
    )
    before = err.getvalue()
    progress.echo("FAILED   second", stream=out)
    # The bar line is cleared before the output and drawn again after it.
    assert err.getvalue()[len(before) :].startswith("\r\x1b[K\r[")
    assert out.getvalue() == "FAILED   second\n"
    clock.now += 0.01  # too soon to redraw
    drawn = err.getvalue()
    progress.advance(tally="failed")
    assert err.getvalue() == drawn
    clock.now += 1
    progress.advance(2, tally="passed")  # the last items always draw
    assert "4/4 scenarios" in err.getvalue() and "1 failed, 3 passed" in err.getvalue()
    progress.close()
    assert err.getvalue().endswith("\r\x1b[K")


def test_bar_fits_the_terminal_width():
    err = Terminal()
    progress = Progress(3, "scenarios", err, "bar", clock=Clock(), width=40)
    progress.advance(current="a-very-long-scenario-name[with-matrix-params-k3]")
    line = err.getvalue().split("\r")[-1].removesuffix("\x1b[K")
    assert len(line) == 39


def test_off_prints_nothing_but_echo():
    err, out = io.StringIO(), io.StringIO()
    with open_progress(2, "scenarios", mode="off", stream=err) as progress:
        progress.advance()
        progress.echo("hello", stream=out)
        progress.advance()
    assert err.getvalue() == "" and out.getvalue() == "hello\n"


def test_unknown_total_counts_without_percent():
    out, clock = io.StringIO(), Clock()
    with Progress(None, "examples", out, "lines", every_items=2, clock=clock) as progress:
        progress.advance(2)
    assert out.getvalue() == "progress: 2 examples, 0 s elapsed\n"
