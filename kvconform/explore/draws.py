"""The explorer's drawing primitives: cached Hypothesis strategies for integers and choices
(building a strategy per draw costs more than the draw), and the one ceiling division the
strategies share. Shared by :mod:`kvconform.explore.strategies` and
:mod:`kvconform.explore.requests`."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from hypothesis import strategies as st

DrawFn = Callable[[st.SearchStrategy[Any]], Any]

BOOLS = st.booleans()


@cache
def ints(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@cache
def one_of(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(options)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
