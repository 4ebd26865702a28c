"""The facade's spec types and vLLM's defaults: the ``KVCacheSpec`` classes the loaded
vLLM declares, a spec built for a scenario group, and the settings' defaults read from
vLLM's config classes."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.settings import SETTINGS
from kvconform.oracles.vllm.base import _RETENTION_VARIABLE, VllmBase
from kvconform.oracles.vllm.calls import flatten_literal, quiet_logs

# Every spec class a scenario group is built from gets these attributes where
# the class has such a field; their values do not influence block counts.
# A spec class's dataclass fields, read once per class (a tree imported anew, as by a
# mutation campaign's child, has classes of its own).
_FIELD_NAMES: dict[type, frozenset[str]] = {}

_NEUTRAL_SPEC_FIELDS: dict[str, Any] = {
    "num_kv_heads": 1,
    "head_size": 8,
    "page_size": 64,
}


class SpecsPart(VllmBase):
    """Spec types and vLLM's defaults."""

    def spec_class(self, name: str) -> type:
        cls = getattr(self._iface, name, None)
        if cls is None:
            raise self.not_offered(f"vllm.v1.kv_cache_interface.{name}")
        return typing.cast(type, cls)

    def offered_spec_classes(self) -> list[str]:
        """Names of every KVCacheSpec subclass vLLM's kv_cache_interface defines."""
        base = self._iface.KVCacheSpec
        return sorted(
            name
            for name, obj in vars(self._iface).items()
            if isinstance(obj, type)
            and issubclass(obj, base)
            and obj.__module__ == self._iface.__name__
        )

    def build_specs(self, groups: Sequence[tuple[str, int, dict[str, object]]]) -> list[Any]:
        """:meth:`build_spec` for each (type, block size, options), in order.

        The specs are frozen dataclasses, built once per set of groups and remembered:
        a scenario's setup asks for them four times (settings, trajectory, live manager,
        predictor), and scenarios share groups."""
        try:
            key = tuple((t, size, tuple(sorted(options.items()))) for t, size, options in groups)
            hash(key)
        except TypeError:  # an option value that does not hash: built anew
            return [self.build_spec(t, size, options) for t, size, options in groups]
        return list(
            self._remembered(
                ("specs", key),
                lambda: [self.build_spec(t, size, options) for t, size, options in groups],
            )
        )

    def build_spec(self, type_name: str, block_size: int, options: dict[str, object]) -> Any:
        """A vLLM KVCacheSpec for a scenario group: its options plus neutral sizes."""
        import torch

        cls = self.spec_class(GROUP_TYPES[type_name].vllm_class)
        field_names = _FIELD_NAMES.get(cls)
        if field_names is None:
            field_names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        kwargs: dict[str, Any] = {"block_size": block_size}
        neutral = dict(_NEUTRAL_SPEC_FIELDS, dtype=torch.float16)
        neutral.update(shapes=((4,),), dtypes=(torch.float16,))
        for name, value in neutral.items():
            if name in field_names:
                kwargs[name] = value
        for name, value in options.items():
            if value is None:
                continue
            if name not in field_names:
                raise self.not_offered(f"{cls.__name__}.{name}")
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            raise self.missing(
                f"a {cls.__name__} that kvconform can build", f"{type(exc).__name__}: {exc}"
            ) from None

    def literal_values(self, dotted: str) -> tuple[str, ...] | None:
        """The values of one of vLLM's literal types (``module.Name``), or None if absent.

        A group option's ``Option.vllm_literal``: e.g. the Mamba cache modes the
        config accepts (0.32 dropped "all" from ``MambaCacheMode`` while
        ``MambaSpec`` still takes it; a mode the config refuses is one no deployment runs).
        """
        module_name, _, name = dotted.rpartition(".")
        module = self.optional_module(module_name)
        literal = getattr(module, name, None) if module else None
        return tuple(flatten_literal(literal)) if literal is not None else None

    def is_mla(self, spec: Any) -> bool:
        """Whether a group of this spec is multi-head latent attention (an
        ``MLAAttentionSpec`` or ``SlidingWindowMLASpec``): a model with one has
        ``ModelConfig.use_mla``."""
        classes = tuple(
            cls
            for cls in (
                getattr(self._iface, "MLAAttentionSpec", None),
                getattr(self._iface, "SlidingWindowMLASpec", None),
            )
            if cls is not None
        )
        return bool(classes) and isinstance(spec, classes)

    def dcp_sharded(self, spec: Any) -> bool:
        """Whether the manager multiplies this group's block size by the DCP world size.

        From 0.31 a spec says so itself (``dcp_sharded``: attention yes, Mamba
        no). Releases without the field (0.28-0.30) multiply every group's
        block size when ``dcp_world_size > 1`` (``SingleTypeKVCacheManager.__init__``).
        """
        return bool(getattr(spec, "dcp_sharded", True))

    # -- vLLM's defaults -------------------------------------------------------------

    def default_settings(self) -> dict[str, Any]:
        """vLLM's own default for each setting of kvconform.model.settings.SETTINGS.

        Read from the config classes' field defaults (pydantic's, default factories
        called), so it is the release's answer, not kvconform's. Releases whose
        ``CacheConfig`` has no retention field read ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``
        (0.28; unset: dense, None). ``async_scheduling``'s None is what VllmConfig
        resolves it to for a plain decoder on one GPU: on.
        """
        # Asked once per scenario; the release's defaults do not change within a process.
        return dict(self._remembered(("default_settings",), self._read_default_settings))

    def _read_default_settings(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        for setting in SETTINGS.values():
            module_name, class_name, field_name = setting.vllm_default.rsplit(".", 2)
            module = self.optional_module(module_name)
            cls = getattr(module, class_name, None) if module is not None else None
            fields = getattr(cls, "__pydantic_fields__", {}) if cls is not None else {}
            if field_name in fields:
                defaults[setting.name] = fields[field_name].get_default(call_default_factory=True)
            elif setting.name == "prefix_cache_retention_interval":
                defaults[setting.name] = self._retention_from_environment()
        if defaults.get("async_scheduling", True) is None:
            defaults["async_scheduling"] = True
        return defaults

    def prefix_caching_default(self, attn_type: str) -> bool | None:
        """Whether vLLM turns prefix caching on by default for a generative model of this
        attention type (``ModelConfig.is_prefix_caching_supported``, which ``EngineArgs``
        takes as the default); None where the release has no such rule."""
        # Remembered: asked once per scenario, and quieting vLLM's logs walks every logger.
        return self._remembered(
            ("prefix_caching_default", attn_type), lambda: self._prefix_caching_rule(attn_type)
        )

    def _prefix_caching_rule(self, attn_type: str) -> bool | None:
        model = self.optional_module("vllm.config.model")
        rule = getattr(getattr(model, "ModelConfig", None), "is_prefix_caching_supported", None)
        if not isinstance(rule, property) or rule.fget is None:
            return None
        with quiet_logs():
            return bool(rule.fget(SimpleNamespace(attn_type=attn_type, pooler_config=None)))

    def prefix_cacheable(self, spec: Any) -> bool:
        """Whether vLLM caches this group's prefixes (``KVCacheSpec.prefix_cacheable``;
        releases without the property cache every group)."""
        return bool(getattr(spec, "prefix_cacheable", True))

    def _retention_from_environment(self) -> int | None:
        envs = self.optional_module("vllm.envs")
        return getattr(envs, _RETENTION_VARIABLE, None) if envs is not None else None
