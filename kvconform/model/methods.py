"""The speculative methods kvconform knows: one registry entry per method.

A :class:`Method` entry says, for one of vLLM's canonical speculative methods:

* its **lookahead rule**: how many KV slots past the scheduled range its drafter
  writes, written from what the drafter does, with the reason. vLLM's own
  answer is ``VllmConfig.num_lookahead_tokens``; the ``lookahead`` check holds
  the two against each other, so a new method falling into vLLM's ``return 0``
  branch, or a ``+ 1`` lost, is caught;
* the **models** scheduler and engine scenarios build for it: the target (a
  plain decoder unless the method drafts from the target's own checkpoint) and
  the draft model, if the method has one (:class:`~kvconform.model.tiny_model.TinyModel`),
  plus the ``SpeculativeConfig`` options it needs;
* engine mode's draft (:class:`EngineDraft`): the architecture kvconform writes
  the draft as, for a given target, so that vLLM's engine builds it, and what the
  draft must share with the target; or why engine mode cannot run the method
  with the targets kvconform writes (``engine_refusal``; the loader refuses);
* what the loader and the fuzzer need to know: whether it has DSpark's two
  layouts (``sample_from_anchor``), whether it stacks MTP modules, the vLLM
  literal type that lists its aliases, and where the fuzzer ranks it.

Method names vLLM declares but no entry knows are reported by the ``lookahead``
check and by ``kvconform methods`` / ``doctor``: a new method needs a deliberate
entry, either here (:data:`BUILTIN_METHODS`) or, without changing kvconform, in a
*methods file* beside the scenarios (``methods.yaml``; docs/adding-a-method.md),
whose entries :func:`use_methods` adds to the registry at the start of a session.

**The one place the registry is extended.** :data:`METHODS` is a live view of the
registry in use: the built-in entries plus the extra ones last given to
:func:`use_methods`. Every reader (the loader, the oracles, the checks, the fuzzer,
``methods`` and ``doctor``) reads it or :func:`method_for`; nothing copies it at
import. :func:`kvconform.harness.methods_file.use_methods_for` is the one caller
outside tests: the session calls it for the scenario paths it runs (and
``methods`` / ``doctor`` / ``fuzz`` for theirs) before anything is loaded."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvconform.model.tiny_model import SCHEDULER_TARGET, TinyModel

__all__ = [
    "BUILTIN_METHODS",
    "EngineDraft",
    "LookaheadRule",
    "ADDING_A_METHOD",
    "MethodOption",
    "METHODS",
    "METHODS_FILE",
    "Method",
    "ONE_LAYER_DRAFT",
    "REGISTRY_FILE",
    "expected_lookahead",
    "extra_methods",
    "how_to_add",
    "method_for",
    "registry",
    "rule_from_formula",
    "use_methods",
]

# Where the built-in entries live: what `methods`, `doctor` and the lookahead check
# tell a user to edit (or to extend with a methods file, METHODS_FILE beside the
# scenarios: kvconform.harness.methods_file).
REGISTRY_FILE = "kvconform/model/methods.py"
METHODS_FILE = "methods.yaml"
# The guide both point to.
ADDING_A_METHOD = "docs/adding-a-method.md"


@dataclass(frozen=True)
class LookaheadRule:
    """How many slots a drafter writes past the scheduled range, and why."""

    formula: str
    lookahead: Callable[[int, bool], int]  # (k, sample_from_anchor) -> slots
    reason: str


# A methods file's lookahead formulas: `k`, `k + 1`, `k - 1`, `2 * k + 1`, `0`, ...
_FORMULA = re.compile(
    r"^(?:(?:(?P<times>\d+) ?\* ?)?k(?: ?(?P<sign>[+-]) ?(?P<add>\d+))?|(?P<const>\d+))$"
)


def _linear(formula: str) -> Callable[[int], int]:
    """``k -> slots`` for one formula of the restricted grammar, or ValueError."""
    match = _FORMULA.match(" ".join(formula.split()))
    if match is None:
        raise ValueError(
            f"{formula!r} is not a lookahead formula: write `k`, `k + N`, `k - N`, `M * k + N` "
            "or a number N (k is num_speculative_tokens)"
        )
    if match["const"] is not None:
        const = int(match["const"])
        return lambda k: const
    times = int(match["times"] or 1)
    add = int(match["add"] or 0) * (-1 if match["sign"] == "-" else 1)
    if add < -times:  # negative for k = 1
        raise ValueError(f"{formula!r} is negative for k = 1")
    return lambda k: times * k + add


def rule_from_formula(reason: str, formula: str, fill_in: str | None = None) -> LookaheadRule:
    """A :class:`LookaheadRule` from formulas of the restricted grammar.

    ``formula`` alone: the same for both of DSpark's layouts; with ``fill_in``, it is
    the anchor layout's (``sample_from_anchor: true``) and ``fill_in`` the other's.
    """
    anchor_slots = _linear(formula)
    if fill_in is None:
        return LookaheadRule(" ".join(formula.split()), lambda k, anchor: anchor_slots(k), reason)
    fill_slots = _linear(fill_in)
    return LookaheadRule(
        f"{' '.join(formula.split())} (anchor) | {' '.join(fill_in.split())} (fill-in)",
        lambda k, anchor: anchor_slots(k) if anchor else fill_slots(k),
        reason,
    )


def _no_extra(target: TinyModel) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class EngineDraft:
    """Engine mode's draft model for a method: what kvconform writes so that vLLM builds it.

    vLLM names the drafter class after the draft's own ``architectures``: for EAGLE,
    EAGLE-3 and DFlash, ``SpeculativeConfig.__post_init__`` wraps the draft's config in
    ``EAGLEConfig`` (vllm/transformers_utils/configs/eagle.py), whose ``__init__``
    prefixes each architecture (``Eagle`` + arch, ``Eagle3`` + arch, ``DFlash`` + arch,
    unless it already carries the prefix); a separate draft model keeps its own. Then
    ``SpeculativeConfig.update_arch_`` looks the name up in vLLM's model registry
    (vllm/model_executor/models/registry.py, ``_SPECULATIVE_DECODING_MODELS``), and a
    name it lacks stops the engine at start. The same in vLLM 0.25.0 through 0.33.0.
    """

    # The draft architectures whose drafter class vLLM registers, in 0.25.0-0.33.0;
    # kvconform writes the first, whatever the target, unless the scenario's
    # engine.draft.architecture names another. Empty: the target's own architecture.
    architectures: tuple[str, ...]
    # vLLM's drafter class for a draft of architecture ``{arch}``.
    vllm_class: str
    # Why these architectures (the vLLM code the rule rests on).
    reason: str
    # Sizes (TinyModel fields) the draft must take from the target, and why.
    from_target: tuple[str, ...] = ()
    from_target_reason: str = ""
    # Config keys the draft needs, given the target (EAGLE-3's auxiliary layers).
    extra: Callable[[TinyModel], Mapping[str, Any]] = _no_extra
    # The fewest target layers the drafter can read from, and why.
    min_target_layers: int = 1
    min_target_layers_reason: str = ""

    def architecture_for(self, target: str) -> str:
        """The draft architecture kvconform writes for a target of architecture ``target``."""
        return self.architectures[0] if self.architectures else target

    def drafter_class(self, architecture: str) -> str:
        """vLLM's drafter class for a draft of ``architecture``."""
        return self.vllm_class.format(arch=architecture)

    @property
    def renamed(self) -> bool:
        """vLLM renames the draft's architecture (EAGLEConfig) rather than keep it."""
        return self.drafter_class("") != ""


