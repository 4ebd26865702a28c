# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every registered KV-cache spec's manager takes what the coordinator passes.

``KVCacheCoordinator.__init__`` builds each group's manager through
``get_manager_for_kv_cache_spec``, which calls the registered manager class with
one set of keywords for every group. A manager that spells out its own keyword
list instead of forwarding ``**kwargs`` breaks as soon as a keyword is added:
``SinkFullAttentionManager.__init__`` lacks ``needs_kv_cache_zeroing``, so
``KVCacheManager`` construction raises ``TypeError`` for a
``SinkFullAttentionSpec`` group, and every model with ``StaticSinkAttention``
layers (openPangu) fails at engine start. (0.23.0-0.25.1 had the same break on
``scheduler_block_size``: vllm#44951.)

The keywords are recorded from a real ``KVCacheManager`` construction, then
bound to the constructor of the manager class of every spec in
``KVCacheSpecRegistry`` (and every role manager), so that a new keyword or a new
manager with its own list fails here rather than at a user's engine start; the
sink-attention group is then built for real.

kvconform's scenario sink-full-attention-manager-builds (scenarios/specs/) found
it against vLLM 0.23.0 to vLLM 0.34.0. Written by hand for vLLM 0.34.0; it
belongs in tests/v1/core/ of that release's tree and uses its test helpers.
"""

import inspect

import pytest
import torch

from tests.v1.core.test_prefix_caching import make_kv_cache_manager
from vllm.v1.core import single_type_kv_cache_manager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SinkFullAttentionSpec,
)
from vllm.v1.kv_cache_spec_registry import (
    _REGISTRY_KVCACHESPEC_LIST,
    _REGISTRY_ROLE_MANAGERS,
    KVCacheSpecRegistry,
)

pytestmark = pytest.mark.cpu_test


def _config(spec) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=32,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def _coordinator_keywords(monkeypatch) -> dict:
    """The keywords a full-attention group's manager is built with."""
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
    make_kv_cache_manager(_config(spec), max_model_len=512, hash_block_size=16)
    monkeypatch.undo()
    (keywords,) = seen
    return keywords


def _registered_managers() -> dict[str, type]:
    single_type_kv_cache_manager.register_all_kvcache_specs(None)
    managers = {
        spec_cls.__name__: metadata.manager_class
        for spec_cls, metadata in _REGISTRY_KVCACHESPEC_LIST.items()
    }
    managers.update(
        {f"role {role}": manager for role, manager in _REGISTRY_ROLE_MANAGERS.items()}
    )
    return managers


def test_every_registered_manager_takes_the_coordinators_keywords(monkeypatch):
    keywords = _coordinator_keywords(monkeypatch)
    managers = _registered_managers()
    assert "SinkFullAttentionSpec" in managers and "FullAttentionSpec" in managers
    refused = {}
    for spec_name, manager_class in managers.items():
        try:
            inspect.signature(manager_class).bind(object(), **keywords)
        except TypeError as exc:
            refused[spec_name] = f"{manager_class.__name__}: {exc}"
    assert not refused, (
        "the coordinator builds every group's manager with the keywords "
        f"{sorted(keywords)}; these managers would raise TypeError at engine start: "
        f"{refused}"
    )


def test_sink_full_attention_group_builds():
    spec = SinkFullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, sink_len=32
    )
    manager = make_kv_cache_manager(_config(spec), max_model_len=512, hash_block_size=16)
    assert isinstance(
        manager.coordinator.single_type_managers[0],
        single_type_kv_cache_manager.SinkFullAttentionManager,
    )
