"""Each kind's loader: its own sections of a document, read into its spec.

:data:`LOADERS` registers one :class:`KindLoader` per kind of
:data:`kvconform.model.kinds.KINDS` (asserted at import): the registry entry says
which sections a kind reads; its loader reads them (with the kind's module of this
package) into the kind's spec, and its requests and steps where it has them.
:mod:`kvconform.harness.loader.document` reads what every kind has and calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from kvconform.errors import Location, ScenarioError
from kvconform.harness.loader.engine import parse_engine
from kvconform.harness.loader.fields import Fields, attempt, empty_mapping
from kvconform.harness.loader.requests import parse_requests
from kvconform.harness.loader.scheduler import check_scheduler_model, parse_scheduler
from kvconform.harness.loader.scheduler_requests import parse_scheduler_requests
from kvconform.harness.loader.startup import check_startup_model, parse_startup
from kvconform.harness.loader.trajectory import check_written_steps, parse_steps
from kvconform.harness.loader.warmup import parse_warmup, warmup_pooling
from kvconform.harness.yamlio import LineDict
from kvconform.model.kind_specs import TrajectorySpec
from kvconform.model.kinds import KINDS, Kind, KindSpec
from kvconform.model.scenario import ModelSpec, RequestSpec, SpeculativeSpec, Step


@dataclass(frozen=True)
class Document:
    """What a kind's loader reads from: the document, its top-level fields, and the
    sections every kind has, already read."""

    doc: LineDict
    top: Fields
    where: Location
    model: ModelSpec
    speculative: SpeculativeSpec | None


class Loaded(NamedTuple):
    """A kind's sections, read: its spec, and its requests and steps where it has them."""

    spec: KindSpec
    requests: Mapping[str, RequestSpec] = MappingProxyType({})
    steps: tuple[Step, ...] = ()


def _no(doc: LineDict) -> bool:
    return False


@dataclass(frozen=True)
class KindLoader:
    """How one kind's sections are read."""

    load: Callable[[Document], Loaded]
    # With the model or the speculative section broken: reads what of its sections can
    # be read without them, as written (its own mistakes are reported, nothing applied).
    read_as_written: Callable[[Fields, Location], None] | None = None
    # Whether the document describes a model without KV-cache groups this kind takes.
    allows_no_groups: Callable[[LineDict], bool] = field(default=_no)


def _refuse(d: Document, keys: tuple[str, ...], message: str) -> None:
    for key in keys:
        if key in d.doc:
            raise ScenarioError(d.top.at(key), message)


def _trajectory(d: Document) -> Loaded:
    requests = parse_requests(d.top.raw("requests"), d.where, d.top.at("requests"))
    steps = parse_steps(
        d.top.raw("steps"), d.where, d.top.at("steps"), requests, d.model, d.speculative
    )
    return Loaded(TrajectorySpec(), requests, steps)


def _trajectory_as_written(top: Fields, where: Location) -> None:
    attempt(lambda: parse_requests(top.raw("requests"), where, top.at("requests")))
    # Their calls as written: a mistake of their own is reported, not applied.
    attempt(lambda: check_written_steps(top.raw("steps"), where, top.at("steps")))


def _scheduler(d: Document) -> Loaded:
    _refuse(
        d,
        ("steps",),
        "a scheduler scenario has no steps: vLLM's scheduler decides them "
        "(describe the requests and the scheduler's limits instead)",
    )
    top = d.top
    check_scheduler_model(d.model, d.speculative, top)
    scheduler = parse_scheduler(
        top.raw("scheduler", empty_mapping()), d.where, top.at("scheduler"), d.speculative, d.model
    )
    requests = parse_scheduler_requests(
        top.raw("requests"), d.where, top.at("requests"), d.model, d.speculative, scheduler
    )
    return Loaded(scheduler, requests)


def _engine(d: Document) -> Loaded:
    _refuse(d, ("steps",), "an engine scenario has no steps: vLLM's engine decides them")
    top = d.top
    engine, requests = parse_engine(
        top.raw("engine", empty_mapping()), d.where, top.at("engine"), d.speculative, d.model,
        top.raw("requests"), top.at("requests"),
    )  # fmt: skip
    return Loaded(engine, requests)


def _startup(d: Document) -> Loaded:
    _refuse(
        d,
        ("requests", "steps"),
        "a startup scenario has no requests or steps: it judges the pool "
        "vLLM's startup planning accepts by one max_model_len request",
    )
    check_startup_model(d.model, d.speculative, d.doc, d.top)
    return Loaded(parse_startup(d.top.raw("startup", empty_mapping()), d.where, d.model))


def _warmup(d: Document) -> Loaded:
    warmup = parse_warmup(d.top.raw("warmup", empty_mapping()), d.where)
    _refuse(d, ("requests", "steps"), "a warmup scenario has no requests or steps")
    return Loaded(warmup)


LOADERS: Mapping[Kind, KindLoader] = MappingProxyType(
    {
        Kind.TRAJECTORY: KindLoader(_trajectory, read_as_written=_trajectory_as_written),
        Kind.SCHEDULER: KindLoader(_scheduler),
        Kind.WARMUP: KindLoader(_warmup, allows_no_groups=warmup_pooling),
        Kind.ENGINE: KindLoader(_engine),
        Kind.STARTUP: KindLoader(_startup),
    }
)
assert set(LOADERS) == set(KINDS), "every scenario kind has exactly one loader"