@dataclass(frozen=True)
class MethodOption:
    """A setting a scenario may state for a method besides its name and k, and the values
    it may take: what a generator of scenarios (``kvconform explore``) draws for the method.

    ``section``: the scenario section that holds it (``speculative``, or a kind's settings
    section such as ``scheduler``); ``values``: k -> the legal values, the default first
    (a generator shrinks towards it and leaves it unstated there).
    """

    section: str
    name: str
    values: Callable[[int], tuple[object, ...]]
    doc: str = ""


def _mtp_module_counts(k: int) -> tuple[object, ...]:
    """Module counts vLLM takes for k drafts: the divisors of k (k a multiple of them)."""
    return tuple(n for n in range(1, k + 1) if k % n == 0)


@dataclass(frozen=True)
class Method:
    name: str  # vLLM's canonical method name
    rule: LookaheadRule
    # Scheduler mode (and engine mode's draft): the target model, and the draft
    # model for methods whose drafter is a model of its own (None: no draft folder).
    target: TinyModel = SCHEDULER_TARGET
    draft: TinyModel | None = None
    speculative_options: Mapping[str, Any] = field(default_factory=dict)
    # Engine mode: the draft kvconform writes (methods with a draft model), and, for a
    # method engine mode cannot run with the targets kvconform writes, why not.
    engine_draft: EngineDraft | None = None
    engine_refusal: str | None = None
    # DSpark: an anchor layout (k) and a fill-in layout (k + 1), by sample_from_anchor.
    anchor_layouts: bool = False
    # MTP: the target stacks num_nextn_predict_layers modules; more than one makes it
    # multi-module MTP, for which vLLM keeps k - 1 extra tokens below sliding windows.
    mtp_modules: bool = False
    # The name of vLLM's literal type listing the method's aliases (MTP's model types).
    vllm_aliases: str | None = None
    # The fuzzer draws methods in this order (Hypothesis shrinks towards the first);
    # None: after the ranked ones.
    fuzz_rank: int | None = None
    # Where the entry came from: the registry, or a methods file (its path).
    source: str = REGISTRY_FILE
    # vLLM's kernel that turns the drafter's positions into KV slots (the slots check
    # runs it): BlockTables.compute_slot_mappings for most drafters; DFlash and DSpark
    # build their queries with prepare_dflash_inputs from the gathered block table.
    drafter_kernel: str = "compute_slot_mappings"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "speculative_options", MappingProxyType(dict(self.speculative_options))
        )

    def lookahead(self, k: int, sample_from_anchor: bool = True) -> int:
        return self.rule.lookahead(k, sample_from_anchor)

    @property
    def options(self) -> tuple[MethodOption, ...]:
        """The settings the entry declares for the method, besides its name and k:
        DSpark's two layouts (``anchor_layouts``: ``speculative.sample_from_anchor``),
        MTP's stacked modules (``mtp_modules``: ``scheduler.num_nextn_predict_layers``,
        read by scheduler scenarios only)."""
        declared: list[MethodOption] = []
        if self.anchor_layouts:
            declared.append(
                MethodOption(
                    "speculative",
                    "sample_from_anchor",
                    lambda k: (True, False),
                    "the anchor layout (true) or the fill-in layout (false)",
                )
            )
        if self.mtp_modules:
            declared.append(
                MethodOption(
                    "scheduler",
                    "num_nextn_predict_layers",
                    _mtp_module_counts,
                    "the target's MTP modules (more than one: multi-module MTP)",
                )
            )
        return tuple(declared)

    @property
    def has_draft_model(self) -> bool:
        """The drafter is a model of its own, whose shape an engine scenario may set."""
        return self.draft is not None


