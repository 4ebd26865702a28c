"""The facade's speculative methods and lookahead: the methods vLLM declares and their
aliases, ``VllmConfig.num_lookahead_tokens`` and the speculative keywords vLLM's scheduler
passes to ``KVCacheManager``, read from vLLM's config without a model."""

from __future__ import annotations

import importlib
import inspect
import typing
from functools import cached_property
from types import SimpleNamespace
from typing import Any

from kvconform.model.methods import METHODS
from kvconform.oracles.vllm.base import VllmBase
from kvconform.oracles.vllm.calls import flatten_literal


class MethodsPart(VllmBase):
    """Speculative methods and the lookahead."""

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

    def budget_refusal(
        self, method: str, k: int, sample_from_anchor: bool, max_num_batched_tokens: int
    ) -> str | None:
        """Why this vLLM's ``VllmConfig`` refuses ``max_num_batched_tokens`` under speculative
        decoding, or None where it takes it. 0.34.0's ``_set_max_num_scheduled_tokens``
        refuses a budget of at most ``num_lookahead_tokens`` ("does not have enough slots
        to schedule a token"); a release whose validator does not compare the two takes it.
        Drivers that run vLLM's code without its ``VllmConfig`` (the warmup's stub runner)
        ask this first, so that they do not run what vLLM would never start."""
        if not self._budget_checked_against_lookahead:
            return None
        lookahead = self.lookahead(method, k, sample_from_anchor)
        if lookahead is None or max_num_batched_tokens > lookahead:
            return None
        return (
            f"VllmConfig refuses max_num_batched_tokens={max_num_batched_tokens} with "
            f"num_lookahead_tokens={lookahead} ({method}, k {k}): not enough slots to "
            "schedule a token (VllmConfig._set_max_num_scheduled_tokens)"
        )

    @cached_property
    def _budget_checked_against_lookahead(self) -> bool:
        config = getattr(importlib.import_module("vllm.config.vllm"), "VllmConfig", None)
        check = getattr(config, "_set_max_num_scheduled_tokens", None)
        if check is None:
            return False
        try:
            return "num_lookahead_tokens" in inspect.getsource(check)
        except (OSError, TypeError):
            return False

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
