"""Calling into vLLM across releases whose signatures differ.

Releases add, drop and reorder keyword arguments (``KVCacheManager`` gains
``num_hash_lookahead_tokens`` in 0.33, ``allocate_slots`` gains
``skip_zeroing_group_ids`` in 0.32), so every call into vLLM passes everything by
keyword through :func:`call`, which keeps only the keywords the callee's signature
accepts. The signatures are read once per callee.

``call_leaving_defaults`` also leaves out every argument whose value is the
default the callee declared when its signature was first read: a call that means "no
lookahead" leaves ``num_lookahead_tokens`` to ``allocate_slots``' own default, as
vLLM's own tests do. For clean vLLM that changes nothing; for a mutation campaign's
child, which reads the signature the clean run cached and runs a mutated default, it
is what reaches the default (a mutant of a default no scheduler call reads is still a
changed public API, and vLLM's own tests kill it).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import typing
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["accepts_keyword", "call", "call_leaving_defaults", "flatten_literal", "quiet_logs"]


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING) -> Iterator[None]:
    """Silence vLLM's advice while it builds configurations for a harness run (records
    at ``level`` and below; ``logging.ERROR`` for what a scenario states will go wrong)."""
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


class _BelowLevel(logging.Filter):
    """Drops records at ``level`` and below; installed once on the handlers vLLM's records
    reach, and raised and lowered by :func:`muted_vllm_logs` (a plain attribute, so
    entering and leaving costs nothing, where ``logging.disable`` clears the level cache of
    every logger each time)."""

    level = logging.NOTSET

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > self.level


_MUTE = _BelowLevel()


@contextlib.contextmanager
def muted_vllm_logs(level: int = logging.WARNING) -> Iterator[None]:
    """:func:`quiet_logs` for a call made at every step (the scheduler's
    ``update_from_output``): vLLM's records at ``level`` and below are dropped at the
    handlers they reach (vLLM's own logger's, the root's, the last resort), which are
    looked up on each entry so that a handler added since is muted too."""
    for handler in (
        *logging.getLogger("vllm").handlers,
        *logging.getLogger().handlers,
        logging.lastResort,
    ):
        if handler is not None and _MUTE not in handler.filters:
            handler.addFilter(_MUTE)
    before = _MUTE.level
    _MUTE.level = max(before, level)
    try:
        yield
    finally:
        _MUTE.level = before


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
    accepted, _ = _signature_of(fn)
    if accepted is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return fn(**kwargs)


def call_leaving_defaults(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """:func:`call`, without the arguments equal to the defaults ``fn`` declared when its
    signature was first read."""
    _, defaults = _signature_of(fn)
    kept = {k: v for k, v in kwargs.items() if not _is_declared_default(v, k, defaults)}
    return call(fn, **kept)


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes the keyword ``name`` (read once per callee, as :func:`call` does)."""
    accepted, _ = _signature_of(fn)
    return accepted is None or name in accepted


# Plain values only: a default is left to the callee when the value is the same thing.
_PLAIN = (bool, int, float, str, type(None))

_SIGNATURES: dict[Any, tuple[frozenset[str] | None, dict[str, Any]]] = {}


def _is_declared_default(value: Any, name: str, defaults: dict[str, Any]) -> bool:
    if name not in defaults or not isinstance(value, _PLAIN):
        return False
    default = defaults[name]
    return type(default) is type(value) and default == value


def _signature_of(fn: Callable[..., Any]) -> tuple[frozenset[str] | None, dict[str, Any]]:
    """The keywords ``fn`` accepts (None: any) and its plain declared defaults."""
    key = getattr(fn, "__func__", fn)
    if key not in _SIGNATURES:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            _SIGNATURES[key] = (None, {})
        else:
            defaults = {
                p.name: p.default
                for p in params
                if p.default is not p.empty and isinstance(p.default, _PLAIN)
            }
            if any(p.kind is p.VAR_KEYWORD for p in params):
                _SIGNATURES[key] = (None, defaults)
            else:
                keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                accepted = frozenset(p.name for p in params if p.kind in keywords)
                _SIGNATURES[key] = (accepted, defaults)
    return _SIGNATURES[key]