_EAGLE_FAMILY = LookaheadRule(
    "k",
    lambda k, anchor: k,
    "the drafter runs k autoregressive passes from the verified position and writes the KV "
    "of k positions past the scheduled range",
)
_NO_DRAFTER_KV = LookaheadRule(
    "0",
    lambda k, anchor: 0,
    "drafts come from matching earlier tokens; no drafter forward pass, no drafter KV",
)
# The draft of EAGLE-family methods and draft models: a one-layer copy of the target.
ONE_LAYER_DRAFT = TinyModel(
    vocab=1000, hidden_size=64, intermediate_size=128, max_position_embeddings=131072, layers=1
)

# What an EAGLE-family drafter takes from the target.
_SHARES_TARGET = (
    "vLLM's EAGLE drafter shares the target's embedding and lm_head "
    "(v1/worker/gpu/spec_decode/eagle/utils.py: load_eagle_model) and feeds the target's "
    "hidden states into its first layer (llama_eagle.py: LlamaModel.fc takes "
    "2 x hidden_size; llama_eagle3.py: fc takes 3 x target_hidden_size, hidden_size "
    "when the draft's config has no target_hidden_size)"
)
_ENGINE_EAGLE = EngineDraft(
    ("LlamaForCausalLM", "MistralForCausalLM"),
    "Eagle{arch}",
    "EAGLEConfig names an EAGLE draft's drafter Eagle + its architecture; vLLM registers "
    "EagleLlamaForCausalLM (llama_eagle.py, the drafter of the H200 runs) and "
    "EagleMistralForCausalLM (mistral_eagle.py), no EagleQwen2ForCausalLM. The Llama "
    "drafter reads nothing of the target's architecture, only its hidden states, so "
    "kvconform writes an EAGLE draft as a LlamaForCausalLM whatever the target",
    ("hidden_size", "vocab"),
    _SHARES_TARGET,
)


