"""Methods files: speculative methods declared beside the scenarios, without changing kvconform.

A vLLM developer adding a speculative method states its lookahead rule in a
``methods.yaml`` in their scenario tree (docs/adding-a-method.md)::

    - name: orbit                 # vLLM's canonical method name
      lookahead: k + 2            # k, k + N, k - N, M * k + N or N (k: num_speculative_tokens);
                                  # or {anchor: k, fill_in: k + 1} for DSpark's two layouts
      reason: the drafter writes two bonus queries past its k draft tokens
      draft: one-layer            # none | one-layer | an architecture of kvconform's tiny models

The file that applies to a scenario is found like ``expectations.yaml``: the
nearest ``methods.yaml`` at or above its file (the search stops at the
repository's root). Its entries join kvconform's built-in registry
(:func:`kvconform.model.methods.use_methods`) for that scenario; a name the
built-in registry already has, or one declared twice, is refused. Every problem
is an input error with its file, line and field (exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.yamlio import LineDict, load_yaml
from kvconform.model.methods import (
    BUILTIN_METHODS,
    METHODS_FILE,
    ONE_LAYER_DRAFT,
    REGISTRY_FILE,
    LookaheadRule,
    Method,
    rule_from_formula,
    use_methods,
)
from kvconform.model.tiny_model import ARCHITECTURES, TinyModel

__all__ = [
    "DRAFTS",
    "METHODS_FILE",
    "find_methods_file",
    "load_methods_file",
    "methods_in",
    "parse_methods",
    "use_methods_for",
]

FIELDS = ("name", "lookahead", "reason", "draft")
# `draft:` words besides an architecture: no draft folder, or the EAGLE-family draft.
DRAFTS = ("none", "one-layer")


def find_methods_file(paths: Sequence[str | Path]) -> Path | None:
    """The nearest methods.yaml at or above the first path (default ``scenarios``).

    The search stops at the repository's root (a folder holding ``.git``), as the
    search for ``expectations.yaml`` does.
    """
    start = Path(paths[0] if paths else "scenarios").resolve()
    for folder in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = folder / METHODS_FILE
        if candidate.is_file():
            return candidate
        if (folder / ".git").exists():
            break
    return None


def load_methods_file(path: str | Path) -> list[Method]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(Location(str(path)), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(Location(str(path)), "is not UTF-8") from None
    return parse_methods(text, str(path))


def parse_methods(text: str, file: str) -> list[Method]:
    """A methods file's entries as :class:`Method` records; :class:`ScenarioError` if wrong."""
    doc = load_yaml(text, file)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise ScenarioError(
            Location(file, 1),
            "a methods file is a list of entries (name, lookahead, reason, draft)",
        )
    builtin = {m.name for m in BUILTIN_METHODS}
    entries: list[Method] = []
    for index, item in enumerate(doc):
        line = doc.line_of(index) if hasattr(doc, "line_of") else None
        where = Location(file, line, f"[{index}]")
        if not isinstance(item, LineDict):
            raise ScenarioError(where, f"each entry is a mapping with {', '.join(FIELDS)}")

        def at(name: str, entry: LineDict = item, index: int = index) -> Location:
            return Location(file, entry.line_of(name), f"[{index}].{name}")

        unknown = sorted(set(item) - set(FIELDS))
        if unknown:
            raise ScenarioError(at(unknown[0]), f"unknown field (an entry has {', '.join(FIELDS)})")
        for name in FIELDS:
            if name not in item:
                raise ScenarioError(where.at(f"[{index}].{name}"), "missing")
        name = item["name"]
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ScenarioError(at("name"), "must be vLLM's method name, a non-empty string")
        if name in builtin:
            raise ScenarioError(
                at("name"),
                f"{name!r} is a built-in method of kvconform ({REGISTRY_FILE}); a methods "
                "file declares only methods the registry lacks",
            )
        earlier = next((m for m in entries if m.name == name), None)
        if earlier is not None:
            raise ScenarioError(at("name"), f"{name!r} is declared twice (first: {earlier.source})")
        reason = item["reason"]
        if not isinstance(reason, str) or len(reason.split()) < 3:
            raise ScenarioError(
                at("reason"), "say what the drafter writes past the scheduled range, in words"
            )
        try:
            rule = _rule(item["lookahead"], reason.strip())
        except ValueError as exc:
            raise ScenarioError(at("lookahead"), str(exc)) from None
        draft = _draft(item["draft"], at("draft"))
        entries.append(
            Method(
                name,
                rule,
                draft=draft,
                anchor_layouts=" (fill-in)" in rule.formula,
                source=f"{file}:{item.line or line}",
            )
        )
    return entries


def _rule(raw: Any, reason: str) -> LookaheadRule:
    if isinstance(raw, LineDict):
        if set(raw) != {"anchor", "fill_in"}:
            raise ValueError(
                "a formula, or {anchor: FORMULA, fill_in: FORMULA} (by sample_from_anchor)"
            )
        return rule_from_formula(reason, _formula(raw["anchor"]), _formula(raw["fill_in"]))
    return rule_from_formula(reason, _formula(raw))


def _formula(raw: Any) -> str:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    if isinstance(raw, str):
        return raw
    raise ValueError(f"{raw!r} is not a lookahead formula: write `k`, `k + 1`, `0`, ...")


def _draft(raw: Any, where: Location) -> TinyModel | None:
    if raw in (None, "none"):
        return None
    if raw == "one-layer":
        return ONE_LAYER_DRAFT
    if isinstance(raw, str) and raw in ARCHITECTURES:
        return TinyModel(
            raw,
            layers=1,
            vocab=ONE_LAYER_DRAFT.vocab,
            hidden_size=ONE_LAYER_DRAFT.hidden_size,
            intermediate_size=ONE_LAYER_DRAFT.intermediate_size,
            max_position_embeddings=ONE_LAYER_DRAFT.max_position_embeddings,
        )
    raise ScenarioError(
        where,
        f"{raw!r}: write none (the drafter has no model of its own), one-layer (a one-layer "
        f"copy of the target, as for EAGLE) or an architecture: {', '.join(ARCHITECTURES)} "
        "(a new one goes in kvconform/model/tiny_model.py)",
    )


@lru_cache(maxsize=32)
def _cached(path: str, mtime_ns: int) -> tuple[Method, ...]:
    """A file's entries, read once per version of the file (a session asks per scenario)."""
    return tuple(load_methods_file(path))


def methods_in(path: str | Path) -> tuple[Method, ...]:
    """The entries of a methods file (read once per version of it); ScenarioError if wrong."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise ScenarioError(Location(str(path)), f"cannot read: {exc.strerror}") from None
    return _cached(str(path), stamp)


def use_methods_for(
    paths: Sequence[str | Path], explicit: str | Path | None = None
) -> tuple[Path | None, ScenarioError | None]:
    """Make the registry the built-in entries plus the methods file that applies to
    ``paths`` (``explicit``, else the nearest one above the first path).

    Returns the file used (None: none applies) and its problem, if any: a file
    that does not load adds nothing, and the built-in registry alone is in use.
    """
    path = Path(explicit) if explicit is not None else find_methods_file(paths)
    if path is None:
        use_methods(())
        return None, None
    try:
        entries = methods_in(path)
    except ScenarioError as error:
        use_methods(())
        return path, error
    use_methods(entries)
    return path, None
