"""The core facade: what every party asks of vLLM, through one :class:`Vllm` object.

Build a ``KVCacheSpec`` for a scenario group, build a ``KVCacheManager``, make a
``Request``, call ``allocate_slots``, ask ``_reserved_block_count`` and
``VllmConfig.num_lookahead_tokens``, enumerate the spec types and speculative
methods the loaded vLLM declares. The parts that serve one consumer only live
beside it: :mod:`.scheduling` (scheduler mode), :mod:`.warmup_stubs` (the warmup
party), :mod:`.slot_kernel` (the slots party); each attaches to a :class:`Vllm`
through :meth:`Vllm.part`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from kvconform.errors import NotOffered, VllmUnavailable
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import METHODS
from kvconform.model.settings import SETTINGS
from kvconform.oracles.vllm.calls import (
    accepts_keyword,
    call,
    call_leaving_defaults,
    flatten_literal,
    quiet_logs,
)
from kvconform.oracles.vllm.versions import MINIMUM_SUPPORTED, release_of

if TYPE_CHECKING:
    from kvconform.oracles.vllm.versions import VllmSource

__all__ = ["Vllm"]

# The environment variable 0.28's coordinator reads the retention interval from.
_RETENTION_VARIABLE = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
_UNSET: Any = object()


@contextlib.contextmanager
def _environment(name: str, value: Any) -> Iterator[None]:
    """``name`` set to ``value`` (unset for None) while the block runs; _UNSET: untouched."""
    if value is _UNSET:
        yield
        return
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_Part = TypeVar("_Part")

# Every spec class a scenario group is built from gets these attributes where
# the class has such a field; their values do not influence block counts.
_NEUTRAL_SPEC_FIELDS: dict[str, Any] = {
    "num_kv_heads": 1,
    "head_size": 8,
    "page_size": 64,
}


class Vllm:
    """The loaded vLLM, reduced to what kvconform asks of it."""

    def __init__(self, version: str, source: VllmSource, location: str, modules: dict[str, Any]):
        self.version = version
        self.source = source
        self.location = location
        self._kvm = modules["vllm.v1.core.kv_cache_manager"]
        self._iface = modules["vllm.v1.kv_cache_interface"]
        self._request = modules["vllm.v1.request"]
        # Answers that depend only on the loaded vLLM and the arguments (the
        # method tables, the speculative config's properties): every scenario asks
        # them again, and building a SpeculativeConfig each time cost more than
        # a short scenario's allocator calls (docs/benchmarks.md).
        self._memo: dict[tuple[Any, ...], Any] = {}
        # KVCacheConfigs of releases that read the retention interval from the
        # environment (0.28), by id, until their manager is built.
        self._retention_by_config: dict[int, int | None] = {}

    def _remembered(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def part(self, factory: Callable[[Vllm], _Part]) -> _Part:
        """The piece of the facade that ``factory`` builds for this vLLM, built once.

        The consumer-specific parts (scheduling, warmup, the slot kernel) live in
        their own modules and attach here, so this class stays the core.
        """
        return typing.cast(_Part, self._remembered(("part", factory), lambda: factory(self)))

    def forget_answers(self) -> None:
        """Drop the remembered answers: a mutation campaign's child changed vLLM's code."""
        self._memo.clear()

    def __repr__(self) -> str:
        return f"<vLLM {self.version} from {self.source.describe()}>"

    def runtime(self) -> tuple[str, str]:
        """(torch version, device) of this process: the device warmup would run on."""
        import torch

        if torch.cuda.is_available():
            return torch.__version__, f"cuda: {torch.cuda.get_device_name(0)}"
        return torch.__version__, "cpu"

    def missing(self, name: str, detail: str = "") -> VllmUnavailable:
        """An API kvconform needs is absent: this vLLM cannot be exercised here."""
        return VllmUnavailable(self.version, name, detail)

    def not_offered(self, name: str, detail: str = "") -> NotOffered:
        """This release does not offer what a scenario needs: the scenario does not apply."""
        return NotOffered(self.version, name, detail)

    def optional_module(self, name: str) -> Any | None:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    # -- spec types -------------------------------------------------------------------

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

    def build_spec(self, type_name: str, block_size: int, options: dict[str, object]) -> Any:
        """A vLLM KVCacheSpec for a scenario group: its options plus neutral sizes."""
        import torch

        cls = self.spec_class(GROUP_TYPES[type_name].vllm_class)
        field_names = {f.name for f in dataclasses.fields(cls)}
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

    # -- the allocator ----------------------------------------------------------------

    def kv_cache_config(
        self,
        num_blocks: int,
        specs: Sequence[Any],
        eagle_groups: Sequence[bool] = (),
        prefix_cache_retention_interval: int | None = None,
        roles: Sequence[str | None] = (),
        hisparse_host_blocks: int | None = None,
    ) -> Any:
        """A ``KVCacheConfig`` of one group per spec; ``eagle_groups`` flags the groups that
        hold the drafter's layers (``KVCacheGroupSpec.is_eagle_group``, vLLM >= 0.31); a
        retention interval (0.33's ``prefix_cache_retention_interval``, None: dense) is
        passed only where one is asked for. ``roles``: each group's ``KVCacheGroupRole``
        by name (HiSparse's source and indexer); ``hisparse_host_blocks``: the HiSparse
        source's host pool, whose group is host-resident (``vllm/v1/hisparse/layout.py``)."""
        iface = self._iface
        flags = list(eagle_groups) + [False] * (len(specs) - len(eagle_groups))
        named = list(roles) + [None] * (len(specs) - len(roles))
        groups = [
            call(
                iface.KVCacheGroupSpec,
                layer_names=[f"layer.{i}"],
                kv_cache_spec=spec,
                **self._group_role(role),
            )
            for i, (spec, role) in enumerate(zip(specs, named, strict=True))
        ]
        for group, flag in zip(groups, flags, strict=True):
            if flag:
                if not hasattr(group, "is_eagle_group"):
                    raise self.not_offered("KVCacheGroupSpec.is_eagle_group")
                group.is_eagle_group = True
        extra: dict[str, Any] = {}
        fields = getattr(iface.KVCacheConfig, "__dataclass_fields__", {})
        if hisparse_host_blocks is not None:
            if "hisparse_host_num_blocks" not in fields:
                raise self.not_offered("KVCacheConfig.hisparse_host_num_blocks")
            extra["hisparse_host_num_blocks"] = hisparse_host_blocks
        by_environment = "prefix_cache_retention_interval" not in fields
        if not by_environment:
            extra["prefix_cache_retention_interval"] = prefix_cache_retention_interval
        elif prefix_cache_retention_interval is not None and not hasattr(
            self.optional_module("vllm.envs"), _RETENTION_VARIABLE
        ):
            raise self.not_offered(
                "KVCacheConfig.prefix_cache_retention_interval", "this release has none"
            )
        config = call(
            iface.KVCacheConfig,
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            **extra,
        )
        if by_environment:
            # 0.28's coordinator reads the interval from the environment when it is built.
            self._retention_by_config[id(config)] = prefix_cache_retention_interval
        return config

    def _group_role(self, role: str | None) -> dict[str, Any]:
        """``KVCacheGroupSpec`` keywords of a group with ``role`` (a KVCacheGroupRole name):
        the role, and for HiSparse's source its host residency."""
        if role is None:
            return {}
        roles = getattr(self._iface, "KVCacheGroupRole", None)
        if roles is None or not hasattr(roles, role):
            raise self.not_offered(f"KVCacheGroupRole.{role}")
        return {"role": getattr(roles, role), "host_resident": role == "HISPARSE_SOURCE"}

    def manager_class(self, spec: Any) -> tuple[str, str] | None:
        """The ``SingleTypeKVCacheManager`` subclass vLLM dispatches a group of this spec
        to, as (class name, its file from the folder holding ``vllm/``), or None.

        Asked of vLLM itself, as ``get_manager_for_kv_cache_spec`` asks it:
        ``KVCacheSpecRegistry.get_manager_class`` where the release has the registry
        (0.24 on), else the module's ``spec_manager_map``, walking the spec's MRO.
        """
        return typing.cast(
            "tuple[str, str] | None",
            self._remembered(("manager_class", type(spec)), lambda: self._manager_class(spec)),
        )

    def _manager_class(self, spec: Any) -> tuple[str, str] | None:
        registry = self.optional_module("vllm.v1.kv_cache_spec_registry")
        found: Any = None
        getter = getattr(getattr(registry, "KVCacheSpecRegistry", None), "get_manager_class", None)
        if getter is not None:
            with quiet_logs():
                found = getter(spec)
        else:
            single = self.optional_module("vllm.v1.core.single_type_kv_cache_manager")
            table = getattr(single, "spec_manager_map", None) or {}
            found = next((table[c] for c in type(spec).__mro__ if c in table), None)
        if not isinstance(found, type):
            return None
        return found.__name__, _tree_file(found)

    def new_manager(self, kv_cache_config: Any, **kwargs: Any) -> Any:
        # A setting only some releases take: refused, not dropped, where it is asked for.
        option = "enable_mamba_shared_prefix_checkpoint"
        if kwargs.get(option) and not accepts_keyword(self._kvm.KVCacheManager, option):
            raise self.not_offered(f"KVCacheManager({option}=...)")
        retention = self._retention_by_config.pop(id(kv_cache_config), _UNSET)
        with _environment(_RETENTION_VARIABLE, retention):
            return call(self._kvm.KVCacheManager, kv_cache_config=kv_cache_config, **kwargs)

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        block_hasher: Callable[..., Any] | None,
        max_tokens: int = 1 << 20,
        priority: int = 0,
        mm_features: list[Any] | None = None,
        stop_token_ids: list[int] | None = None,
        eos_token_id: int | None = None,
        resumable: bool = False,
        kv_cache_report_full: bool = False,
        skip_reading_prefix_cache: bool = False,
    ) -> Any:
        """A vLLM ``Request``. ``mm_features``: its multimodal inputs (their identifiers enter
        the block hashes, which the request computes as it is built). ``stop_token_ids``:
        tokens that stop it (``check_stop``); ``eos_token_id``: its EOS token, set as the
        engine's input processor sets it (``update_from_generation_config``), with
        ``ignore_eos`` off; without one, ignore_eos on: fabricated outputs must not stop a
        request early by chance. ``resumable``: a streaming-input session's request
        (``Request.resumable``, as ``AsyncLLM``'s streaming input submits each chunk).
        ``skip_reading_prefix_cache``: ``SamplingParams.skip_reading_prefix_cache``, what a
        request asking for prompt logprobs gets."""
        from vllm import SamplingParams

        # kv_cache_report_mode travels in extra_args, as a client's request carries it.
        extra: dict[str, Any] = (
            {"extra_args": {"kv_cache_report_mode": "full"}} if kv_cache_report_full else {}
        )
        if skip_reading_prefix_cache:
            extra["skip_reading_prefix_cache"] = True
        params = call(
            SamplingParams,
            max_tokens=max_tokens,
            ignore_eos=eos_token_id is None,
            stop_token_ids=list(stop_token_ids or ()),
            **extra,
        )
        if eos_token_id is not None:
            params.update_from_generation_config({}, eos_token_id)
        return call(
            self._request.Request,
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            pooling_params=None,
            block_hasher=block_hasher,
            priority=priority,
            mm_features=mm_features or None,
            resumable=resumable,
        )

    def block_hasher(
        self, hash_block_size: int, num_hash_lookahead_tokens: int = 0
    ) -> Callable[..., Any]:
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        hashing = self.optional_module("vllm.utils.hashing")
        hash_fn = getattr(hashing, "sha256", None) if hashing else None
        if hash_fn is None:
            hash_fn = getattr(importlib.import_module("vllm.utils"), "sha256", None)
        if hash_fn is None or not hasattr(utils, "get_request_block_hasher"):
            raise self.missing("a request block hasher (get_request_block_hasher, sha256)")
        utils.init_none_hash(hash_fn)
        hasher = utils.get_request_block_hasher
        if num_hash_lookahead_tokens:
            return typing.cast(
                Callable[..., Any], hasher(hash_block_size, hash_fn, num_hash_lookahead_tokens)
            )
        return typing.cast(Callable[..., Any], hasher(hash_block_size, hash_fn))

    def running_status(self) -> Any:
        return self._request.RequestStatus.RUNNING

    def preempted_status(self) -> Any:
        return self._request.RequestStatus.PREEMPTED

    def waiting_status(self) -> Any:
        return self._request.RequestStatus.WAITING

    def allocate_slots(self, manager: Any, request: Any, num_new_tokens: int, **kwargs: Any) -> Any:
        # Arguments at allocate_slots' declared defaults are left to them (calls.py says why).
        return call_leaving_defaults(
            manager.allocate_slots,
            request=request,
            num_new_tokens=num_new_tokens,
            **kwargs,
        )

    def computed_blocks(
        self, manager: Any, request: Any, max_cache_hit_length: int
    ) -> tuple[Any, int]:
        """The prefix-cache hit for a waiting request, at most ``max_cache_hit_length`` tokens.

        ``get_computed_blocks`` takes ``max_cache_hit_length`` from 0.33.0 on; before,
        the hit is capped only at ``num_tokens - 1`` and the result may have two or
        three values. A hit longer than the chunk cannot be expressed on such a release.
        """
        result = call(
            manager.get_computed_blocks, request=request, max_cache_hit_length=max_cache_hit_length
        )
        blocks, hit = result[0], int(result[1])
        if len(result) == 3:
            _pin_shared_prefix(request, result[2])
        if hit > max_cache_hit_length:
            raise self.not_offered(
                "KVCacheManager.get_computed_blocks(max_cache_hit_length=...)",
                f"the prefix-cache hit of {hit} tokens is longer than the first chunk allows "
                f"({max_cache_hit_length}); make the first prefill chunk longer than the shared prefix",
            )
        return blocks, hit

    def connector_computed_blocks(
        self, manager: Any, request: Any, max_cache_hit_length: int
    ) -> tuple[Any, int, bool]:
        """The local prefix-cache hit of a waiting request as vLLM's scheduler looks it up
        when its KV connector takes divergent local hybrid hits
        (``supports_divergent_local_hybrid_hits``: NixlConnector, MoRIIO):
        ``get_computed_blocks_for_connector``, whose blocks, hit and ``hit_diverged`` are
        returned. It takes ``max_cache_hit_length`` from 0.33.0 on; before, the hit is
        capped at ``num_tokens - 1`` (as :meth:`computed_blocks`)."""
        lookup = getattr(manager, "get_computed_blocks_for_connector", None)
        if lookup is None:
            raise self.not_offered("KVCacheManager.get_computed_blocks_for_connector")
        result = call(lookup, request=request, max_cache_hit_length=max_cache_hit_length)
        blocks, hit, diverged = result[0], int(result[1]), bool(result[-1])
        if len(result) == 4:
            _pin_shared_prefix(request, result[2])
        if hit > max_cache_hit_length:
            raise self.not_offered(
                "KVCacheManager.get_computed_blocks_for_connector(max_cache_hit_length=...)",
                f"the prefix-cache hit of {hit} tokens is longer than the first chunk allows "
                f"({max_cache_hit_length}); make the first prefill chunk longer than the shared prefix",
            )
        return blocks, hit, diverged

    def truncate_computed_blocks(self, manager: Any, blocks: Any, num_computed_tokens: int) -> Any:
        """The scheduler's cut of a lookup result at a block-aligned endpoint, where a
        longer remote hit supersedes a local sub-block tail (``truncate_computed_blocks``)."""
        truncate = getattr(manager, "truncate_computed_blocks", None)
        if truncate is None:
            raise self.not_offered("KVCacheManager.truncate_computed_blocks")
        return truncate(blocks, num_computed_tokens)

    def cache_blocks(self, manager: Any, request: Any, num_computed_tokens: int) -> None:
        if hasattr(manager, "cache_blocks"):
            call(manager.cache_blocks, request=request, num_computed_tokens=num_computed_tokens)

    def new_step_starts(self, manager: Any) -> None:
        """What ``Scheduler.schedule`` tells the manager first, every step (Mamba
        "align" forgets which blocks were cached this step)."""
        if hasattr(manager, "new_step_starts"):
            manager.new_step_starts()

    def release_block_copies(self, manager: Any) -> None:
        """What ``Scheduler.schedule`` does with the step's copy-on-write copies once every
        request is allocated: ``take_kv_cache_block_copies`` hands them to the worker and
        the blocks both ends of each copy were retained for go back (the synchronous
        scheduler frees them at once, ``_free_cow_retained_blocks``). Releases before
        0.33 have no copies."""
        take = getattr(manager, "take_kv_cache_block_copies", None)
        if take is None:
            return
        _, retained = take()
        if retained:
            manager.block_pool.free_blocks(retained)

    def null_block_id(self, manager: Any) -> int:
        return int(manager.block_pool.null_block.block_id)

    def free_block_count(self, manager: Any) -> int:
        return int(manager.block_pool.get_num_free_blocks())

    def pool_size(self, manager: Any) -> int:
        """The blocks of the manager's pool, the null block included."""
        return len(manager.block_pool.blocks)

    def block_refs(
        self, manager: Any, block_ids: Iterable[int]
    ) -> tuple[dict[int, int], frozenset[int]]:
        """The reference count of each of ``block_ids``, and those that hold cached KV."""
        blocks = manager.block_pool.blocks
        refs = {block: int(blocks[block].ref_cnt) for block in block_ids}
        hashed = frozenset(
            block for block in refs if getattr(blocks[block], "block_hash", None) is not None
        )
        return refs, hashed

    def request_keyed_state(
        self, manager: Any, request_ids: Collection[str]
    ) -> dict[str, frozenset[str]]:
        """The request ids each per-request structure of the KV-cache manager, its
        coordinator and its single-type managers holds: every dict or set attribute keyed
        by request ids (``req_to_blocks``, ``num_cached_block``, Mamba's ``_checkpoints``,
        ...), found by its keys, so that a structure a release adds is seen too."""
        owners: list[tuple[str, Any]] = [("KVCacheManager", manager)]
        coordinator = getattr(manager, "coordinator", None)
        if coordinator is not None:
            owners.append((type(coordinator).__name__, coordinator))
            for index, single in enumerate(getattr(coordinator, "single_type_managers", ())):
                owners.append((f"group {index} {type(single).__name__}", single))
        found: dict[str, frozenset[str]] = {}
        for label, owner in owners:
            for attribute, value in vars(owner).items():
                if not isinstance(value, dict | set | frozenset) or not value:
                    continue
                keys = frozenset(k for k in value if isinstance(k, str) and k in request_ids)
                if keys:
                    found[f"{label}.{attribute}"] = keys
        return found

    def block_is_cached(self, manager: Any, block_id: int) -> bool:
        """Whether a block of the manager's pool holds cached KV (it has a block hash)."""
        return getattr(manager.block_pool.blocks[block_id], "block_hash", None) is not None

    def watermark_blocks(self, manager: Any) -> int:
        """Blocks an admission must leave free while another request runs (0 before the
        manager had a watermark)."""
        return int(getattr(manager, "watermark_blocks", 0) or 0)

    def take_blocks_to_zero(self, manager: Any, groups: Sequence[int]) -> dict[int, list[int]]:
        """Group index -> the block ids that group handed out for the worker to zero since
        the last call (``take_new_block_ids``, drained as the scheduler drains it every
        step), for ``groups``, the manager's :meth:`recording_groups`."""
        managers = manager.coordinator.single_type_managers
        return {index: list(managers[index].take_new_block_ids()) for index in groups}

    def recording_groups(self, manager: Any) -> list[int] | None:
        """The groups whose new blocks vLLM zeroes (their managers record them); None where
        vLLM zeroes nothing (no ``needs_kv_cache_zeroing``, or a release without it)."""
        config = getattr(manager, "kv_cache_config", None)
        if not getattr(config, "needs_kv_cache_zeroing", False):
            return None
        return [
            index
            for index, group in enumerate(manager.coordinator.single_type_managers)
            if getattr(group, "records_new_block_ids", False)
        ]

    def zeroes_new_blocks(self, manager: Any) -> bool:
        """Whether this release hands the worker new blocks to zero at all (its
        ``KVCacheConfig`` has ``needs_kv_cache_zeroing``; #35219 added it)."""
        config = getattr(manager, "kv_cache_config", None)
        return hasattr(config, "needs_kv_cache_zeroing")

    def step_blocks_to_zero(self, output: Any) -> list[int]:
        """The block ids a ``SchedulerOutput`` hands the worker to zero."""
        return list(getattr(output, "new_block_ids_to_zero", None) or ())

    def step_sync_loads(self, output: Any) -> dict[str, int]:
        """Request id -> the tokens a synchronously loading KV connector writes in this
        step, as the ``SchedulerOutput`` tells the worker (``DecodeBenchConnector``'s
        ``reqs_to_fill``); empty for any other connector or none."""
        fills = getattr(getattr(output, "kv_connector_metadata", None), "reqs_to_fill", None)
        return {rid: int(tokens) for rid, (_, tokens) in (fills or {}).items()}

    def forwarded_default_disagreements(self, manager: Any) -> list[str]:
        """Where a single-type manager of ``manager`` declares another default than its
        coordinator for an argument of a method both define (the coordinator forwards
        ``get_num_blocks_to_allocate``' ``apply_admission_cap`` and ``prefill_end`` to
        every manager, ``remove_skipped_blocks``' ``num_prompt_tokens``): one line each.

        A caller that leaves the argument out, as ``HiSparseSourceManager`` calls its base
        class's ``get_num_blocks_to_allocate``, must get what the coordinator's callers get
        for the same omission. Read from the functions as they are now, never cached: a
        mutation campaign's child runs a mutated default under the clean run's caches.
        """
        coordinator = manager.coordinator
        lines = []
        seen: set[type] = set()
        for group in coordinator.single_type_managers:
            kind = type(group)
            if kind in seen:
                continue
            seen.add(kind)
            for name, coordinator_default, manager_default in _shared_defaults(
                type(coordinator), kind
            ):
                if coordinator_default != manager_default:
                    lines.append(
                        f"{kind.__name__}.{name} defaults to {manager_default!r} where "
                        f"{type(coordinator).__name__} defaults to {coordinator_default!r}"
                    )
        return lines

    def take_kv_cache_events(
        self, manager: Any, leave_out: Collection[int] = ()
    ) -> list[tuple[str, int, tuple[object, ...]]]:
        """The KV-cache events since the last call (``KVCacheManager.take_events``, drained
        as the scheduler drains them each step), as (kind, group, block hashes): kind
        ``stored``, ``removed`` or ``cleared`` (group -1, no hashes); those whose ``id`` is
        in ``leave_out`` are drained and left out."""
        return self.kv_cache_events(e for e in manager.take_events() if id(e) not in leave_out)

    def kv_cache_events(self, queued: Iterable[Any]) -> list[tuple[str, int, tuple[object, ...]]]:
        """vLLM's KV-cache events as (kind, group, block hashes): kind ``stored``,
        ``removed`` or ``cleared`` (group -1, no hashes); other events are left out."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        events: list[tuple[str, int, tuple[object, ...]]] = []
        for event in queued:
            if isinstance(event, AllBlocksCleared):
                events.append(("cleared", -1, ()))
            elif isinstance(event, (BlockStored, BlockRemoved)):
                kind = "stored" if isinstance(event, BlockStored) else "removed"
                group = -1 if event.group_idx is None else int(event.group_idx)
                events.append((kind, group, tuple(event.block_hashes)))
        return events

    def queued_kv_events(self, manager: Any) -> list[Any]:
        """The KV-cache events queued since the last ``take_events``, left in the queue."""
        return list(manager.block_pool.kv_event_queue)

    def announced_blocks(self, events: Sequence[Any]) -> list[tuple[int, tuple[object, ...]]]:
        """The ``BlockStored`` events among ``events``, as (group, block hashes)."""
        from vllm.distributed.kv_events import BlockStored

        return [
            (-1 if e.group_idx is None else int(e.group_idx), tuple(e.block_hashes))
            for e in events
            if isinstance(e, BlockStored)
        ]

    def hit_block_hashes(self, blocks: Any) -> dict[int, list[object]]:
        """Per group, the hashes a prefix hit's blocks are cached under, as KV-cache events
        carry them (None for a null column)."""
        utils = self._kv_cache_utils
        return {
            group: [
                None
                if block.block_hash is None
                else utils.maybe_convert_block_hash(utils.get_block_hash(block.block_hash))
                for block in group_blocks
            ]
            for group, group_blocks in enumerate(blocks.blocks)
        }

    def metrics_collector(self) -> Any:
        """A ``KVCacheMetricsCollector`` sampling every block, what the scheduler builds with
        ``ObservabilityConfig.kv_cache_metrics`` on and ``kv_cache_metrics_sample`` 1."""
        module = self.optional_module("vllm.v1.core.kv_cache_metrics")
        if module is None:
            raise self.missing("vllm.v1.core.kv_cache_metrics.KVCacheMetricsCollector")
        # The stats the scheduler records at each admission (0.26 on).
        if not hasattr(self._kvm.KVCacheManager, "record_prefix_cache_stats"):
            raise self.not_offered("KVCacheManager.record_prefix_cache_stats")
        return module.KVCacheMetricsCollector(1.0)

    def prefix_cache_stats(self, manager: Any) -> dict[str, Any]:
        """``make_prefix_cache_stats`` (taken and reset, as ``Scheduler.make_stats`` takes it
        each step) and the pool's ``usage``, as plain values; the metrics collector's
        eviction events are drained as ``make_stats`` drains them."""
        stats = manager.make_prefix_cache_stats()
        fields = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                  "preempted_hits", "reset")  # fmt: skip
        taken = {name: getattr(stats, name) for name in fields}
        taken["usage"] = manager.usage
        collector = getattr(manager, "metrics_collector", None)
        if collector is not None:
            collector.drain_events()  # as make_stats drains them; not judged
        return taken

    def cached_block_counts(self, manager: Any) -> dict[tuple[int, object], int]:
        """(group, block hash as the events carry it) -> the blocks the pools cache under it
        (the device pool, and a group's own pool where it has one: HiSparse's host source,
        whose events go to the device pool's queue)."""
        utils = self._kv_cache_utils
        pools = {id(manager.block_pool): manager.block_pool}
        for group in manager.coordinator.single_type_managers:
            pools.setdefault(id(group.block_pool), group.block_pool)
        counts: dict[tuple[int, object], int] = {}
        for pool in pools.values():
            cached = pool.cached_block_hash_to_block
            # By shape: to 0.33 a key maps to one block or a dict of its copies; from 0.34
            # to one block id, the ids of a key's copies kept apart (``_dup_ids``).
            copies = getattr(cached, "_dup_ids", None) or {}
            for key, blocks in cached._cache.items():
                event_key = (
                    utils.get_group_id(key),
                    utils.maybe_convert_block_hash(utils.get_block_hash(key)),
                )
                if isinstance(blocks, dict):
                    number = len(blocks)
                else:
                    number = len(copies[key]) if key in copies else 1
                counts[event_key] = counts.get(event_key, 0) + number
        return counts

    @cached_property
    def _kv_cache_utils(self) -> Any:
        return importlib.import_module("vllm.v1.core.kv_cache_utils")

    def hisparse_coordinator(self, manager: Any) -> Any | None:
        """vLLM's ``HiSparseCoordinator`` bound to the manager's HiSparse groups, built as
        ``get_hisparse_coordinator`` builds it before the first admission; None without a
        HiSparse layout. Its per-step work (``advance_scheduled``) is 0.32's."""
        config = manager.kv_cache_config
        if getattr(config, "hisparse_host_num_blocks", None) is None:
            return None
        module = self.optional_module("vllm.v1.hisparse.coordinator")
        if module is None:
            raise self.not_offered("vllm.v1.hisparse.coordinator")
        coordinator = module.get_hisparse_coordinator(manager)
        if not hasattr(coordinator, "advance_scheduled"):
            raise self.not_offered("HiSparseCoordinator.advance_scheduled")
        return coordinator

    def hisparse_step(self, coordinator: Any, scheduled: Mapping[str, tuple[int, int]]) -> None:
        """One step of HiSparse around the forward. Before it, what the HiSparse
        connector's scheduler side does once ``schedule()`` has allocated
        (``HiSparseConnectorScheduler.build_connector_meta``): the residency work of
        every scheduled request (``advance_scheduled`` with the tokens computed once the
        step completes), the page transfers, the host copies and the residency updates
        handed to the worker. After it, the worker's answer: every transfer done on its
        one worker and every host copy run (``update_spills``,
        ``release_completed_host_copies``), as vLLM's own tests answer for the worker.
        ``scheduled``: request id -> (tokens computed once the step completes, scheduled).
        """
        coordinator.advance_scheduled((rid, done) for rid, (done, _) in scheduled.items())
        command = coordinator.build_offload_command()
        copies = coordinator.take_host_block_copies()
        coordinator.take_residency_updates({rid: n for rid, (_, n) in scheduled.items()})
        transfers = getattr(command, "page_transfers", None) or ()
        counts = {transfer.transfer_id: 1 for transfer in transfers}
        coordinator.release_completed_host_copies([copy.dst_block_id for copy in copies])
        coordinator.update_spills(counts, counts)

    def retained_hit_groups(self, manager: Any) -> tuple[int, ...]:
        """The groups that keep a longer prefix hit than the others, which ``allocate_slots``
        trims to the computed tokens (``retained_hit_group_ids``, 0.30 on: HiSparse's host
        source); empty where there are none."""
        return tuple(getattr(manager, "retained_hit_group_ids", None) or ())

    def boundary_state_groups(self, manager: Any) -> list[int]:
        """The Mamba "align" groups whose cached boundary states vLLM hands a KV connector
        block by block (``KVCacheManager.take_boundary_state_offloads``, 0.29 on); empty
        where there are none or the release has no hand-off."""
        if not hasattr(manager, "take_boundary_state_offloads"):
            return []
        return [
            index
            for index, group in enumerate(manager.coordinator.single_type_managers)
            if getattr(group, "mamba_cache_mode", None) == "align"
        ]

    def boundary_states_cached(
        self, manager: Any, groups: Sequence[int]
    ) -> set[tuple[int, int, int]]:
        """(group, block id, tokens) of every block of the pool that holds the cache entry
        of a boundary state of one of ``groups`` (its primary hash, and the tokens it
        covers: ``block_hash_num_tokens``)."""
        get_group_id = self._kv_cache_utils.get_group_id
        wanted = set(groups)
        cached = set()
        for block in manager.block_pool.blocks:
            key = block.block_hash
            if key is None:
                continue
            group = get_group_id(key)
            if group in wanted:
                cached.add((group, block.block_id, block.block_hash_num_tokens))
        return cached

    def finalize_partial_tail_offers(
        self, manager: Any, request: Any
    ) -> list[tuple[int, int, int]] | None:
        """(group, block id, tokens) of the partial-tail boundary states a KV producer's
        finishing request hands its connector (``finalize_partial_tail_offloads``, which
        ``Scheduler._connector_finished`` calls before freeing); None where the release
        has no such call."""
        finalize = getattr(manager, "finalize_partial_tail_offloads", None)
        return None if finalize is None else list(finalize(request))

    def cached_key(self, manager: Any, block_id: int) -> object:
        """The prefix-cache key a block of the pool holds (None: not cached)."""
        return manager.block_pool.blocks[block_id].block_hash

    def take_boundary_state_offers(self, manager: Any) -> dict[str, list[tuple[int, int, int]]]:
        """Request id -> (group, block id, tokens) of the boundary states handed to a KV
        connector since the last call, drained as ``Scheduler.schedule`` drains them."""
        return dict(manager.take_boundary_state_offloads())

    def skips_zeroing_loaded_blocks(self, manager: Any) -> bool:
        """Whether the manager keeps the blocks an asynchronous KV load writes off its
        zeroing list (``allocate_slots(skip_zeroing_group_ids=...)``, 0.32 on); before, it
        lists them like any new block and the scheduler keeps them off the step's list."""
        return accepts_keyword(manager.allocate_slots, "skip_zeroing_group_ids")

    def hit_block_ids(self, blocks: Any) -> dict[int, list[int]]:
        """Group index -> the block ids of a prefix hit (``KVCacheBlocks``; None: no hit)."""
        groups = getattr(blocks, "blocks", None) or ()
        return {index: [block.block_id for block in group] for index, group in enumerate(groups)}

    def evictable_blocks(self, blocks: Any, null_block: int) -> int:
        """How many of a prefix hit's blocks sit in the free queue (no request holds them):
        taking them uses free blocks as a new allocation does."""
        groups = getattr(blocks, "blocks", None) or ()
        return sum(
            1
            for group in groups
            for block in group
            if block.block_id != null_block and getattr(block, "ref_cnt", 1) == 0
        )

    # -- the warmup predictor ---------------------------------------------------------

    @cached_property
    def reserved_block_count(self) -> Callable[..., int] | None:
        """vLLM's ``_reserved_block_count``, or None where this release lacks it."""
        try:
            warmup = importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception:  # noqa: BLE001 - an unimportable warmup means "no predictor"
            return None
        return getattr(warmup, "_reserved_block_count", None)

    def block_counter(
        self, *, num_lookahead_tokens: int, max_model_len: int, dcp_world_size: int = 1
    ) -> Callable[..., int] | None:
        """``_reserved_block_count`` bound as ``_warmup_block_counter`` binds it, or None
        where this release lacks it: ``(num_tokens, spec, max_encoder_len=...) -> blocks``.

        The keywords follow the release's signature (*by signature*): 0.28-0.33 take the
        lookahead, ``max_model_len`` and ``max_encoder_len``; 0.34 adds a required
        ``vllm_config`` (its count is capped at the worker's block-table row,
        ``KVCacheSpec.max_num_blocks_per_req``) and ``dcp_world_size`` (a
        ``dcp_sharded`` block spans ``block_size x dcp_world_size`` tokens), which the
        warmup reads from ``vllm_config.parallel_config.decode_context_parallel_size``.
        Releases without the keyword count DCP-blind, as their warmup does.
        """
        fn = self.reserved_block_count
        if fn is None:
            return None
        bound: dict[str, Any] = {
            "num_lookahead_tokens": num_lookahead_tokens,
            "max_model_len": max_model_len,
        }
        if accepts_keyword(fn, "dcp_world_size"):
            bound["dcp_world_size"] = dcp_world_size
        if accepts_keyword(fn, "vllm_config"):
            bound["vllm_config"] = self.predictor_vllm_config(dcp_world_size)
        return functools.partial(fn, **bound)

    def predictor_vllm_config(self, dcp_world_size: int = 1) -> Any:
        """The ``VllmConfig`` the predictor's row cap reads: vLLM's own, without a model.

        What ``max_num_blocks_per_req`` reads of it in 0.34 is the parallel config's
        ``decode_context_parallel_size`` (attention specs; Mamba specs are counted
        before the cap, cross-attention and circular buffers return earlier). So it is a
        real ``VllmConfig`` of a real ``ParallelConfig`` whose DCP size is the scenario's,
        on the fewest tensor-parallel ranks that allow it (DCP reuses the TP ranks:
        ``tp_size`` must be divisible by ``dcp_size``), and ``DeviceConfig("cpu")``, as
        scheduler mode builds its configs (vLLM cannot infer a device on a machine
        without one; nothing the cap reads depends on it). Built once per DCP size.
        """
        return self._remembered(
            ("predictor_vllm_config", dcp_world_size),
            lambda: self._model_free_vllm_config(dcp_world_size),
        )

    def _model_free_vllm_config(self, dcp_world_size: int) -> Any:
        config = importlib.import_module("vllm.config")
        with quiet_logs():
            parallel = call(
                config.ParallelConfig,
                tensor_parallel_size=dcp_world_size,
                decode_context_parallel_size=dcp_world_size,
            )
            return call(
                config.VllmConfig,
                parallel_config=parallel,
                device_config=call(config.DeviceConfig, device="cpu"),
            )

    def require_release(self, releases: str | None, what: str) -> None:
        """Raise :class:`NotOffered` unless this release is in ``releases`` (a version
        specifier): a scenario that states behaviour some releases introduced."""
        if releases is None:
            return
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion

        try:
            inside = SpecifierSet(releases).contains(release_of(self.version), prereleases=True)
        except InvalidVersion:
            return  # a source tree without a release number: run it
        if not inside:
            # The same words for every scenario written for the same releases, so that
            # the console folds them into one line that names their ids.
            raise NotOffered(
                self.version, f"what {what} states", f"{what} is written for vLLM {releases}"
            )

    def below_minimum(self) -> bool:
        """Older than :data:`MINIMUM_SUPPORTED` (such trees run for bisection only)."""
        from packaging.version import InvalidVersion, Version

        try:
            return Version(release_of(self.version)) < Version(MINIMUM_SUPPORTED)
        except InvalidVersion:
            return False

    def predictor_missing_reason(self) -> str:
        try:
            importlib.import_module("vllm.v1.worker.gpu.warmup")
        except Exception as exc:  # noqa: BLE001
            return f"vllm.v1.worker.gpu.warmup does not import ({type(exc).__name__}: {exc})"
        return f"vLLM {self.version} has no vllm.v1.worker.gpu.warmup._reserved_block_count"

    # -- speculative methods ----------------------------------------------------------

    @cached_property
    def _speculative(self) -> Any:
        return importlib.import_module("vllm.config.speculative")

    def declared_methods(self) -> tuple[str, ...]:
        """Every method name in vLLM's ``SpeculativeMethod`` literal, in order."""
        literal = getattr(self._speculative, "SpeculativeMethod", None)
        if literal is None:
            raise self.missing("vllm.config.speculative.SpeculativeMethod")
        return typing.cast(
            tuple[str, ...],
            self._remembered(
                ("declared_methods",), lambda: tuple(dict.fromkeys(flatten_literal(literal)))
            ),
        )

    def method_aliases(self) -> dict[str, str]:
        """Method names vLLM's SpeculativeConfig rewrites to another (MTP variants)."""
        return dict(self._aliases)

    @cached_property
    def _aliases(self) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for entry in METHODS.values():
            literal = getattr(self._speculative, entry.vllm_aliases or "", None)
            if literal is not None:
                names = flatten_literal(literal)
                aliases.update({n: entry.name for n in names if n != entry.name})
        return aliases

    def canonical_method(self, method: str) -> str:
        return self._aliases.get(method, method)

    def _config_holder(
        self,
        method: str,
        k: int,
        sample_from_anchor: bool,
        enable_caching: bool,
        disable_lookahead_block_hashes: bool = False,
    ) -> SimpleNamespace:
        """What ``VllmConfig``'s speculative properties read, without a model.

        Built the way vLLM's own test builds it: a ``SpeculativeConfig`` made with
        ``object.__new__`` holding the method and k, plus the few attributes the
        properties read (the DSpark layout, the block-drop switches, prefix caching).
        """
        spec = object.__new__(self._speculative.SpeculativeConfig)
        hf_config = SimpleNamespace(sample_from_anchor=sample_from_anchor)
        for name, value in (
            ("method", self.canonical_method(method)),
            ("num_speculative_tokens", k),
            ("draft_model_config", SimpleNamespace(hf_config=hf_config)),
            ("disable_eagle_block_drop", False),
            ("disable_lookahead_block_hashes", disable_lookahead_block_hashes),
        ):
            object.__setattr__(spec, name, value)
        return SimpleNamespace(
            speculative_config=spec,
            num_speculative_tokens=k,
            cache_config=SimpleNamespace(enable_prefix_caching=enable_caching),
            kv_transfer_config=None,
        )

    def _config_property(self, name: str, holder: SimpleNamespace) -> int | None:
        """``VllmConfig.<name>`` for ``holder``, or None where this release has no such value.

        Read from the property where it is one; where the release resolves it once into
        a field after the configs are final (0.34's ``num_hash_lookahead_tokens``,
        ``VllmConfig._resolve_num_hash_lookahead_tokens``), from that resolver.
        """
        config = importlib.import_module("vllm.config")
        prop = getattr(config.VllmConfig, name, None)
        if isinstance(prop, property) and prop.fget is not None:
            value = int(prop.fget(holder))
        else:
            resolve = getattr(config.VllmConfig, f"_resolve_{name}", None)
            if resolve is None:
                return None
            value = int(resolve(holder))
        setattr(holder, name, value)  # later properties read earlier ones through self
        return value

    def lookahead(
        self, method: str | None, num_speculative_tokens: int, sample_from_anchor: bool = True
    ) -> int | None:
        """``VllmConfig.num_lookahead_tokens`` for a method, or None if this vLLM lacks it."""
        key = ("lookahead", method, num_speculative_tokens, sample_from_anchor)
        return typing.cast(
            "int | None",
            self._remembered(
                key, lambda: self._lookahead(method, num_speculative_tokens, sample_from_anchor)
            ),
        )

    def _lookahead(
        self, method: str | None, num_speculative_tokens: int, sample_from_anchor: bool
    ) -> int | None:
        if method is None:
            return self._config_property(
                "num_lookahead_tokens", SimpleNamespace(speculative_config=None)
            )
        holder = self._config_holder(method, num_speculative_tokens, sample_from_anchor, False)
        return self._config_property("num_lookahead_tokens", holder)

    def manager_options(
        self,
        method: str | None,
        k: int,
        sample_from_anchor: bool,
        enable_caching: bool,
        disable_lookahead_block_hashes: bool = False,
    ) -> dict[str, int | bool]:
        """The speculative keywords vLLM's ``Scheduler`` passes to ``KVCacheManager``.

        ``use_eagle`` (trailing prefix-cache block drop) is ``use_eagle()`` before
        0.30 and ``use_eagle_block_drop()`` after; 0.33 replaces the drop with
        lookahead block hashes (``num_hash_lookahead_tokens``) under prefix
        caching; ``num_prefill_lookahead`` exists from 0.28. Keywords a release's
        ``KVCacheManager`` does not take are dropped when it is built.
        """
        no_hashes = disable_lookahead_block_hashes
        key = ("manager_options", method, k, sample_from_anchor, enable_caching, no_hashes)
        options = self._remembered(
            key,
            lambda: self._manager_options(method, k, sample_from_anchor, enable_caching, no_hashes),
        )
        return dict(options)

    def eagle_block_drop(self, method: str, k: int, sample_from_anchor: bool = True) -> bool:
        """``SpeculativeConfig.use_eagle_block_drop()`` (``use_eagle()`` before it existed):
        whether vLLM's planner flags the groups holding draft layers as EAGLE groups."""
        spec = self._config_holder(method, k, sample_from_anchor, False).speculative_config
        drop = getattr(spec, "use_eagle_block_drop", None) or spec.use_eagle
        return bool(drop())

    def _manager_options(
        self,
        method: str | None,
        k: int,
        sample_from_anchor: bool,
        enable_caching: bool,
        disable_lookahead_block_hashes: bool = False,
    ) -> dict[str, int | bool]:
        if method is None:
            return {}
        holder = self._config_holder(
            method, k, sample_from_anchor, enable_caching, disable_lookahead_block_hashes
        )
        spec = holder.speculative_config
        drop = getattr(spec, "use_eagle_block_drop", None) or spec.use_eagle
        options: dict[str, int | bool] = {"use_eagle": bool(drop())}
        prefill = self._config_property("num_prefill_lookahead_tokens", holder)
        if prefill is not None:
            options["num_prefill_lookahead"] = prefill
        hashes = self._config_property("num_hash_lookahead_tokens", holder)
        if hashes:
            options["num_hash_lookahead_tokens"] = hashes
            options["use_eagle"] = False  # lookahead hashes prove the boundary token
        return options

    def speculative_config(
        self, method: str, num_speculative_tokens: int, sample_from_anchor: bool = True
    ) -> Any:
        """A ``SpeculativeConfig`` without a model, as vLLM's own test makes one."""
        return self._config_holder(
            method, num_speculative_tokens, sample_from_anchor, False
        ).speculative_config


def _pin_shared_prefix(request: Any, boundary: Any) -> None:
    """What ``Scheduler.schedule`` does with a lookup's ``shared_prefix_boundary`` (the
    junction of a shared prefix a sparse-retention group has not cached): it stores it on
    the request, whose ``cache_blocks`` then keeps that junction reachable."""
    if hasattr(request, "shared_prefix_boundary"):
        request.shared_prefix_boundary = int(boundary)


def _tree_file(cls: type) -> str:
    """The file defining ``cls``, from the folder holding ``vllm/`` (``vllm/v1/...py``)."""
    module = importlib.import_module(cls.__module__)
    stem = cls.__module__.replace(".", "/")
    origin = getattr(module, "__file__", None) or ""
    return f"{stem}/__init__.py" if origin.endswith("__init__.py") else f"{stem}.py"


def _declared_defaults(fn: Any) -> dict[str, Any]:
    """Parameter name -> default, read from the function object itself (no cache)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    positional = code.co_varnames[: code.co_argcount]
    values = fn.__defaults__ or ()
    found = dict(zip(positional[len(positional) - len(values) :], values, strict=True))
    found.update(fn.__kwdefaults__ or {})
    return found


def _shared_defaults(left: type, right: type) -> Iterator[tuple[str, Any, Any]]:
    """(method.parameter, left's default, right's default) for every parameter both
    classes' methods of one name declare a default for."""
    for method in sorted(set(dir(left)) & set(dir(right))):
        if method.startswith("__"):
            continue
        ours = _declared_defaults(getattr(left, method, None))
        theirs = _declared_defaults(getattr(right, method, None))
        for parameter in sorted(set(ours) & set(theirs)):
            yield f"{method}({parameter})", ours[parameter], theirs[parameter]
