"""What a probe's result depends on, named by one digest.

A probe runs the selected scenarios against one vLLM. Its result is reused
(cached) only when everything else is the same: the scenario files (their
bytes, not their names), the ``-k`` expression, kvconform's own source (its
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
from kvconform.harness.loader import load_paths
from kvconform.harness.select import compile_expression
from kvconform.oracles.vllm_compat import installed_version


@dataclass(frozen=True)
class Selection:
    paths: tuple[str, ...]  # absolute, so that a probe may run in any folder
    expression: str | None
    scenario_ids: tuple[str, ...]
    digest: str

    def check_args(self) -> list[str]:
        """The selection as arguments of ``kvconform check``."""
        return [*self.paths, *(["-k", self.expression] if self.expression else [])]


def select(paths: list[str], expression: str | None, default: str = "scenarios") -> Selection:
    chosen = paths or [default]
    for path in chosen:
        if not Path(path).exists():
            raise UsageError(f"no such file or folder: {path}")
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
    digest.update(json.dumps([expression, kvconform_digest(), installed_version()]).encode())
    return Selection(
        tuple(str(Path(p).resolve()) for p in chosen),
        expression,
        tuple(s.id for s in scenarios),
        digest.hexdigest(),
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