def _eagle3_aux_layers(target: TinyModel) -> Mapping[str, Any]:
    # The three hidden states the drafter reads: vLLM's default (2, L // 2, L - 3)
    # (SupportsEagle3.get_eagle3_default_aux_hidden_state_layers) is three distinct
    # layers of a real model but not of a tiny one, and the drafter's fc expects three.
    return {"eagle_aux_hidden_state_layer_ids": [target.layers - 2, target.layers - 1,
                                                 target.layers]}  # fmt: skip


_ENGINE_EAGLE3 = EngineDraft(
    ("LlamaForCausalLM",),
    "Eagle3{arch}",
    "EAGLEConfig names an EAGLE-3 draft's drafter Eagle3 + its architecture; vLLM "
    "registers Eagle3LlamaForCausalLM (llama_eagle3.py), no Eagle3Qwen2ForCausalLM or "
    "Eagle3MistralForCausalLM. Every target kvconform writes offers the auxiliary hidden "
    "states it reads (SupportsEagle3: LlamaForCausalLM, MistralForCausalLM as its "
    "subclass, Qwen2ForCausalLM)",
    ("hidden_size", "vocab"),
    _SHARES_TARGET,
    extra=_eagle3_aux_layers,
    min_target_layers=2,
    min_target_layers_reason=(
        "the EAGLE-3 drafter reads three of the target's hidden states (ids 0..layers: "
        "the embeddings and each layer's output; kvconform writes "
        "eagle_aux_hidden_state_layer_ids = [layers - 2, layers - 1, layers]), and its "
        "fc expects three"
    ),
)

