"""The settings a scenario may leave to vLLM: left out, they take vLLM's own default.

A scenario that does not say ``enable_caching`` runs what ``vllm serve`` runs:
prefix caching as vLLM's ``CacheConfig`` defaults it, for the release under
test. Each :class:`Setting` names where a scenario states it, where vLLM keeps
its default (read from vLLM's config classes by the compatibility layer,
:meth:`kvconform.oracles.vllm.Vllm.default_settings`, never a constant here),
and the scenario kinds that read it. Before a scenario runs, the runner resolves
its settings against the loaded vLLM (:func:`kvconform.oracles.resolve.resolve_settings`):
what the file states wins, the rest takes vLLM's default, and the
:class:`SettingsRecord` says which of the values differ from vLLM's defaults
(report.json's ``settings`` and ``non_default``; ``kvconform coverage`` counts them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvconform.model.kinds import Kind


@dataclass(frozen=True)
class Setting:
    name: str
    # Where a scenario states it (its field, under the section it lives in).
    field: str
    # Where vLLM keeps its default (module.Class.field), as the compat layer reads it.
    vllm_default: str
    # The scenario kinds that run with it.
    kinds: frozenset[str]
    doc: str


SETTINGS: Mapping[str, Setting] = MappingProxyType(
    {
        s.name: s
        for s in (
            Setting(
                "enable_caching",
                "model.enable_caching",
                "vllm.config.cache.CacheConfig.enable_prefix_caching",
                frozenset(Kind),
                "prefix caching (KVCacheManager(enable_caching=...), the engine's "
                "enable_prefix_caching)",
            ),
            Setting(
                "prefix_cache_retention_interval",
                "model.prefix_cache_retention_interval",
                "vllm.config.cache.CacheConfig.prefix_cache_retention_interval",
                frozenset(Kind) - {Kind.STARTUP},
                "which sliding-window and Mamba prefix-cache checkpoints are kept: None "
                "densely, 0 the semantic ones only, a positive interval periodic ones too "
                "(releases before the config field read VLLM_PREFIX_CACHE_RETENTION_INTERVAL)",
            ),
            Setting(
                "scheduler_reserve_full_isl",
                "model.scheduler_reserve_full_isl",
                "vllm.config.scheduler.SchedulerConfig.scheduler_reserve_full_isl",
                frozenset({Kind.TRAJECTORY, Kind.SCHEDULER, Kind.ENGINE}),
                "full-sequence admission: a waiting request is admitted only if its whole "
                "sequence fits the pool (allocate_slots(full_sequence_must_fit=...) on a "
                "first chunk)",
            ),
            Setting(
                "enable_chunked_prefill",
                "scheduler.enable_chunked_prefill",
                "vllm.config.scheduler.SchedulerConfig.enable_chunked_prefill",
                frozenset({Kind.SCHEDULER, Kind.ENGINE}),
                "chunked prefill (trajectory scenarios state their chunks themselves)",
            ),
            Setting(
                "async_scheduling",
                "scheduler.mode",
                "vllm.config.scheduler.SchedulerConfig.async_scheduling",
                frozenset({Kind.SCHEDULER, Kind.ENGINE}),
                "asynchronous scheduling (scheduler mode: sync, or async / overlapped); "
                "vLLM's None resolves to on for a plain decoder",
            ),
        )
    }
)


@dataclass(frozen=True)
class SettingsRecord:
    """What a scenario ran with: each setting's value, vLLM's default, and who chose it."""

    values: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    stated: frozenset[str] = frozenset()

    @property
    def non_default(self) -> tuple[str, ...]:
        """The settings whose value differs from vLLM's default for the release."""
        return tuple(
            name
            for name, value in self.values.items()
            if name in self.defaults and value != self.defaults[name]
        )

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> SettingsRecord | None:
        """A record from a report.json scenario entry (its ``settings``), or None."""
        settings = entry.get("settings")
        if not settings:
            return None
        return cls(
            values={name: s["value"] for name, s in settings.items()},
            defaults={name: s["vllm_default"] for name, s in settings.items()},
            stated=frozenset(n for n, s in settings.items() if s["source"] == "scenario"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": {
                name: {
                    "value": value,
                    "vllm_default": self.defaults.get(name),
                    "source": "scenario" if name in self.stated else "vLLM default",
                }
                for name, value in self.values.items()
            },
            "non_default": list(self.non_default),
        }
