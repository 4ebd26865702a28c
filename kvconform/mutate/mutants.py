"""Mutants of one vLLM function, made with cosmic-ray's operators.

kvconform writes no mutation operator of its own: every mutant is one
application of one of cosmic-ray's core operators (``core/ReplaceBinaryOperator_Add_Sub``,
``core/NumberReplacer``, ``core/ReplaceComparisonOperator_Lt_LtE``, ``core/AddNot``, ...)
at one of the places its ``mutation_positions`` names, exactly as cosmic-ray's own
``MutationVisitor`` applies it (docs/mutation.md says why cosmic-ray and not mutmut).

What kvconform adds is the scope. A target is one function (or method), so the
function's source -- decorators, signature and body -- is parsed on its own
(dedented), and the occurrence of an operator is counted inside that function
only. A mutant's id, ``module:function:operator:occurrence``, therefore survives
any edit elsewhere in the file (an unrelated line shift does not renumber it),
which is what the equivalents file needs.

Where a mutation lands decides how it can run:

* ``body``: the function's code object changes and nothing else; a forked
  child swaps ``__code__`` (:mod:`kvconform.oracles.vllm.mutation`).
* ``signature`` (a parameter default): evaluated once, when ``def`` runs; the
  child evaluates the mutated defaults in the function's globals and assigns
  ``__defaults__`` / ``__kwdefaults__``.
* ``decorator``: applied once, at import; neither swap can express it, so it
  runs in a fresh process against a copy of vLLM's tree with the mutated file.
* annotations are not mutated: they are type hints, evaluated at most once
  when ``def`` runs and never read by the allocator (cosmic-ray itself skips
  variable annotations; kvconform extends that to parameter and return
  annotations).

A target may name ``focus`` identifiers: then only mutation points in
statements that mention one of them are kept (``warmup_kernels``' block
arithmetic inside a function that also builds sampling parameters; the
lookahead lines of ``Scheduler.schedule``).
"""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import parso
from cosmic_ray.ast import Visitor, ast_nodes
from cosmic_ray.plugins import get_operator, operator_names

# Operators that need arguments (VariableReplacer, VariableInserter: which variable,
# with a random constant) are not drawn; NoOp is cosmic-ray's baseline run, not a mutant.
_NEEDS_ARGUMENTS = ("core/VariableReplacer", "core/VariableInserter")

_COMPOUND = {"if_stmt", "while_stmt", "for_stmt", "with_stmt", "try_stmt"}


@cache
def default_operators() -> tuple[str, ...]:
    """Every cosmic-ray core operator that builds with no argument."""
    return tuple(name for name in operator_names() if name not in _NEEDS_ARGUMENTS)


@cache
def _operator(name: str) -> Any:
    return get_operator(name)()


@dataclass(frozen=True)
class Mutant:
    """One application of one operator at one place in one target function."""

    module: str
    function: str
    operator: str
    occurrence: int  # among this operator's places in this function, in cosmic-ray's walk order
    line: int  # in the module's file
    column: int
    end_line: int
    end_column: int
    region: str  # body | signature | decorator
    original: str = field(compare=False)  # the mutated line(s) before ...
    replacement: str = field(compare=False)  # ... and after

    @property
    def id(self) -> str:
        return f"{self.module}:{self.function}:{self.operator}:{self.occurrence}"

    @property
    def swappable(self) -> bool:
        """Runs on the fast path: a body's code swap, or a signature's defaults assigned."""
        return self.region in ("body", "signature")


@dataclass(frozen=True)
class FunctionSource:
    """A target function's text inside its module's file."""

    module: str
    function: str
    path: str
    module_text: str
    first_line: int  # 1-based, decorators included
    last_line: int
    indent: str

    @property
    def lines(self) -> list[str]:
        return self.module_text.splitlines(keepends=True)[self.first_line - 1 : self.last_line]

    @property
    def dedented(self) -> str:
        return textwrap.dedent("".join(self.lines))

    def splice(self, function_text: str) -> str:
        """The module's text with the function's lines replaced by ``function_text``."""
        lines = self.module_text.splitlines(keepends=True)
        body = [
            (self.indent + line) if line.strip() else line
            for line in function_text.splitlines(keepends=True)
        ]
        return "".join(lines[: self.first_line - 1] + body + lines[self.last_line :])


