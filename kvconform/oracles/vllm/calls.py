"""Calling into vLLM across releases whose signatures differ.

Releases add, drop and reorder keyword arguments (``KVCacheManager`` gains
``num_hash_lookahead_tokens`` in 0.33, ``allocate_slots`` gains
``skip_zeroing_group_ids`` in 0.32), so every call into vLLM passes everything by
keyword through :func:`call`, which keeps only the keywords the callee's signature
accepts. The signatures are read once per callee.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import typing
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["call", "flatten_literal", "quiet_logs"]


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING) -> Iterator[None]:
    """Silence vLLM's advice while it builds configurations for a harness run (records
    at ``level`` and below; ``logging.ERROR`` for what a scenario states will go wrong)."""
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def flatten_literal(literal: Any) -> list[str]:
    names: list[str] = []
    for arg in typing.get_args(literal):
        if isinstance(arg, str):
            names.append(arg)
        else:
            names.extend(flatten_literal(arg))
    return names


def call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts."""
    accepted = _accepted_keywords(fn)
    if accepted is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return fn(**kwargs)


_SIGNATURES: dict[Any, frozenset[str] | None] = {}


def _accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    key = getattr(fn, "__func__", fn)
    if key not in _SIGNATURES:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            _SIGNATURES[key] = None
        else:
            if any(p.kind is p.VAR_KEYWORD for p in params):
                _SIGNATURES[key] = None
            else:
                _SIGNATURES[key] = frozenset(
                    p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                )
    return _SIGNATURES[key]
