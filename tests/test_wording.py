"""Counts in words and messages shortened: prose goes, figures stay."""

from __future__ import annotations

import re

from kvconform.model.wording import count, plural, shorten

FLOOR = (
    "step 7 (line 31, decode) request a, group 0 (full_attention): the live KVCacheManager "
    "holds 6 blocks, below the floor of 33 = cdiv(min(512 + 1 + 3, 1024), 16); the drafter's "
    "positions 96..99 have no block (why: one column per block_size tokens up to the last "
    "position the target or the drafter writes, never past max_model_len)"
)


def figures(text: str) -> list[str]:
    return re.findall(r"\d+", text)


def test_counts_say_one_in_the_singular():
    assert count(1, "scenario") == "1 scenario" and count(2, "scenario") == "2 scenarios"
    assert count(1, "input error") == "1 input error" and count(0, "input error") == "0 input errors"
    assert count(1204, "record") == "1,204 records"
    assert plural(2, "entry") == "entries" and plural(3, "pass") == "passes"
    assert plural(2, "day") == "days" and plural(1, "was") == "was" and plural(2, "was") == "were"


def test_shorten_drops_prose_and_keeps_every_figure():
    short = shorten(FLOOR, 200)
    assert len(short) <= 200, short
    assert figures(short) == figures(FLOOR)
    assert "below the floor of 33 = cdiv(min(512 + 1 + 3, 1024), 16)" in short
    assert "why:" not in short
    # Asides with figures stay; a text that fits is left alone (its spaces folded).
    assert shorten("a  (b 1) c", 80) == "a (b 1) c"


def test_shorten_never_cuts_through_a_figure_even_past_the_limit():
    text = "holds 6 blocks, below the floor of 7 = cdiv(min(96 + 1 + 3, 1024), 16)"
    short = shorten(text, 30)
    assert figures(short) == figures(text) and short == text
    # A digitless tail goes at a clause boundary, marked.
    tailed = "holds 6 blocks, below the floor of 7; every other word here is prose, a lot of it"
    assert shorten(tailed, 50) == "holds 6 blocks, below the floor of 7 ..."
