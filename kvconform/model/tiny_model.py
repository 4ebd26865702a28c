"""The tiny models kvconform writes for vLLM to build: config only, no weights.

Scheduler and engine scenarios need a ``ModelConfig`` (and, for methods with a
drafter model, a draft's), which vLLM builds from a model folder. kvconform
writes the smallest decoder that a given architecture allows as a
``transformers`` config, never downloads one and never loads weights (the
engine runs with ``load_format="dummy"``). :class:`TinyModel` is its shape,
plain data; :mod:`kvconform.oracles.tiny_models` writes the folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

# The architectures kvconform writes, and the transformers model type of each
# (what ``transformers.AutoConfig.for_model`` takes).
ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {
        "LlamaForCausalLM": "llama",
        "Qwen2ForCausalLM": "qwen2",
        "MistralForCausalLM": "mistral",
        # vLLM's SpeculativeConfig turns a MiMo target into its MTP draft ("mimo_mtp").
        "MiMoForCausalLM": "qwen2",
        "DFlashDraftModel": "qwen3",
    }
)
# What a scenario's engine section may name as its target.
ENGINE_TARGETS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
# Config values kvconform writes for an architecture whatever the shape, where the
# transformers default would build something other than what a scenario states: every
# model kvconform writes is a full-attention decoder (the scenario's one group type).
ARCHITECTURE_CONFIG: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # transformers' MistralConfig defaults sliding_window to 4096, which vLLM builds
        # as a sliding window on every layer (ModelConfig.get_sliding_window ->
        # CacheConfig.sliding_window -> Attention): SlidingWindowSpec groups. (A keyword,
        # not a string: the config key shares its name with a group type, which only the
        # group type registry spells.)
        "MistralForCausalLM": MappingProxyType(dict(sliding_window=None)),
    }
)


@dataclass(frozen=True)
class TinyModel:
    """A config-only decoder: its architecture, sizes and config extras."""

    architecture: str = "LlamaForCausalLM"
    layers: int = 2
    hidden_size: int = 256
    intermediate_size: int = 512
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 1024
    max_position_embeddings: int = 1024
    # The engine's dtype (an argument of the engine, not written into the config).
    dtype: str = "bfloat16"
    # Extra config keys (MTP modules, DSpark's layout, EAGLE-3's auxiliary layers),
    # written as given, after the architecture's ARCHITECTURE_CONFIG.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"unknown architecture {self.architecture!r}; known: {', '.join(ARCHITECTURES)}"
            )
        # A plain dict, JSON-able (engine settings), and part of the model folder's key.
        extra = {**ARCHITECTURE_CONFIG.get(self.architecture, {}), **self.extra}
        object.__setattr__(self, "extra", extra)

    def config(self) -> dict[str, Any]:
        """The ``transformers`` config values of this model (architecture excluded)."""
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.max_position_embeddings,
            **self.extra,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TinyModel:
        return cls(**raw)


# Scheduler mode's decoder: as small as vLLM accepts, and a context long enough for
# any scenario's max_model_len.
SCHEDULER_TARGET = TinyModel(
    vocab=1000, hidden_size=64, intermediate_size=128, max_position_embeddings=131072
)
