"""The fuzz space: what may be drawn against the vLLM in use.

The strategies never ask vLLM anything while drawing; everything they need is
read once, here, from the loaded :class:`~kvconform.oracles.vllm.Vllm`:

* the group types it can build: every scenario group type whose vLLM spec class
  this vLLM defines, minus those kvconform has no option strategy for;
* a *probe* of each: one group of the type alone through a short prefill / spec
  / decode / preempt / recompute / finish trajectory (scenario id
  ``fuzz-probe-<type>``), judged with the expectations file. A type whose probe
  diverges in a way the expectations file lists (0.33.0: sink attention
  crashes the manager's constructor) is left out of the search: every example
  drawing it would fail the known way and drown the unknown ones. A type whose
  probe diverges in a way nobody listed stays in: the search finds the
  divergence, shrinks it and reports it like any other;
* the Mamba cache modes its config accepts, and its speculative methods, grouped
  by the canonical method vLLM rewrites them to, with the lookahead of each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvconform.fuzz.document import render
from kvconform.harness.expectations import Expectation
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import METHODS, expected_lookahead
from kvconform.model.results import ScenarioResult, Verdict
from kvconform.oracles.vllm import Vllm


@dataclass(frozen=True)
class FuzzSpace:
    """Everything the strategies may draw from, and the limits of a drawn scenario."""

    group_types: tuple[str, ...]
    # canonical method -> the declared names that mean it (the canonical one first)
    methods: Mapping[str, tuple[str, ...]]
    # (group type, option) -> the values the loaded vLLM's config accepts (Draw "offered")
    offered_choices: Mapping[tuple[str, str], tuple[object, ...]] = field(default_factory=dict)
    # (canonical method, k, sample_from_anchor) -> the lookahead vLLM reserves
    lookaheads: Mapping[tuple[str, int, bool], int] = field(default_factory=dict)
    # type -> why it is not drawn (no option strategy, or a known divergence)
    excluded: Mapping[str, str] = field(default_factory=dict)
    # type -> how its probe diverged although no expectation lists it (it is drawn)
    diverged: Mapping[str, str] = field(default_factory=dict)
    block_sizes: tuple[int, ...] = (16, 32, 64, 8)
    max_groups: int = 4
    max_requests: int = 4
    max_steps: int = 24
    max_speculative_tokens: int = 5
    max_blocks_per_len: int = 4  # max_model_len at most this many scheduler blocks
    max_encoder_len: int = 96
    # when set, every example's first group is of one of these types: a search aimed at
    # the code they reach (the mutation campaign's fuzz audit aims at a target function)
    aimed_types: tuple[str, ...] = ()

    def lookahead(self, method: str | None, k: int, sample_from_anchor: bool) -> int:
        if method is None:
            return 0
        return self.lookaheads.get((method, k, sample_from_anchor), k + 1)

    def __repr__(self) -> str:  # Hypothesis shows it in every strategy's repr
        return f"FuzzSpace({self.describe()})"

    def describe(self) -> str:
        methods = sum(len(names) for names in self.methods.values())
        return (
            f"{len(self.group_types)} group types ({', '.join(self.group_types)}); "
            f"{len(self.methods)} speculative methods ({methods} names)"
            + (f"; aimed: first group {', '.join(self.aimed_types)}" if self.aimed_types else "")
        )


def build_space(vllm: Vllm, expectations: Sequence[Expectation] = (), **limits: Any) -> FuzzSpace:
    """Read the fuzz space off a loaded vLLM, probing each group type once."""
    offered = set(vllm.offered_spec_classes())
    excluded: dict[str, str] = {}
    candidates = []
    for name, group_type in GROUP_TYPES.items():
        if group_type.vllm_class not in offered:
            continue  # this vLLM lacks the class: nothing to fuzz, nothing to report
        if not group_type.fuzzed:
            excluded[name] = "kvconform's fuzzer does not draw it (GroupType.fuzzed)"
            continue
        candidates.append(name)
    declared = vllm.declared_methods()
    methods: dict[str, list[str]] = {}
    for method in declared:
        methods.setdefault(vllm.canonical_method(method), []).append(method)
    grouped = {
        canonical: tuple(sorted(names, key=lambda n: (n != canonical, n)))
        for canonical, names in sorted(methods.items(), key=lambda kv: _rank(kv[0]))
    }
    lookaheads: dict[tuple[str, int, bool], int] = {}
    k_max = int(limits.get("max_speculative_tokens", FuzzSpace.max_speculative_tokens))
    for canonical in grouped:
        for k in range(1, k_max + 1):
            for anchor in (True, False):
                value = vllm.lookahead(canonical, k, anchor)
                if value is None:
                    value = expected_lookahead(canonical, k, anchor)
                lookaheads[(canonical, k, anchor)] = k + 1 if value is None else value
    probe_method = next(iter(grouped), None)
    group_types = []
    diverged: dict[str, str] = {}
    for name in sorted(candidates, key=_type_rank):
        result = probe(vllm, name, probe_method, expectations)
        if result.verdict is Verdict.XFAILED:
            excluded[name] = f"known divergence ({result.id}): {result.expectation}"
            continue
        if result.verdict is Verdict.UNSUPPORTED:
            excluded[name] = f"not offered: {result.error}"
            continue
        if result.verdict in (Verdict.FAILED, Verdict.ERROR):
            diverged[name] = f"{result.verdict.value}: {result.headline()}"
        group_types.append(name)
    return FuzzSpace(
        group_types=tuple(group_types),
        diverged=diverged,
        methods=grouped,
        offered_choices=offered_choices(vllm),
        lookaheads=lookaheads,
        excluded=excluded,
        **limits,
    )


def offered_choices(vllm: Vllm) -> dict[tuple[str, str], tuple[object, ...]]:
    """Per option drawn from what vLLM offers, the values the loaded vLLM accepts."""
    offered: dict[tuple[str, str], tuple[object, ...]] = {}
    for name, group_type in GROUP_TYPES.items():
        for option_name, option in group_type.options.items():
            if option.draw is None or option.draw.kind != "offered":
                continue
            values = vllm.literal_values(option.vllm_literal) if option.vllm_literal else None
            offered[(name, option_name)] = values if values is not None else option.choices
    return offered


def _rank(method: str) -> tuple[int, str]:
    entry = METHODS.get(method)
    rank = entry.fuzz_rank if entry is not None else None
    return (len(METHODS) if rank is None else rank, method)


def _type_rank(name: str) -> tuple[int, str]:
    rank = GROUP_TYPES[name].fuzz_rank
    return (len(GROUP_TYPES) if rank is None else rank, name)


def probe_document(type_name: str, method: str | None) -> dict[str, Any]:
    """A short trajectory over one group of ``type_name``: every action once."""
    group_type = GROUP_TYPES[type_name]
    group = {"type": type_name, **group_type.probe_options()}
    doc: dict[str, Any] = {
        "name": f"fuzz-probe-{type_name}",
        "model": {
            "block_size": 16,
            "max_model_len": 256,
            "num_blocks": 64,
            "groups": [group],
        },
    }
    if group_type.encoder:
        doc["model"]["max_encoder_len"] = 40
    steps: list[dict[str, Any]] = [{"a": {"prefill": 24}}, {"a": {"prefill": 16}}]
    if method is not None:
        doc["speculative"] = {"method": method, "num_speculative_tokens": 2}
        steps.append({"a": {"spec": 2, "accepted": 1}})
    steps += [{"a": "decode"}, {"a": "preempt"}]
    doc["requests"] = {"a": {"prompt_len": 40}}
    pending = 40 + 1 + (2 if method is not None else 0) + 1
    steps += [{"a": {"prefill": pending}}, {"a": "finish"}]
    doc["steps"] = steps
    return doc


def probe(
    vllm: Vllm, type_name: str, method: str | None, expectations: Sequence[Expectation] = ()
) -> ScenarioResult:
    """Run the probe scenario of one group type, judged with ``expectations``."""
    (scenario,) = load_text(render(probe_document(type_name, method)), f"<probe {type_name}>")
    return run_scenario(scenario, vllm, expectations=expectations)
