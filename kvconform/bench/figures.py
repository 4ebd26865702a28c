"""A benchmark figure: a measured value with its target, or "not available" and why.

Every figure in ``build/bench.json`` has the same shape, so a reader (and the
Markdown row) never has to guess whether a number is missing, skipped or zero:

* measured: ``{"available": true, "value": 1.21, "unit": "x", "target": "<= 1.3",
  "meets_target": true, ...details}``
* missing: ``{"available": false, "reason": "kvconform.fuzz has no run_fuzz in
  this tree"}`` -- the machinery is absent, or the measurement failed; never a
  made-up value.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

Figure = dict[str, Any]


def measured(
    value: float | int,
    unit: str,
    *,
    target: str | None = None,
    meets_target: bool | None = None,
    **details: Any,
) -> Figure:
    figure: Figure = {"available": True, "value": _rounded(value), "unit": unit}
    if target is not None:
        figure["target"] = target
        figure["meets_target"] = meets_target
    figure.update({k: _rounded(v) for k, v in details.items()})
    return figure


def not_available(reason: str) -> Figure:
    return {"available": False, "reason": reason}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if abs(value) < 1 else round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def guarded(measure: Callable[[], Figure], what: str) -> Figure:
    """Run one measurement; a failure becomes a "not available" figure with the reason.

    A benchmark that stops at its first broken figure reports nothing about the
    others; one that hides the failure reports a lie. This does neither.
    """
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure of one figure is reported, not raised
        return not_available(f"{what} failed: {type(exc).__name__}: {exc}")
