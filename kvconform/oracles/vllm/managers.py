"""The facade's managers and requests: a ``KVCacheConfig`` and ``KVCacheManager`` for a
scenario's groups, vLLM's ``Request`` and block hasher, the allocator's calls as vLLM's
scheduler makes them, and what the pool and the single-type managers hold."""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from kvconform.oracles.vllm.base import _RETENTION_VARIABLE, _UNSET, VllmBase, environment_variable
from kvconform.oracles.vllm.calls import (
    accepts_keyword,
    call,
    call_leaving_defaults,
    quiet_logs,
)

# The structures request_keyed_state reads, as a tuple: ``dict | set | frozenset`` written in
# the loop builds a union per attribute, three times the cost of the check itself.
_KEYED_BY = (dict, set, frozenset)


class ManagersPart(VllmBase):
    """Managers, requests and the allocator's calls."""

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
        if len(specs) > 1 and all(spec == specs[0] for spec in specs) and self._needs_two_specs():
            # Groups all of one spec, which vLLM's planner never builds (it puts the layers
            # of one spec in one group, get_kv_cache_groups): 0.28.0's hybrid coordinator
            # asserts "requires at least two attention groups" for them (the explorer's
            # seed-0 run on 0.28.0, docs/explore.md, eighth stop); 0.29.0 on look them up as
            # one group.
            raise self.not_offered(
                "KV-cache groups all of one spec", "its hybrid coordinator needs two specs"
            )
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
        with environment_variable(_RETENTION_VARIABLE, retention):
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

    def table_reader(self, manager: Any) -> Callable[[str], tuple[tuple[int, ...], ...]]:
        """A reader of a request's block ids per group, as ``get_block_ids`` answers, read
        from the single-type managers' ``req_to_blocks`` (what ``KVCacheCoordinator.get_blocks``
        reads) without building a ``KVCacheBlocks`` per read: the pool census reads every
        live table each step. ``.get`` never adds a request's entry to the defaultdicts (the
        bookkeeping family counts their keys). A manager without single-type managers is
        read through ``get_block_ids``."""
        managers = getattr(getattr(manager, "coordinator", None), "single_type_managers", None)
        if managers is None:
            return lambda name: tuple(tuple(ids) for ids in manager.get_block_ids(name))
        stores = [m.req_to_blocks for m in managers]

        def read(name: str) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple([b.block_id for b in store.get(name) or ()]) for store in stores)

        return read

    def _needs_two_specs(self) -> bool:
        """Whether the release's ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``
        asserts two distinct specs ("requires at least two attention groups", 0.28.0)."""
        module = self.optional_module("vllm.v1.core.kv_cache_coordinator")
        hybrid = getattr(module, "HybridKVCacheCoordinator", None)
        verify = getattr(hybrid, "verify_and_split_kv_cache_groups", None)
        if verify is None:
            return False
        try:
            return "requires at least two attention groups" in inspect.getsource(verify)
        except (OSError, TypeError):
            return False

    def pinned_blocks(self, manager: Any) -> tuple[int, ...]:
        """The blocks the manager pins for a KV connector's partial-tail offload, each
        once per pin: vLLM 0.28.0's ``KVCacheManager.take_partial_tail_offloads`` (which
        ``Scheduler.schedule`` calls every step) touches each handed-off Mamba "align"
        boundary block, a reference no request table holds, and keeps it in
        ``_partial_tail_pins`` until the request's blocks are freed (``free``,
        ``pop_blocks_for_free``). 0.29.0 hands the blocks over without a pin
        (``take_boundary_state_offloads``); empty there and wherever nothing is pinned."""
        pins = getattr(manager, "_partial_tail_pins", None) or {}
        return tuple(block.block_id for blocks in pins.values() for block in blocks)

    def block_refs(
        self, manager: Any, block_ids: Iterable[int]
    ) -> tuple[dict[int, int], frozenset[int]]:
        """The reference count of each of ``block_ids``, and those that hold cached KV."""
        blocks = manager.block_pool.blocks
        refs: dict[int, int] = {}
        hashed = []
        for block_id in block_ids:
            block = blocks[block_id]
            refs[block_id] = block.ref_cnt
            if block.block_hash is not None:
                hashed.append(block_id)
        return refs, frozenset(hashed)

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
                if not isinstance(value, _KEYED_BY) or not value:
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

    def zeroes_new_blocks(self, manager: Any) -> bool:
        """Whether this release hands the worker new blocks to zero at all (its
        ``KVCacheConfig`` has ``needs_kv_cache_zeroing``; #35219 added it)."""
        config = getattr(manager, "kv_cache_config", None)
        return hasattr(config, "needs_kv_cache_zeroing")

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
        for the same omission. Remembered per coordinator and manager classes: a mutation
        campaign's child that mutates a default forgets the answers first
        (:meth:`forget_answers`).
        """
        coordinator = type(manager.coordinator)
        kinds = tuple(dict.fromkeys(type(g) for g in manager.coordinator.single_type_managers))

        def disagreements() -> list[str]:
            return [
                f"{kind.__name__}.{name} defaults to {manager_default!r} where "
                f"{coordinator.__name__} defaults to {coordinator_default!r}"
                for kind in kinds
                for name, coordinator_default, manager_default in _shared_defaults(
                    coordinator, kind
                )
                if coordinator_default != manager_default
            ]

        return list(self._remembered(("forwarded defaults", coordinator, kinds), disagreements))


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


# (left, right) -> the methods both classes define. The names are fixed by the classes (a
# mutated tree is imported anew, as new classes); the defaults are read every time.
_SHARED_METHODS: dict[tuple[type, type], list[str]] = {}


def _shared_defaults(left: type, right: type) -> Iterator[tuple[str, Any, Any]]:
    """(method.parameter, left's default, right's default) for every parameter both
    classes' methods of one name declare a default for."""
    methods = _SHARED_METHODS.get((left, right))
    if methods is None:
        methods = _SHARED_METHODS[(left, right)] = sorted(
            m for m in set(dir(left)) & set(dir(right)) if not m.startswith("__")
        )
    for method in methods:
        ours = _declared_defaults(getattr(left, method, None))
        theirs = _declared_defaults(getattr(right, method, None))
        for parameter in sorted(set(ours) & set(theirs)):
            yield f"{method}({parameter})", ours[parameter], theirs[parameter]
