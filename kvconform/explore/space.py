"""The explorer's space: what an explored document may draw on the vLLM in use.

Read once from the loaded :class:`~kvconform.oracles.vllm.Vllm`, never while drawing:

* the group types: every type scheduler scenarios take (``GroupType.modes``)
  whose vLLM spec class this vLLM defines;
* the speculative methods it declares, one name per canonical method (the
  fuzzer's grouping, :func:`kvconform.fuzz.space.build_space`);
* a *probe* of each type and each method: a one-request scheduler scenario
  (``explore-probe-...``). A probe vLLM cannot build (unsupported: a method it
  does not run on this machine, a type its scheduler refuses) leaves the type or
  method out, said in the statistics; every example drawing it would only be
  rejected. A probe that fails a check stays in: the search finds it, shrinks it
  and reports it like any other failure;
* the release's optional settings (the adaptive long-prefill threshold, per-request
  spec-decode metrics, on/off group options such as bounded replay): drawn only where a
  probe builds them;
* the other kinds of document: the group types vLLM's startup planning builds (a
  startup probe of each), and whether its warmup runs (one warmup probe); a kind
  this vLLM does not offer is not drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvconform.fuzz.document import render
from kvconform.harness.loader import load_text
from kvconform.harness.loader.scheduler import SCHEDULER_GROUP_TYPES
from kvconform.harness.loader.startup import STARTUP_GROUP_TYPES
from kvconform.harness.runner import run_scenario
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kinds import Kind
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.oracles.vllm import Vllm


@dataclass(frozen=True)
class ExploreSpace:
    """What the strategies draw from, and the limits of a drawn workload."""

    group_types: tuple[str, ...]
    methods: tuple[str, ...]  # one declared name per canonical method
    adaptive_threshold: bool = False  # SchedulerConfig.long_prefill_token_threshold_adaptive
    spec_decode_metrics: bool = False  # ObservabilityConfig.per_request_spec_decode_metrics
    # (group type, option): the on/off options (bool, default off, no fuzzer draw) a probe
    # built with the option on; drawn both ways (sliding-window MLA's bounded replay).
    flag_options: tuple[tuple[str, str], ...] = ()
    excluded: dict[str, str] = field(default_factory=dict)  # type or method -> why not drawn
    # Startup documents: the group types vLLM's startup planning builds here (empty: no
    # startup documents are drawn). Warmup documents: whether vLLM's warmup runs here
    # (their groups are the scheduler's types).
    startup_types: tuple[str, ...] = ()
    warmup: bool = False
    block_sizes: tuple[int, ...] = (16, 32, 8)
    max_groups: int = 3
    max_speculative_tokens: int = 4
    max_blocks_per_len: int = 12  # max_model_len at most this many blocks

    def __repr__(self) -> str:  # Hypothesis shows it in every strategy's repr
        return f"ExploreSpace({self.describe()})"

    def kinds(self) -> tuple[Kind, ...]:
        """The kinds of document drawn: the scheduler's workloads, and startup and warmup
        documents where this vLLM runs them."""
        return (
            Kind.SCHEDULER,
            *((Kind.STARTUP,) if self.startup_types else ()),
            *((Kind.WARMUP,) if self.warmup else ()),
        )

    def describe(self) -> str:
        return (
            f"{len(self.group_types)} group types ({', '.join(self.group_types)}); "
            f"{len(self.methods)} speculative methods ({', '.join(self.methods)}); "
            f"kinds {', '.join(self.kinds())}"
            + (f" (startup: {', '.join(self.startup_types)})" if self.startup_types else "")
        )


def build_explore_space(
    vllm: Vllm,
    warmup_probe: Callable[[Vllm, dict[str, Any]], ScenarioResult] | None = None,
    **limits: Any,
) -> ExploreSpace:
    """Read the explorer's space off a loaded vLLM, probing each type and method once.

    ``warmup_probe`` runs the warmup probe (default :func:`probe`, here): the one probe
    that runs vLLM's ``warmup_kernels``, which initializes CUDA on a CUDA host, so that a
    caller about to fork workers runs it in a child (``kvconform.explore.runner``).
    """
    offered = set(vllm.offered_spec_classes())
    excluded: dict[str, str] = {}
    types = []
    for name in SCHEDULER_GROUP_TYPES:
        if GROUP_TYPES[name].vllm_class not in offered:
            continue  # this vLLM lacks the class: nothing to draw, nothing to report
        result = probe(vllm, _probe_document(name, _probe_group(name)))
        if result.verdict is Verdict.UNSUPPORTED:
            excluded[name] = f"not offered: {result.error}"
            continue
        types.append(name)
    canonical: dict[str, str] = {}
    for method in vllm.declared_methods():
        canonical.setdefault(vllm.canonical_method(method), method)
    methods = []
    plain = SCHEDULER_GROUP_TYPES[0]  # the registry's first: full attention
    for method in sorted(canonical):
        doc = _probe_document(f"method-{method}", plain)
        doc["speculative"] = {"method": method, "num_speculative_tokens": 2}
        result = probe(vllm, doc)
        if result.verdict is Verdict.UNSUPPORTED:
            excluded[method] = f"not offered: {result.error}"
            continue
        methods.append(method)
    options = {
        "adaptive_threshold": {
            "long_prefill_token_threshold": 16,
            "long_prefill_token_threshold_adaptive": True,
        },
        "spec_decode_metrics": {"spec_decode_metrics": "summary"},
    }
    offered_options: dict[str, bool] = {}
    for option, settings in options.items():
        doc = _probe_document(f"option-{option}", plain)
        doc["scheduler"].update(settings)
        if option == "spec_decode_metrics" and methods:
            doc["speculative"] = {"method": methods[0], "num_speculative_tokens": 2}
        elif option == "spec_decode_metrics":
            offered_options[option] = False
            continue
        offered_options[option] = probe(vllm, doc).verdict is not Verdict.UNSUPPORTED
    flags = []
    for name in types:
        for option_name, declared in GROUP_TYPES[name].options.items():
            if declared.kind is not bool or declared.default or declared.draw is not None:
                continue
            group = _probe_group(name)
            group = {**(group if isinstance(group, dict) else {"type": name}), option_name: True}
            result = probe(vllm, _probe_document(f"{name}-{option_name}", group))
            if result.verdict is not Verdict.UNSUPPORTED:
                flags.append((name, option_name))
    startup_types = []
    for name in STARTUP_GROUP_TYPES:
        if GROUP_TYPES[name].vllm_class not in offered:
            continue
        result = probe(vllm, _startup_probe(name))
        if result.verdict is Verdict.UNSUPPORTED:
            excluded[f"startup {name}"] = f"not offered: {result.error}"
            continue
        startup_types.append(name)
    warmup = (warmup_probe or probe)(vllm, _warmup_probe(plain))
    if warmup.verdict is Verdict.UNSUPPORTED:
        excluded["warmup"] = f"not offered: {warmup.error}"
    return ExploreSpace(
        startup_types=tuple(startup_types),
        warmup=warmup.verdict is not Verdict.UNSUPPORTED,
        group_types=tuple(types),
        methods=tuple(methods),
        adaptive_threshold=offered_options["adaptive_threshold"],
        spec_decode_metrics=offered_options["spec_decode_metrics"],
        flag_options=tuple(flags),
        excluded=excluded,
        **limits,
    )


def runs_without_caching(group: Any) -> bool:
    """Whether a group of this type runs in a scheduler scenario without prefix caching:
    a recurrent state (Mamba) does not (vLLM sets its block size, --mamba-block-size, only
    with --enable-prefix-caching)."""
    type_name = group if isinstance(group, str) else str(group["type"])
    return GROUP_TYPES[type_name].attention


def _probe_group(type_name: str) -> Any:
    options = {
        name: option.probe
        for name, option in GROUP_TYPES[type_name].options.items()
        if option.required and option.probe is not None
    }
    return {"type": type_name, **options} if options else type_name


def _probe_document(label: str, group: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"block_size": 16, "max_model_len": 128, "num_blocks": 64}
    if not runs_without_caching(group):  # vLLM sets a Mamba block size only with caching on
        model["enable_caching"] = True
    return {
        "name": f"explore-probe-{label}",
        "kind": "scheduler",
        "model": {**model, "groups": [group]},
        "scheduler": {"mode": "sync"},
        "requests": {"a": {"prompt_len": 40, "max_tokens": 4}},
    }


def _startup_probe(type_name: str) -> dict[str, Any]:
    """One group of ``type_name`` handed to vLLM's startup planning, with room to spare."""
    group: Any = type_name
    mode = GROUP_TYPES[type_name].options.get("mamba_cache_mode")
    if mode is not None:  # the loader asks for the mode stated (its startup floor)
        group = {"type": type_name, "mamba_cache_mode": mode.default}
    return {
        "name": f"explore-probe-startup-{type_name}",
        "kind": Kind.STARTUP.value,
        "model": {"block_size": 16, "max_model_len": 128, "groups": [group]},
        "startup": {"available_blocks": 64},
    }


def _warmup_probe(group: Any) -> dict[str, Any]:
    """vLLM's warmup over one group, no speculation, a roomy pool."""
    return {
        "name": "explore-probe-warmup",
        "kind": Kind.WARMUP.value,
        "model": {"block_size": 16, "max_model_len": 128, "num_blocks": 64, "groups": [group]},
        "warmup": {"max_num_seqs": 2, "max_num_batched_tokens": 64},
    }


def probe(vllm: Vllm, doc: dict[str, Any]) -> ScenarioResult:
    """Run one probe document."""
    (scenario,) = load_text(render(doc), f"<probe {doc['name']}>")
    return run_scenario(scenario, vllm)
