"""A warmup scenario's ``warmup`` section: the entry points and the runner's limits."""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import Fields, as_written, releases
from kvconform.harness.yamlio import LineDict, LineList
from kvconform.model.kind_specs import WARMUP_SAMPLING, WarmupPass, WarmupSpec

# run_kv_cache_sizing_warmup: the steps an extensible KV cache is sized on (vLLM 0.34 on;
# GPUWorker runs it after warmup_kernels, from a cache shrunk back to its minimum).
WARMUP_ENTRY_POINTS = (
    "warmup_kernels",
    "run_mixed_prefill_decode_warmup",
    "run_kv_cache_sizing_warmup",
)


def warmup_pooling(doc: LineDict) -> bool:
    section = doc.get("warmup")
    return isinstance(section, LineDict) and section.get("pooling") is True


def parse_warmup(raw: Any, where: Location) -> WarmupSpec:
    fields = Fields(raw, where, "warmup")
    defaults = WarmupSpec()
    entry_points = fields.raw("entry_points", list(defaults.entry_points))
    if isinstance(entry_points, str):
        entry_points = [entry_points]
    if not isinstance(entry_points, list) or not entry_points:
        raise ScenarioError(fields.at("entry_points"), "must be a non-empty list")
    for entry in entry_points:
        if entry not in WARMUP_ENTRY_POINTS:
            raise ScenarioError(
                fields.at("entry_points"),
                f"unknown entry point {entry!r}; known: {', '.join(WARMUP_ENTRY_POINTS)}",
            )
    spec = WarmupSpec(
        entry_points=tuple(entry_points),
        max_num_seqs=fields.integer("max_num_seqs", defaults.max_num_seqs),
        max_num_batched_tokens=fields.integer(
            "max_num_batched_tokens", defaults.max_num_batched_tokens
        ),
        mixed_num_tokens=fields.integer("mixed_num_tokens", defaults.mixed_num_tokens),
        pooling=fields.flag("pooling", defaults.pooling),
        redirect_writes_to_null_block=fields.flag(
            "redirect_writes_to_null_block", defaults.redirect_writes_to_null_block
        ),
        expect_passes=_parse_warmup_passes(fields.raw("expect_passes"), fields.at("expect_passes")),
        expect_passes_at=fields.at("expect_passes"),
    )
    if spec.expect_passes is not None and "warmup_kernels" not in spec.entry_points:
        raise ScenarioError(
            fields.at("expect_passes"), "needs warmup_kernels among the entry_points"
        )
    fields.done()
    return spec


def _parse_warmup_passes(raw: Any, where: Location) -> tuple[WarmupPass, ...] | None:
    """``expect_passes``: a list of ``{requests: N, sampling: random | greedy | none, vllm: SPEC}``."""
    if raw is None:
        return None
    if not isinstance(raw, LineList) or not raw:
        raise ScenarioError(where, f"must be a non-empty list, not {as_written(raw)}")
    passes = []
    for i, item in enumerate(raw):
        fields = Fields(item, where.at(where.field or "", raw.line_of(i)), f"{where.field}[{i}]")
        requests = fields.integer("requests", minimum=0, limit="requests")
        sampling = fields.text("sampling")
        if sampling not in WARMUP_SAMPLING:
            raise ScenarioError(
                fields.at("sampling"),
                f"unknown sampling {sampling!r}; known: {', '.join(WARMUP_SAMPLING)}",
            )
        vllm = releases(fields)
        fields.done()
        passes.append(WarmupPass(requests, sampling, vllm))
    return tuple(passes)
