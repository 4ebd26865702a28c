"""What a probe's result depends on, named by one digest.

A probe runs the selected scenarios against one vLLM with the selected checks. Its
result is reused (cached) only when everything else is the same: the scenario files
(their bytes, not their names), the ``-k`` expression, the checks, the expectations
file applied (the nearest ``expectations.yaml``, as for ``run``, unless told
otherwise), the methods file (the nearest ``methods.yaml``), kvconform's own source (its
version and a digest of its Python files, so that a changed check invalidates
old results), and the installed vLLM, whose compiled parts and dependencies
stay under every tree. The scenarios are loaded here, in the parent process
and without vLLM, so that a bad path or a malformed file stops the bisection
before the first probe (exit 2) instead of aborting it later.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import kvconform
from kvconform.errors import UsageError
from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS, parse_checks
from kvconform.harness.loader import load_paths
from kvconform.harness.select import compile_expression
from kvconform.oracles.vllm import installed_version


@dataclass(frozen=True)
class Selection:
    paths: tuple[str, ...]  # absolute, so that a probe may run in any folder
    expression: str | None
    scenario_ids: tuple[str, ...]
    digest: str
    expectations: str | None = None  # absolute; None: no expectations file applies
    checks: tuple[str, ...] = DEFAULT_CHECKS

    def check_args(self) -> list[str]:
        """The selection as arguments of ``kvconform check``."""
        expectations = (
            ["--expectations", self.expectations] if self.expectations else ["--no-expectations"]
        )
        return [
            *self.paths,
            *(["-k", self.expression] if self.expression else []),
            *self.checks_args(),
            *expectations,
        ]

    def checks_args(self) -> list[str]:
        """``--checks LIST`` unless the checks are the default ones."""
        if self.checks == DEFAULT_CHECKS:
            return []
        return ["--checks", "all" if self.checks == tuple(CHECKS) else ",".join(self.checks)]


def select(
    paths: list[str],
    expression: str | None,
    expectations: str | None = None,
    no_expectations: bool = False,
    default: str = "scenarios",
    checks: str | None = None,
) -> Selection:
    """The scenarios a bisection runs, the checks, and the expectations and methods files
    it applies, as ``run`` would."""
    from kvconform.harness.expectations import find_expectations
    from kvconform.harness.methods_file import use_methods_for

    try:
        chosen_checks = parse_checks(checks)
    except ValueError as exc:
        raise UsageError(f"--checks: {exc}") from None
    chosen = paths or [default]
    for path in [*chosen, *([expectations] if expectations else [])]:
        if not Path(path).exists():
            raise UsageError(f"no such file or folder: {path}")
    known: Path | None = None
    if not no_expectations:
        known = Path(expectations) if expectations else find_expectations(chosen)
    methods_file, methods_error = use_methods_for(chosen)
    if methods_error is not None:
        raise UsageError(f"{methods_error}; fix the methods file before bisecting")
    loaded = load_paths(chosen)
    if loaded.errors:
        more = f" (and {len(loaded.errors) - 1} more)" if len(loaded.errors) > 1 else ""
        raise UsageError(f"{loaded.errors[0]}{more}; fix the scenarios before bisecting")
    scenarios = loaded.scenarios
    if expression:
        matches = compile_expression(expression)
        scenarios = [s for s in scenarios if matches(s)]
    if not scenarios:
        raise UsageError("no scenario selected: nothing to bisect on")
    files = sorted({str(Path(s.file).resolve()) for s in scenarios})
    digest = hashlib.sha256()
    for name in files:
        digest.update(hashlib.sha256(Path(name).read_bytes()).digest())
    for extra in (known, methods_file):
        if extra is not None:
            digest.update(extra.read_bytes())
    digest.update(
        json.dumps([expression, chosen_checks, kvconform_digest(), installed_version()]).encode()
    )
    return Selection(
        tuple(str(Path(p).resolve()) for p in chosen),
        expression,
        tuple(s.id for s in scenarios),
        digest.hexdigest(),
        str(known.resolve()) if known is not None else None,
        chosen_checks,
    )


@cache
def kvconform_digest() -> str:
    """kvconform's version and a digest of its Python source."""
    root = Path(kvconform.__file__).parent
    digest = hashlib.sha256(kvconform.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{kvconform.__version__}+{digest.hexdigest()[:12]}"


def bisect_key(**settings: object) -> str:
    """A short stable name for one bisection's settings."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