def find_function(module: str, function: str, path: str, text: str) -> FunctionSource | None:
    """Where ``function`` (``Class.method`` or ``name``) is defined in ``text``; None if not."""
    tree = parso.parse(text)
    parts = function.split(".")
    scope: Any = tree
    node: Any = None
    for i, part in enumerate(parts):
        found = None
        for child in _definitions(scope):
            if child.name.value == part:
                found = child
        if found is None:
            return None
        node = found
        if i < len(parts) - 1:
            if found.type != "classdef":
                return None
            scope = found
    if node is None or node.type != "funcdef":
        return None
    outer = node.parent if node.parent.type == "decorated" else node
    start = outer.start_pos[0]
    # end_pos of a suite lies after its last newline: the last line of the function is before.
    end_line, end_col = outer.end_pos
    last = end_line if end_col > 0 else end_line - 1
    first_text = text.splitlines()[start - 1]
    indent = first_text[: len(first_text) - len(first_text.lstrip())]
    return FunctionSource(module, function, path, text, start, last, indent)


def _definitions(scope: Any) -> Iterator[Any]:
    """The classes and functions defined directly in ``scope`` (a module or class)."""
    body = scope if scope.type == "file_input" else scope.children[-1]
    for child in getattr(body, "children", []):
        if child.type == "decorated":
            child = child.children[-1]
        if child.type in ("classdef", "funcdef"):
            yield child
        elif child.type in ("if_stmt", "try_stmt"):  # definitions under `if TYPE_CHECKING:` etc.
            for sub in child.children:
                if sub.type == "suite":
                    yield from _definitions_in_suite(sub)


def _definitions_in_suite(suite: Any) -> Iterator[Any]:
    for child in suite.children:
        if child.type == "decorated":
            child = child.children[-1]
        if child.type in ("classdef", "funcdef"):
            yield child


def _region(node: Any, funcdef: Any) -> str | None:
    """``body``, ``signature`` or ``decorator``; None where nothing runs (not mutated).

    In the signature only parameter defaults run (once, at ``def``); annotations,
    the bare ``*`` and the parentheses are no behaviour (cosmic-ray's binary-operator
    check takes a bare ``*`` for a product).
    """
    defaults = {id(p.default) for p in funcdef.get_params() if p.default is not None}
    current = node
    while current is not None and current is not funcdef:
        if id(current) in defaults:
            return "signature"
        parent = current.parent
        if parent is None:
            break
        if current.type == "decorator" or (parent.type == "decorated" and current is not funcdef):
            return "decorator"
        if parent is funcdef and current.type != "suite":
            return None  # the name, the parameters outside defaults, the return annotation
        current = parent
    return "body"


def _statement_text(node: Any) -> str:
    """The statement (or compound statement's header) a mutation point belongs to."""
    if node.type in _COMPOUND:
        return str(node.children[1].get_code())
    current = node
    while current.parent is not None:
        if current.type == "simple_stmt":
            return str(current.get_code())
        if current.parent.type in _COMPOUND and current.type != "suite":
            return str(current.get_code())
        current = current.parent
    return str(node.get_code())


def _funcdef_of(tree: Any) -> Any:
    for child in tree.children:
        if child.type == "decorated":
            return child.children[-1]
        if child.type == "funcdef":
            return child
    raise ValueError("no function in the text")