BUILTIN_METHODS: tuple[Method, ...] = (
    Method(
        "eagle", _EAGLE_FAMILY, draft=ONE_LAYER_DRAFT, engine_draft=_ENGINE_EAGLE, fuzz_rank=0
    ),  # fmt: skip
    Method("eagle3", _EAGLE_FAMILY, draft=ONE_LAYER_DRAFT, engine_draft=_ENGINE_EAGLE3),
    Method(
        "mtp",
        _EAGLE_FAMILY,
        target=TinyModel(
            "MiMoForCausalLM",
            vocab=1000,
            hidden_size=64,
            intermediate_size=128,
            max_position_embeddings=131072,
            extra={"num_nextn_predict_layers": 1},
        ),
        mtp_modules=True,
        vllm_aliases="MTPModelTypes",
        engine_refusal=(
            "vLLM drafts MTP from the target's own MTP modules "
            "(SpeculativeConfig.hf_config_override maps MiMo, DeepSeek-V3 and other "
            "targets that carry them); the targets an engine scenario names (Llama, "
            "Qwen2, Mistral) carry none"
        ),
        fuzz_rank=1,
    ),  # fmt: skip
    Method(
        "draft_model",
        LookaheadRule(
            "k",
            lambda k, anchor: k,
            "a separate draft model proposes k tokens autoregressively, writing their KV",
        ),
        draft=ONE_LAYER_DRAFT,
        engine_draft=EngineDraft(
            (),
            "{arch}",
            "a separate draft model keeps its own architecture; every architecture "
            "kvconform writes as a target is a causal LM vLLM registers",
            ("vocab",),
            "vLLM requires the target's vocabulary "
            "(SpeculativeConfig.verify_equal_vocab_size_if_draft_model)",
        ),
        fuzz_rank=4,
    ),
    Method(
        "dflash",
        LookaheadRule(
            "k + 1",
            lambda k, anchor: k + 1,
            "fill-in drafting writes a bonus query plus one query per draft token",
        ),
        drafter_kernel="prepare_dflash_inputs",
        draft=TinyModel(
            "DFlashDraftModel",
            layers=1,
            vocab=1000,
            hidden_size=64,
            intermediate_size=128,
            max_position_embeddings=131072,
        ),
        engine_refusal=(
            "kvconform writes no DFlash draft vLLM's engine runs: its drafter "
            "(qwen3_dflash.py, DFlashQwen3ForCausalLM) reads the draft's dflash_config "
            "(mask_token_id, target_layer_ids), which kvconform's config-only draft lacks, "
            "and a draft of the target's architecture would be named DFlash + it "
            "(EAGLEConfig), which vLLM does not register"
        ),
        fuzz_rank=2,
    ),  # fmt: skip
    Method(
        "dspark",
        LookaheadRule(
            "k (anchor) | k + 1 (fill-in)",
            lambda k, anchor: k if anchor else k + 1,
            "anchor sampling drafts k queries starting at the anchor; the fill-in layout "
            "(sample_from_anchor: false) adds a bonus query like DFlash",
        ),
        # DSpark drafts from the target's own checkpoint; DSparkSpeculator is a
        # DFlashSpeculator and writes through the same input kernel.
        anchor_layouts=True,
        engine_refusal=(
            "vLLM's DSpark drafts from a DeepSeek-V4 target's checkpoint or a "
            "Qwen3DSparkModel draft (SpeculativeConfig.__post_init__); kvconform writes "
            "neither"
        ),
        drafter_kernel="prepare_dflash_inputs",
        fuzz_rank=3,
    ),
    Method(
        "ngram",
        _NO_DRAFTER_KV,
        speculative_options={"prompt_lookup_min": 2, "prompt_lookup_max": 4},
        fuzz_rank=5,
    ),
    Method(
        "ngram_gpu",
        _NO_DRAFTER_KV,
        speculative_options={"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    ),
    Method("suffix", _NO_DRAFTER_KV),
    # Declared by vLLM up to 0.32.0 (SpeculativeMethod, read in 0.28.0-0.32.0; gone from
    # 0.33.0). Without these entries the explorer, which draws every declared method, failed
    # `lookahead` for "no entry" there (seed 0 on 0.28.0: mlp_speculator, docs/explore.md).
    Method(
        "medusa",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "Medusa heads predict the k drafts from the target's last hidden state "
            "(v1/spec_decode/medusa.py: MedusaProposer.propose runs the heads on "
            "target_hidden_states); no attention, no drafter KV",
        ),
        engine_refusal=(
            "kvconform writes no Medusa draft (a MedusaConfig checkpoint of heads over the "
            "target's hidden size)"
        ),
    ),
    Method(
        "mlp_speculator",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "declared but never run by the V1 engine: its model registry leaves "
            "MLPSpeculatorPreTrainedModel disabled ('Re-enable this once the MLP Speculator "
            "is supported in V1') and GPUModelRunner raises 'Unknown speculative decoding "
            "method'; its stages are MLPs over the target's hidden state, with no KV of their own",
        ),
        engine_refusal=(
            "vLLM's V1 engine runs no MLP speculator (GPUModelRunner: 'Unknown speculative "
            "decoding method: mlp_speculator')"
        ),
    ),
    Method(
        "extract_hidden_states",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "caches the target's hidden states at the scheduled positions only "
            "(slot_mappings[:num_tokens]); its one draft is always accepted",
        ),
        engine_refusal=(
            "its draft config must name the layers whose hidden states it caches "
            "(extract_hidden_states.py: eagle_aux_hidden_state_layer_ids must be set in the "
            "draft model config), and kvconform passes none"
        ),
    ),
    Method(
        "custom_class",
        LookaheadRule(
            "0",
            lambda k, anchor: 0,
            "a user-supplied proposer; vLLM reserves no drafter KV for it",
        ),
        engine_refusal="it runs a user-supplied proposer class, and a scenario names none",
    ),
)


