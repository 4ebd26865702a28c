# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A manager is built for every registered KV-cache spec, with the coordinator's keywords.

``KVCacheCoordinator.__init__`` builds each group's manager through
``get_manager_for_kv_cache_spec``, which calls the registered manager class with
one set of keywords for every group. A manager that spells out its own keyword
list instead of forwarding ``**kwargs`` breaks as soon as a keyword is added:
``SinkFullAttentionManager.__init__`` lacks ``needs_kv_cache_zeroing``, so
``KVCacheManager`` construction raises ``TypeError`` for a
``SinkFullAttentionSpec`` group, and every model with ``StaticSinkAttention``
layers (openPangu) fails at engine start. (0.23.0-0.25.1 had the same break on
``scheduler_block_size``: vllm#44951.)

The keywords are recorded from a real ``KVCacheManager`` construction. The first
test builds a manager for every spec in ``KVCacheSpecRegistry`` with them, each
spec made from its required fields; the second binds them to the constructor of
every registered manager class, role managers included, so that a new keyword
or a new manager with its own list fails here rather than at engine start.

kvconform's scenario sink-full-attention-manager-builds (scenarios/specs/) found
it against vLLM 0.23.0 to vLLM 0.34.0. Written by hand for vLLM 0.34.0; it
belongs in tests/v1/core/ of that release's tree and uses its test helpers.
"""

import dataclasses
import inspect

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager
from vllm.v1.core import single_type_kv_cache_manager
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_cache_spec_registry import (
    _REGISTRY_KVCACHESPEC_LIST,
    _REGISTRY_ROLE_MANAGERS,
    KVCacheSpecRegistry,
)

pytestmark = pytest.mark.cpu_test

# A value for each required field of the registered specs, by field name.
FIELD_VALUES = {
    "block_size": 16,
    "num_kv_heads": 1,
    "head_size": 8,
    "dtype": torch.float16,
    "sliding_window": 64,
    "attention_chunk_size": 64,
    "rswa_window": 64,
    "page_size": 16,
    "blocks_per_request": 4,
    "shapes": ((8,),),
    "dtypes": (torch.float16,),
}
# What a spec needs beyond its required fields to be valid with prefix caching on.
SPEC_EXTRAS = {
    "SinkFullAttentionSpec": {"sink_len": 32},
    "MambaSpec": {"mamba_cache_mode": "align"},
}


def _coordinator_keywords(monkeypatch) -> dict:
    """The keywords a full-attention group's manager class is called with."""
    seen: list[dict] = []
    real = KVCacheSpecRegistry.get_manager_class.__func__

    def recording_manager_class(cls, kv_cache_spec, role=None):
        manager_class = real(cls, kv_cache_spec, role)

        def build(spec, **kwargs):
            seen.append(kwargs)
            return manager_class(spec, **kwargs)

        return build

    monkeypatch.setattr(
        KVCacheSpecRegistry, "get_manager_class", classmethod(recording_manager_class)
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    config = KVCacheConfig(
        num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    make_kv_cache_manager(config, max_model_len=512, hash_block_size=16)
    monkeypatch.undo()
    (keywords,) = seen
    return keywords


def _registered_specs() -> dict[type, type]:
    single_type_kv_cache_manager.register_all_kvcache_specs(None)
    return {
        spec_cls: metadata.manager_class
        for spec_cls, metadata in _REGISTRY_KVCACHESPEC_LIST.items()
    }


def _spec(spec_cls: type):
    required = [
        field.name
        for field in dataclasses.fields(spec_cls)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in FIELD_VALUES]
    assert not missing, f"give {spec_cls.__name__}'s fields {missing} a value in FIELD_VALUES"
    return spec_cls(
        **{name: FIELD_VALUES[name] for name in required},
        **SPEC_EXTRAS.get(spec_cls.__name__, {}),
    )


def test_every_registered_spec_builds_a_manager(monkeypatch):
    keywords = _coordinator_keywords(monkeypatch)
    specs = _registered_specs()
    assert len(specs) > 10 and FullAttentionSpec in specs
    refused = {}
    for spec_cls, manager_class in specs.items():
        keywords["block_pool"] = BlockPool(
            num_gpu_blocks=64, enable_caching=True, hash_block_size=16
        )
        try:
            manager = single_type_kv_cache_manager.get_manager_for_kv_cache_spec(
                _spec(spec_cls), max_in_flight_tokens=512, max_model_len=512, **keywords
            )
        except TypeError as exc:
            refused[spec_cls.__name__] = f"{type(exc).__name__}: {exc}"
            continue
        assert isinstance(manager, manager_class)
    assert not refused, (
        "the coordinator builds every group's manager with the keywords "
        f"{sorted(keywords)}; these specs' managers raise at engine start: {refused}"
    )


def test_every_registered_manager_takes_the_coordinators_keywords(monkeypatch):
    keywords = _coordinator_keywords(monkeypatch)
    managers = {spec_cls.__name__: manager for spec_cls, manager in _registered_specs().items()}
    managers.update(
        {f"role {role}": manager for role, manager in _REGISTRY_ROLE_MANAGERS.items()}
    )
    refused = {}
    for name, manager_class in managers.items():
        try:
            inspect.signature(manager_class).bind(object(), **keywords)
        except TypeError as exc:
            refused[name] = f"{manager_class.__name__}: {exc}"
    assert not refused, (
        "the coordinator builds every group's manager with the keywords "
        f"{sorted(keywords)}; these managers would raise TypeError at engine start: "
        f"{refused}"
    )
