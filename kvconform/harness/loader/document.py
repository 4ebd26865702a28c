"""One scenario document: the sections every kind has, then the kind's own.

Name, description, tags, the vLLM releases it states, ``kind``, the model and
the speculative section are read here; each kind's sections (``KIND_SECTIONS``)
are read by its module (trajectory, scheduler, warmup, engine, startup).
"""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.engine import parse_engine
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
from kvconform.harness.loader.matrix import param_id
from kvconform.harness.loader.model import check_extra_retained, parse_model, parse_speculative
from kvconform.harness.loader.requests import parse_requests
from kvconform.harness.loader.scheduler import (
    check_scheduler_model,
    parse_scheduler,
    parse_scheduler_requests,
)
from kvconform.harness.loader.startup import check_startup_model, parse_startup
from kvconform.harness.loader.trajectory import check_written_steps, parse_steps
from kvconform.harness.loader.warmup import parse_warmup, warmup_pooling
from kvconform.harness.yamlio import LineDict
from kvconform.model.scenario import (
    KINDS,
    RequestSpec,
    Scenario,
    Step,
)

# The top-level sections each kind reads besides name, description, tags, kind,
# model, speculative and matrix.
KIND_SECTIONS: dict[str, tuple[str, ...]] = {
    "trajectory": ("requests", "steps"),
    "scheduler": ("scheduler", "requests"),
    "warmup": ("warmup",),
    "engine": ("engine", "requests"),
    "startup": ("startup",),
}


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
    kind = top.text("kind", "trajectory")
    if kind not in KINDS:
        raise ScenarioError(
            top.at("kind"),
            f"must be one of {', '.join(KINDS)}, not {kind!r}{suggestion(kind, KINDS)}",
        )
    top.allow("matrix")  # popped before, expanded into this variant
    model, model_ok = attempt(lambda: parse_model(top.raw("model", empty_mapping()), where))
    speculative, spec_ok = attempt(
        lambda: parse_speculative(top.raw("speculative"), where, top.at("speculative"))
    )
    if not (model_ok and spec_ok):
        # What follows reads the model and the speculation: report the requests' and
        # the rest of the file's unknown fields, and the steps' calls as written only.
        top.allow(*KIND_SECTIONS[kind])
        if kind == "trajectory":
            attempt(lambda: parse_requests(top.raw("requests"), where, top.at("requests")))
            # Their calls as written: a mistake of their own is reported, not applied.
            attempt(lambda: check_written_steps(top.raw("steps"), where, top.at("steps")))
        top.done()
        raise Abandoned
    for key, value in (
        ("watermark", model.watermark),
        ("max_in_flight_tokens", model.max_in_flight_tokens),
        ("log_stats", model.log_stats),
        ("mamba_shared_prefix_checkpoint", model.mamba_shared_prefix_checkpoint),
        # 0 is a setting (sparse retention), not an absence.
        ("prefix_cache_retention_interval", model.prefix_cache_retention_interval is not None),
    ):
        if value and kind != "trajectory":
            # Only the trajectory driver builds its KVCacheManager from the model
            # section; the other kinds' schedulers and warmups would run without it.
            raw_model = doc.get("model")
            line = raw_model.line_of(key) if isinstance(raw_model, LineDict) else None
            report(
                ScenarioError(
                    where.at(f"model.{key}", line),
                    f"is read by trajectory scenarios only, not by kind {kind}",
                )
            )
    warmup = None
    scheduler = None
    engine = None
    startup = None
    requests: dict[str, RequestSpec] = {}
    steps: tuple[Step, ...] = ()
    try:
        if not model.groups and not (kind == "warmup" and warmup_pooling(doc)):
            # Only encoder-only pooling models allocate no KV blocks (vLLM's warmup says
            # so); every other scenario needs a group to reserve in.
            model_raw = doc.get("model")
            line = model_raw.line_of("groups") if isinstance(model_raw, LineDict) else None
            raise ScenarioError(
                where.at("model.groups", line),
                "must be a non-empty list of group types (an empty one, a model without "
                "KV cache, only for kind: warmup with warmup.pooling: true)",
            )
        check_extra_retained(model, speculative, kind)
        if kind == "scheduler":
            if "steps" in doc:
                raise ScenarioError(
                    top.at("steps"),
                    "a scheduler scenario has no steps: vLLM's scheduler decides them "
                    "(describe the requests and the scheduler's limits instead)",
                )
            check_scheduler_model(model, speculative, top)
            scheduler = parse_scheduler(
                top.raw("scheduler", empty_mapping()),
                where,
                top.at("scheduler"),
                speculative,
                model,
            )
            requests = parse_scheduler_requests(
                top.raw("requests"), where, top.at("requests"), model, speculative, scheduler
            )
        elif kind == "engine":
            if "steps" in doc:
                raise ScenarioError(
                    top.at("steps"), "an engine scenario has no steps: vLLM's engine decides them"
                )
            engine, requests = parse_engine(
                top.raw("engine", empty_mapping()), where, top.at("engine"), speculative, model,
                top.raw("requests"), top.at("requests"),
            )  # fmt: skip
        elif kind == "startup":
            for key in ("requests", "steps"):
                if key in doc:
                    raise ScenarioError(
                        top.at(key),
                        "a startup scenario has no requests or steps: it judges the pool "
                        "vLLM's startup planning accepts by one max_model_len request",
                    )
            check_startup_model(model, speculative, doc, top)
            startup = parse_startup(top.raw("startup", empty_mapping()), where, model)
        elif kind == "warmup":
            warmup = parse_warmup(top.raw("warmup", empty_mapping()), where)
            for key in ("requests", "steps"):
                if key in doc:
                    raise ScenarioError(top.at(key), "a warmup scenario has no requests or steps")
        else:
            requests = parse_requests(top.raw("requests"), where, top.at("requests"))
            steps = parse_steps(
                top.raw("steps"), where, top.at("steps"), requests, model, speculative
            )
    except Abandoned:
        pass
    except ScenarioError as error:
        report(error)
    top.allow(*KIND_SECTIONS[kind])
    top.done()
    if PROBLEMS.get():
        raise Abandoned  # its problems are recorded
    return Scenario(
        id=scenario_id,
        name=name,
        file=file,
        description=description.strip(),
        tags=tuple(tags),
        kind=kind,
        model=model,
        speculative=speculative,
        requests=requests,
        steps=steps,
        params=params,
        warmup=warmup,
        line=doc.line,
        scheduler=scheduler,
        engine=engine,
        startup=startup,
        vllm_releases=vllm_releases,
    )