def registry(extra: Iterable[Method] = ()) -> Mapping[str, Method]:
    """The built-in entries, with ``extra`` ones added (a methods file); names unique."""
    entries: dict[str, Method] = {}
    for method in (*BUILTIN_METHODS, *extra):
        if method.name in entries:
            raise ValueError(
                f"method {method.name!r} is declared twice: in {entries[method.name].source} "
                f"and in {method.source}"
            )
        entries[method.name] = method
    return MappingProxyType(entries)


class _Registry(Mapping[str, Method]):
    """The registry in use: a read-only view whose entries :func:`use_methods` sets."""

    def __init__(self) -> None:
        self._entries: Mapping[str, Method] = registry()
        self._extra: tuple[Method, ...] = ()

    def __getitem__(self, name: str) -> Method:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"METHODS({', '.join(self._entries)})"


METHODS: Mapping[str, Method] = _Registry()


def use_methods(extra: Iterable[Method] = ()) -> tuple[Method, ...]:
    """Make the registry the built-in entries plus ``extra`` (a methods file's entries),
    replacing the extra entries given before; returns those, so a caller may restore them.

    A name declared twice (an extra entry naming a built-in method, or two extra ones)
    is a ValueError naming both sources; the registry is then left as it was.
    """
    assert isinstance(METHODS, _Registry)
    extra = tuple(extra)
    entries = registry(extra)
    previous = METHODS._extra
    METHODS._entries, METHODS._extra = entries, extra
    return previous


def extra_methods() -> tuple[Method, ...]:
    """The entries in use beyond the built-in ones (from a methods file)."""
    assert isinstance(METHODS, _Registry)
    return METHODS._extra


def how_to_add(name: str, methods_file: str | None = None) -> list[str]:
    """What ``methods`` and ``doctor`` print for a method vLLM declares and no entry knows:
    the two places an entry may go, each as the text to write."""
    where = methods_file or f"{METHODS_FILE} at or above the scenarios"
    return [
        f"{name}: add its entry, stating what its drafter writes past the scheduled range "
        f"(from the drafter's code, not from vLLM's number), in one of ({ADDING_A_METHOD}):",
        f"  {REGISTRY_FILE}, in BUILTIN_METHODS:",
        f'    Method("{name}", LookaheadRule("FORMULA", lambda k, anchor: ..., "REASON"), '
        "draft=ONE_LAYER_DRAFT or None),",
        f"  or, without changing kvconform, a methods file ({where}, or --methods FILE):",
        f"    - {{name: {name}, lookahead: FORMULA, reason: REASON, draft: none | one-layer}}",
    ]


def method_for(name: str | None, methods: Mapping[str, Method] | None = None) -> Method | None:
    """The entry of a canonical method name, or None for a method no entry knows."""
    if name is None:
        return None
    return (METHODS if methods is None else methods).get(name)


def expected_lookahead(
    method: str | None,
    k: int,
    sample_from_anchor: bool = True,
    methods: Mapping[str, Method] | None = None,
) -> int | None:
    """The lookahead kvconform expects, or None for a method no entry knows."""
    if method is None:
        return 0
    entry = method_for(method, methods)
    return None if entry is None else entry.lookahead(k, sample_from_anchor)