def enumerate_mutants(
    source: FunctionSource,
    operators: Sequence[str] | None = None,
    focus: Sequence[str] = (),
) -> list[Mutant]:
    """Every mutant of ``source`` the operators make (in focus, if ``focus`` is given)."""
    text = source.dedented
    tree = parso.parse(text)
    funcdef = _funcdef_of(tree)
    focus_re = re.compile(r"\b(" + "|".join(map(re.escape, focus)) + r")\b") if focus else None
    text_lines = text.splitlines()
    offset = source.first_line - 1
    shift = len(source.indent)
    mutants: list[Mutant] = []
    nodes = list(ast_nodes(tree))
    for name in operators or default_operators():
        operator = _operator(name)
        occurrence = 0
        for node in nodes:
            for start, end in operator.mutation_positions(node):
                this = occurrence
                occurrence += 1
                region = _region(node, funcdef)
                if region is None:
                    continue
                if focus_re is not None and not focus_re.search(_statement_text(node)):
                    continue
                mutants.append(
                    Mutant(
                        source.module,
                        source.function,
                        name,
                        this,
                        start[0] + offset,
                        start[1] + shift,
                        end[0] + offset,
                        end[1] + shift,
                        region,
                        original="\n".join(text_lines[start[0] - 1 : end[0]]),
                        replacement="",
                    )
                )
    return mutants


class _ApplyOne(Visitor):
    """cosmic-ray's MutationVisitor, counting occurrences inside one function's text."""

    def __init__(self, operator: Any, occurrence: int) -> None:
        self.operator = operator
        self.occurrence = occurrence
        self.count = 0
        self.applied = False

    def visit(self, node: Any) -> Any:
        for index, _ in enumerate(self.operator.mutation_positions(node)):
            if self.count == self.occurrence:
                self.applied = True
                mutated = self.operator.mutate(node, index)
                if mutated is not None and mutated is not node and hasattr(node, "prefix"):
                    # NumberReplacer's new leaf has the prefix " ", which pulls a number
                    # written at the start of a line up onto the previous one: keep the
                    # original whitespace, so that the file keeps its line numbers.
                    mutated.prefix = node.prefix
                    if isinstance(getattr(mutated, "value", None), str):
                        mutated.value = mutated.value.lstrip()  # its value is " 2"
                node = mutated
            self.count += 1
        return node


def mutated_function_text(source: FunctionSource, mutant: Mutant) -> str:
    """The function's text (dedented) with ``mutant`` applied."""
    tree = parso.parse(source.dedented)
    visitor = _ApplyOne(_operator(mutant.operator), mutant.occurrence)
    mutated = visitor.walk(tree)
    if not visitor.applied:
        raise ValueError(f"{mutant.id}: no such occurrence in {source.function}")
    return str(mutated.get_code())


def mutated_module_text(source: FunctionSource, mutant: Mutant) -> str:
    """The module's text with ``mutant`` applied to its function."""
    return source.splice(mutated_function_text(source, mutant))


def default_sources(function_text: str) -> tuple[list[str], dict[str, str]]:
    """The source of each parameter default: positional ones in order, keyword-only by name.

    The shapes of ``__defaults__`` and ``__kwdefaults__``: a ``signature`` mutant runs on
    the fast path by evaluating these in the function's globals and assigning them.
    """
    funcdef = _funcdef_of(parso.parse(function_text))
    positional: list[str] = []
    keyword: dict[str, str] = {}
    after_star = False
    for child in funcdef.children[2].children:
        if child.type == "operator" and child.value == "*":
            after_star = True
        elif child.type == "param":
            if child.star_count == 1:
                after_star = True
            elif child.default is not None:
                code = str(child.default.get_code()).strip()
                if after_star:
                    keyword[child.name.value] = code
                else:
                    positional.append(code)
    return positional, keyword


def unified_diff(source: FunctionSource, mutated: str) -> str:
    before = source.module_text.splitlines()
    after = mutated.splitlines()
    return "\n".join(
        difflib.unified_diff(
            before,
            after,
            fromfile=f"a/{source.module.replace('.', '/')}.py",
            tofile=f"b/{source.module.replace('.', '/')}.py",
            lineterm="",
            n=1,
        )
    )


def replacement_text(source: FunctionSource, mutated: str, mutant: Mutant) -> str:
    """The mutated line(s), for a report row."""
    shift = mutated.count("\n") - source.module_text.count("\n")
    lines = mutated.splitlines()
    return "\n".join(lines[mutant.line - 1 : mutant.end_line + shift]).strip()
