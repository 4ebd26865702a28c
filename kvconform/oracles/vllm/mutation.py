"""What a mutation campaign does to vLLM's live objects: find a function, swap its code, see who calls it.

``kvconform mutate`` (:mod:`kvconform.mutate`) imports vLLM once and runs each
mutant in a forked child that replaces the ``__code__`` of one vLLM function
with a compiled mutated version. Every reference to the function object -- the
class attribute, ``from ... import`` copies in other vLLM modules, kvconform's
own oracles -- then runs the mutant, with no re-import. This module is the part
of that which touches vLLM objects, so it lives among the oracles:

* :func:`resolve_function` finds the plain function object behind a dotted
  qualname, looking through what wraps it: ``@property`` (its ``fget``),
  ``staticmethod`` / ``classmethod``, ``functools.cached_property`` and
  decorators that keep ``__wrapped__`` (``@torch.inference_mode()``).
* :func:`compiled_function_code` compiles a mutated module's source with the
  original file name and picks the code object of the function by its
  ``co_qualname``, so tracebacks and line numbers stay those of vLLM's file.
* :func:`swap_code` replaces the code, refusing (:class:`SwapImpossible`) when
  the mutant's free variables differ from the closure the function carries:
  such a mutant needs a fresh process with a mutated source tree.
  :func:`swap_defaults` does the same for parameter defaults.
* :class:`ReachRecorder` notes, during one clean run, which target code
  objects each scenario calls, so that a mutant runs only the scenarios that
  reach its function. It is a ``sys.settrace`` function that sees each Python
  call and returns None (no line events): 2.3x the corpus' time on 0.33.0,
  where ``sys.setprofile``, which also sees every C call, cost 30x.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvconform.errors import SwapImpossible, TargetMissing


def _unwrap(value: Any) -> Any:
    """The plain function inside the descriptors and decorators that carry it."""
    for _ in range(16):  # a chain of wrappers, never a cycle
        if isinstance(value, property):
            value = value.fget
        elif isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, functools.cached_property):
            value = value.func
        elif isinstance(value, types.MethodType):
            value = value.__func__
        elif hasattr(value, "__wrapped__"):
            value = value.__wrapped__
        else:
            break
    return value


def resolve_function(module: str, qualname: str) -> types.FunctionType:
    """The function object ``module.qualname`` (``Class.method`` or ``function``)."""
    try:
        owner: Any = importlib.import_module(module)
    except ImportError as exc:
        raise TargetMissing(f"no module {module} ({exc})") from None
    value: Any = owner
    for part in qualname.split("."):
        namespace = getattr(value, "__dict__", {})
        if part in namespace:  # the raw descriptor, not what it returns
            value = namespace[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise TargetMissing(f"{module} has no {qualname} (no {part!r})")
        if part != qualname.split(".")[-1]:
            value = _unwrap(value) if not inspect.isclass(value) else value
    function = _unwrap(value)
    if not isinstance(function, types.FunctionType):
        raise TargetMissing(f"{module}.{qualname} is a {type(function).__name__}, not a function")
    if function.__code__.co_qualname != qualname:
        # An inherited method: the class does not define it, its base does.
        raise TargetMissing(
            f"{module}.{qualname} is inherited ({function.__code__.co_qualname}); "
            "name the class that defines it"
        )
    return function


def _find_code(code: types.CodeType, qualname: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            found = _find_code(const, qualname)
            if found is not None:
                return found
    return None


def compiled_function_code(source: str, filename: str, qualname: str) -> types.CodeType:
    """The code object of ``qualname`` in ``source`` compiled as ``filename``.

    Raises ``SyntaxError`` (and whatever else ``compile`` raises) for a mutant
    that does not compile, and :class:`SwapImpossible` when the function is
    not in the compiled module any more.
    """
    module_code = compile(source, filename, "exec", dont_inherit=True)
    found = _find_code(module_code, qualname)
    if found is None:
        raise SwapImpossible(f"{qualname} is not in the mutated module")
    return found


def swap_code(function: types.FunctionType, code: types.CodeType) -> None:
    """Give ``function`` the mutated ``code``: every caller of the object runs it."""
    if code.co_freevars != function.__code__.co_freevars:
        raise SwapImpossible(
            f"free variables change ({function.__code__.co_freevars} -> {code.co_freevars})"
        )
    function.__code__ = code


def swap_defaults(
    function: types.FunctionType, positional: Sequence[str], keyword: dict[str, str]
) -> None:
    """Give ``function`` the defaults written in ``positional`` / ``keyword`` (source text).

    A parameter default is evaluated when ``def`` runs; evaluating the mutated
    expression in the function's globals and assigning it is what a fresh
    import would have done.
    """
    old_keyword = function.__kwdefaults__ or {}
    if len(positional) != len(function.__defaults__ or ()) or set(keyword) != set(old_keyword):
        raise SwapImpossible("the mutant changes which parameters have defaults")
    scope = function.__globals__
    function.__defaults__ = tuple(eval(text, scope) for text in positional) or None
    function.__kwdefaults__ = {name: eval(text, scope) for name, text in keyword.items()} or None


def add_globals(function: types.FunctionType, names: dict[str, Any]) -> None:
    """Names a mutant's code refers to that vLLM's module lacks (set in a forked child only)."""
    for name, value in names.items():
        function.__globals__.setdefault(name, value)


class ReachRecorder:
    """Which of a set of code objects the code inside :meth:`recording` calls."""

    def __init__(self, codes: dict[types.CodeType, str]) -> None:
        self.codes = codes  # code object -> the target's key
        self.reached: set[str] = set()

    def _trace(self, frame: types.FrameType, event: str, arg: object) -> None:
        key = self.codes.get(frame.f_code)  # settrace's global function sees only 'call'
        if key is not None:
            self.reached.add(key)
        return None  # no local tracing of the frame

    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        self.reached = set()
        previous = sys.gettrace()
        sys.settrace(self._trace)
        try:
            yield self.reached
        finally:
            sys.settrace(previous)
