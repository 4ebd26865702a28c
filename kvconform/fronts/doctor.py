"""``kvconform doctor``: what the selected vLLM offers, and what kvconform can exercise.

Lists the vLLM in use and where it came from, torch and the device, whether the
warmup predictor and ``VllmConfig.num_lookahead_tokens`` exist, which KV spec
types vLLM defines (buildable by kvconform, deliberately skipped, or new), and
which speculative methods kvconform's method registry lacks (and where to add
each: :func:`kvconform.model.methods.how_to_add`). Exit 0 when
everything vLLM offers is covered, 1 when something is new to kvconform, 3 when
vLLM cannot be exercised at all.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from pathlib import Path

from kvconform import __version__
from kvconform.model.group_types import NOT_BUILDABLE, group_type_for_class
from kvconform.model.methods import BUILTIN_METHODS, how_to_add, method_for
from kvconform.oracles.vllm import MINIMUM_SUPPORTED, Vllm


def doctor(vllm: Vllm, say: Callable[[str], None], methods_file: Path | None = None) -> int:
    status = 0
    torch_version, device = vllm.runtime()
    say(f"kvconform {__version__} on Python {platform.python_version()} ({sys.executable})")
    say(f"vLLM {vllm.version}: {vllm.source.describe()}")
    if vllm.below_minimum():
        say(
            f"  note: kvconform supports vLLM >= {MINIMUM_SUPPORTED}; older trees run for bisection only"
        )
    say(f"torch {torch_version}; device {device}")
    predictor = vllm.reserved_block_count
    say(
        "warmup predictor _reserved_block_count: "
        + ("present" if predictor else f"MISSING ({vllm.predictor_missing_reason()})")
    )
    from kvconform.oracles.engine import unavailable_reason

    engine_blocker = unavailable_reason()
    say(
        "engine mode (kind: engine, vLLM's real engine): "
        + (
            "can run here"
            if engine_blocker is None
            else f"cannot run here: {engine_blocker}; engine scenarios are skipped"
        )  # fmt: skip
    )
    lookahead = vllm.lookahead(BUILTIN_METHODS[0].name, 3)
    say("VllmConfig.num_lookahead_tokens: " + ("present" if lookahead is not None else "MISSING"))
    say("KV spec types vLLM defines:")
    for name in vllm.offered_spec_classes():
        group_type = group_type_for_class(name)
        if group_type is not None:
            say(f"  {name:28} scenario type {group_type.name}")
        elif name in NOT_BUILDABLE:
            say(f"  {name:28} not built: {NOT_BUILDABLE[name]}")
        else:
            say(f"  {name:28} NEW: kvconform has no group type for it")
            status = 1
    unknown = [m for m in vllm.declared_methods() if method_for(vllm.canonical_method(m)) is None]
    say(
        f"speculative methods: {len(vllm.declared_methods())} declared, "
        f"{len(unknown)} without an entry in kvconform's method registry"
        + (f" (with the methods file {methods_file})" if methods_file else "")
        + (f": {', '.join(unknown)}" if unknown else "")
    )
    for name in dict.fromkeys(vllm.canonical_method(m) for m in unknown):
        for line in how_to_add(name, str(methods_file) if methods_file else None):
            say(f"  {line}")
    if unknown:
        status = 1
    return status
