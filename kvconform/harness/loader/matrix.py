"""A scenario's ``matrix``: one scenario per combination of the values it lists.

Each key lands in its section of the document (``MATRIX_KEYS``) and shows in
the scenario id (``name[eagle-k3]``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.budget import check_count
from kvconform.harness.loader.fields import suggestion
from kvconform.harness.yamlio import LineDict

# Matrix keys, where each lands in the document, and how it shows in the id.
MATRIX_KEYS: dict[str, tuple[str, str]] = {
    "method": ("speculative", ""),
    "num_speculative_tokens": ("speculative", "k"),
    "num_lookahead_tokens": ("speculative", "la"),
    "sample_from_anchor": ("speculative", "anchor"),
    "block_size": ("model", "bs"),
    "max_model_len": ("model", "len"),
    "num_blocks": ("model", "pool"),
    "max_encoder_len": ("model", "enc"),
    "enable_caching": ("model", "cache"),
    "mode": ("scheduler", ""),
}


def expand_matrix(
    doc: LineDict, matrix: Any, where: Location
) -> Iterator[tuple[LineDict, tuple[tuple[str, Any], ...]]]:
    if not isinstance(matrix, LineDict) or not matrix:
        raise ScenarioError(where.at("matrix"), "must be a mapping of field to a list of values")
    axes: list[tuple[str, list[Any]]] = []
    for key, values in matrix.items():
        at = where.at(f"matrix.{key}", matrix.line_of(key))
        if key not in MATRIX_KEYS:
            raise ScenarioError(
                at,
                f"cannot vary {key!r}{suggestion(key, MATRIX_KEYS)}; matrix keys are "
                + ", ".join(MATRIX_KEYS),
            )
        if not isinstance(values, list) or not values:
            raise ScenarioError(at, "must be a non-empty list of values")
        axes.append((key, list(values)))
    cases = 1
    for _, values in axes:
        cases *= len(values)
    check_count(cases, where.at("matrix"), "the matrix's combinations", "matrix_cases")
    for combo in itertools.product(*(values for _, values in axes)):
        variant = copy.deepcopy(doc)
        params = tuple((key, value) for (key, _), value in zip(axes, combo, strict=True))
        no_speculation = any(k == "method" and v in (None, "none") for k, v in params)
        for key, value in params:
            section, _ = MATRIX_KEYS[key]
            line = matrix.line_of(key)
            if section == "speculative" and no_speculation:
                variant["speculative"] = None
                continue
            target = variant.get(section)
            if target is None:
                target = LineDict()
                target.line, target.key_lines = line, {}
                variant[section] = target
                variant.key_lines[section] = line or 0
            if not isinstance(target, LineDict):
                raise ScenarioError(where.at(section), "must be a mapping")
            target[key] = value
            target.key_lines[key] = line or 0
        yield variant, params


def param_id(key: str, value: Any) -> str:
    prefix = MATRIX_KEYS[key][1]
    if value is None or value == "none":
        return "nospec" if key == "method" else f"{prefix}none"
    if isinstance(value, bool):
        return prefix if value else f"no{prefix}"
    return f"{prefix}{value}"
