"""One scenario document: the sections every kind has, then the kind's own.

Name, description, tags, the vLLM releases it states, ``kind``, the model and
the speculative section are read here; each kind's sections (``KindEntry.sections``)
are read by its loader (:data:`kvconform.harness.loader.kinds.LOADERS`).
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.fields import (
    PROBLEMS,
    Abandoned,
    Fields,
    attempt,
    empty_mapping,
    releases,
    report,
    suggestion,
)
from kvconform.harness.loader.kinds import LOADERS, Document, Loaded
from kvconform.harness.loader.matrix import param_id
from kvconform.harness.loader.model import check_extra_retained, parse_model, parse_speculative
from kvconform.harness.yamlio import LineDict
from kvconform.model.kinds import KINDS, Kind
from kvconform.model.scenario import Scenario


def parse(
    doc: LineDict, file: str, default_name: str, params: tuple[tuple[str, Any], ...]
) -> Scenario:
    where = Location(file, doc.line)
    top = Fields(doc, where, "")
    name = top.text("name", default_name)
    scenario_id = name + (f"[{'-'.join(param_id(k, v) for k, v in params)}]" if params else "")
    description = top.raw("description", "") or ""
    if not isinstance(description, str):
        raise ScenarioError(top.at("description"), "must be a string")
    tags = top.raw("tags", []) or []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise ScenarioError(top.at("tags"), "must be a list of names")
    vllm_releases = releases(top)
    kind_name = top.text("kind", Kind.TRAJECTORY)
    if kind_name not in KINDS:
        raise ScenarioError(
            top.at("kind"),
            f"must be one of {', '.join(KINDS)}, not {kind_name!r}"
            f"{suggestion(kind_name, tuple(KINDS))}",
        )
    kind = KINDS[Kind(kind_name)]
    loader = LOADERS[kind.kind]
    top.allow("matrix")  # popped before, expanded into this variant
    model, model_ok = attempt(lambda: parse_model(top.raw("model", empty_mapping()), where))
    speculative, spec_ok = attempt(
        lambda: parse_speculative(top.raw("speculative"), where, top.at("speculative"))
    )
    if not (model_ok and spec_ok):
        # What follows reads the model and the speculation: report the requests' and
        # the rest of the file's unknown fields, and the steps' calls as written only.
        top.allow(*kind.sections)
        if loader.read_as_written is not None:
            loader.read_as_written(top, where)
        top.done()
        raise Abandoned
    for key, value in (
        ("watermark", model.watermark),
        ("max_in_flight_tokens", model.max_in_flight_tokens),
        ("log_stats", model.log_stats),
        ("mamba_shared_prefix_checkpoint", model.mamba_shared_prefix_checkpoint),
        # 0 is a setting (sparse retention), not an absence. The scheduler oracle builds
        # its KVCacheConfig with it too, as vLLM's engine core does from the cache config.
        ("prefix_cache_retention_interval", model.prefix_cache_retention_interval is not None),
    ):
        read_by_scheduler = key == "prefix_cache_retention_interval" and kind.kind == Kind.SCHEDULER
        if value and not kind.builds_manager and not read_by_scheduler:
            readers = (
                "trajectory and scheduler"
                if key == "prefix_cache_retention_interval"
                else "trajectory"
            )
            # Only the trajectory driver builds its KVCacheManager from the model
            # section; the other kinds' schedulers and warmups would run without it.
            raw_model = doc.get("model")
            line = raw_model.line_of(key) if isinstance(raw_model, LineDict) else None
            report(
                ScenarioError(
                    where.at(f"model.{key}", line),
                    f"is read by {readers} scenarios only, not by kind {kind.kind}",
                )
            )
    loaded: Loaded | None = None
    try:
        if not model.groups and not loader.allows_no_groups(doc):
            # Only encoder-only pooling models allocate no KV blocks (vLLM's warmup says
            # so); every other scenario needs a group to reserve in.
            model_raw = doc.get("model")
            line = model_raw.line_of("groups") if isinstance(model_raw, LineDict) else None
            raise ScenarioError(
                where.at("model.groups", line),
                "must be a non-empty list of group types (an empty one, a model without "
                "KV cache, only for kind: warmup with warmup.pooling: true)",
            )
        check_extra_retained(model, speculative, kind.kind)
        loaded = loader.load(Document(doc, top, where, model, speculative))
    except Abandoned:
        pass
    except ScenarioError as error:
        report(error)
    top.allow(*kind.sections)
    top.done()
    if PROBLEMS.get():
        raise Abandoned  # its problems are recorded
    assert loaded is not None  # without a problem, the kind's sections were read
    return Scenario(
        id=scenario_id,
        name=name,
        file=file,
        description=description.strip(),
        tags=tuple(tags),
        spec=loaded.spec,
        model=model,
        speculative=speculative,
        requests=loaded.requests,
        steps=loaded.steps,
        params=params,
        line=doc.line,
        vllm_releases=vllm_releases,
    )
