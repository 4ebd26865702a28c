"""Every exception class of kvconform is defined in kvconform/errors.py.

errors.py is at the bottom of the layers (pyproject.toml's import contracts), so
every layer can raise and catch what it defines; an exception class defined in
some other module is a second place to look for what kvconform raises. The scan
walks the syntax of every module of kvconform/ (nested classes included) and
follows bases through the classes it finds, so a class deriving from a class
deriving from ``Exception`` counts too.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ERRORS = "kvconform/errors.py"

def _base_names(node: ast.ClassDef) -> set[str]:
    """The last word of each base: ``Exception``, ``errors.KvconformError`` -> ``KvconformError``."""
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    return names


def exception_classes(sources: dict[str, str]) -> set[tuple[str, str]]:
    """``(file, class)`` for every class of ``sources`` (file -> text) deriving, through any
    chain of classes of ``sources``, from a built-in exception."""
    classes = [
        (file, node.name, _base_names(node))
        for file, text in sources.items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ClassDef)
    ]
    exceptions = {
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    found: set[tuple[str, str]] = set()
    while True:
        more = {(f, name) for f, name, bases in classes if bases & exceptions} - found
        if not more:
            return found
        found |= more
        exceptions |= {name for _, name in more}


def _kvconform_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "kvconform").rglob("*.py"))
    }


def test_every_exception_class_is_defined_in_errors_py() -> None:
    outside = {(f, c) for f, c in exception_classes(_kvconform_sources()) if f != ERRORS}
    assert outside == set(), (
        f"exception classes defined outside {ERRORS}; define them there (it is importable "
        f"from every layer): {sorted(outside)}"
    )


def test_errors_py_defines_the_moved_classes() -> None:
    inside = {c for f, c in exception_classes(_kvconform_sources()) if f == ERRORS}
    # The classes this rule moved into errors.py (issue 33), and its own base.
    assert {
        "KvconformError",
        "Abandoned",
        "OverBudget",
        "CheckSkipped",
        "ExpectationsUpdateError",
        "GeneratorBug",
        "BisectAborted",
        "PatchFailed",
        "ScenarioFailed",
    } <= inside


def test_the_scan_sees_an_exception_class_anywhere() -> None:
    # The scan must be able to fail: directly, through a chain, nested, by attribute.
    sources = {
        "kvconform/errors.py": "class KvconformError(Exception):\n    pass\n",
        "kvconform/a.py": (
            "from kvconform import errors\n"
            "class Direct(RuntimeError):\n    pass\n"
            "class Chained(Direct):\n    pass\n"
            "class ViaAttribute(errors.KvconformError):\n    pass\n"
            "def f():\n    class Nested(KeyError):\n        pass\n"
            "class Plain:\n    pass\n"
        ),
    }
    found = exception_classes(sources)
    assert found - {("kvconform/errors.py", "KvconformError")} == {
        ("kvconform/a.py", "Direct"),
        ("kvconform/a.py", "Chained"),
        ("kvconform/a.py", "ViaAttribute"),
        ("kvconform/a.py", "Nested"),
    }
