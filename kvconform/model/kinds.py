"""The kinds of scenario: one registry entry per kind.

A scenario's ``kind`` says which part of vLLM it exercises and how: a trajectory
drives vLLM's ``KVCacheManager`` through the steps the file states; a warmup runs
vLLM's real ``warmup_kernels``; a scheduler scenario lets vLLM's real scheduler decide
the steps; an engine scenario runs ``vllm.LLM``; a startup scenario hands vLLM's
startup planning a pool. A :class:`KindEntry` says, for one kind:

* its name (:class:`Kind`, a string enum: recordings and report.json write the value)
  and the top-level YAML sections it reads besides the common ones (``sections``);
* the spec it carries (``spec``: ``Scenario.spec`` is an instance of it,
  :mod:`kvconform.model.kind_specs`);
* the party that decides the live side's holdings (``live_party``) and the parties
  whose holdings its recording has columns for (``recorded``: ``Trajectory.parties``);
* what the other modules ask of a kind: whether it builds its KV-cache groups from the
  scenario's own list of every group type (``groups_from_list``), whether the scenario
  states its steps (``states_steps``), whether its driver builds the allocator from the
  model section (``builds_manager``), and whether its driver runs vLLM's warmup
  (``drives_warmup``).

Its loader and its driver live in the layers above (they read YAML, they drive vLLM):
each kind registers them there, in :data:`kvconform.harness.loader.kinds.LOADERS` and
:data:`kvconform.harness.drivers.DRIVERS`, both asserted complete against this table at
import. Every other module reads these entries; only this one spells a kind's name
(``tests/test_registries.py``). Adding a kind is one entry here, its spec, its loader
and its driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvconform.model.kind_specs import (
    EngineSpec,
    SchedulerSpec,
    StartupSpec,
    TrajectorySpec,
    WarmupSpec,
)
from kvconform.model.names import Name
from kvconform.model.parties import Party

# What Scenario.spec holds: one of the kinds' specs.
KindSpec = TrajectorySpec | WarmupSpec | SchedulerSpec | EngineSpec | StartupSpec


class Kind(Name):
    TRAJECTORY = "trajectory"
    WARMUP = "warmup"
    SCHEDULER = "scheduler"
    ENGINE = "engine"
    STARTUP = "startup"


@dataclass(frozen=True)
class KindEntry:
    """One kind of scenario: its sections, its spec, its parties and what it does."""

    kind: Kind
    description: str
    spec: type
    # Top-level sections it reads besides name, description, tags, kind, vllm, model,
    # speculative and matrix.
    sections: tuple[str, ...]
    # Whose holdings the live side's records are (a check's "live" record names it).
    live_party: Party
    # The parties whose holdings its recording has columns for (Trajectory.parties).
    recorded: tuple[Party, ...]
    # Builds its KV-cache groups from the scenario's own list, taking every group type
    # (the others build them from vLLM's config of a model: GroupType.modes lists them).
    groups_from_list: bool = False
    # The scenario states its every step (its driver makes each call); the other kinds let
    # vLLM decide the steps.
    states_steps: bool = False
    # Its driver builds vLLM's KVCacheManager itself, from the model section: the groups as
    # stated (their eagle_group and extra_retained_tokens included) and the model's
    # allocator settings (watermark, log_stats, ...); the other kinds' schedulers, engines
    # and warmups build theirs from vLLM's config of a model.
    builds_manager: bool = False
    # Its driver runs vLLM's real warmup_kernels (kvconform.oracles.warmup), which a run on
    # CPU makes differently (its note) and releases below kvconform's minimum break.
    drives_warmup: bool = False


KINDS: Mapping[Kind, KindEntry] = MappingProxyType(
    {
        k.kind: k
        for k in (
            KindEntry(
                Kind.TRAJECTORY,
                "the steps the file states, through vLLM's KVCacheManager",
                TrajectorySpec,
                ("requests", "steps"),
                Party.LIVE,
                (Party.LIVE, Party.PREDICTED),
                groups_from_list=True,
                states_steps=True,
                builds_manager=True,
            ),
            KindEntry(
                Kind.WARMUP,
                "vLLM's real warmup_kernels, with the predictor's counts",
                WarmupSpec,
                ("warmup",),
                Party.LIVE,
                (Party.LIVE, Party.PREDICTED, Party.WARMUP),
                groups_from_list=True,
                drives_warmup=True,
            ),
            KindEntry(
                Kind.SCHEDULER,
                "vLLM's real scheduler decides the steps of the file's requests",
                SchedulerSpec,
                ("scheduler", "requests"),
                Party.SCHEDULER,
                (Party.LIVE, Party.PREDICTED),
            ),
            KindEntry(
                Kind.ENGINE,
                "vLLM's real engine (vllm.LLM) on a tiny model",
                EngineSpec,
                ("engine", "requests"),
                Party.ENGINE,
                (Party.LIVE, Party.WARMUP),
            ),
            KindEntry(
                Kind.STARTUP,
                "vLLM's startup KV-cache planning of a pool",
                StartupSpec,
                ("startup",),
                Party.PLANNER,
                (Party.LIVE,),
            ),
        )
    }
)
assert tuple(KINDS) == tuple(Kind), "every kind has one entry"
assert len({k.spec for k in KINDS.values()}) == len(KINDS), "every kind has its own spec"

_KIND_OF_SPEC: Mapping[type, Kind] = MappingProxyType({k.spec: k.kind for k in KINDS.values()})

# The kinds that build their groups from the scenario's own list (GroupType.modes' default).
EVERY_KIND_WITH_GROUPS = frozenset(k.kind for k in KINDS.values() if k.groups_from_list)


def kind_of(spec: KindSpec) -> Kind:
    """The kind whose spec ``spec`` is."""
    return _KIND_OF_SPEC[type(spec)]


def entry(kind: str) -> KindEntry:
    """The registry entry of ``kind`` (a :class:`Kind`, or its name as a recording keeps it)."""
    return KINDS[Kind(kind)]
