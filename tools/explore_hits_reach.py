"""How often the hits family's bound applies to the explorer's workloads: a count, not a test.

    python tools/explore_hits_reach.py [--examples N] [--seed S]

Draws the first N examples of seed S as ``kvconform explore`` draws its first round
(``Random(S * 7919)``), runs each scheduler workload through the installed vLLM's scheduler as
the explorer does, and counts the first admissions with prefix caching (the ``PrefixLookup``
facts), those with an earlier request sharing their prompt that had scheduled some of it,
those whose groups all have hit rules (no Mamba, chunked local attention, bounded replay or
KV connector), those the bound applies to (``kvconform.harness.checks.hits.bounded_lookups``:
besides, nothing evicted, preempted or reset before), and those whose bound asks for a
hit (more than 0 tokens). For follow-ups (``follow_ups`` in the strategies, where the tree
draws them) it counts how many arrived after their source had finished. Prints one JSON
object. docs/explore.md quotes its figures, before and after a change to the distribution
(the "before" run puts the older strategies first on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from random import Random
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, find, settings
from hypothesis.errors import NoSuchExample

from kvconform.explore import strategies
from kvconform.explore.space import build_explore_space
from kvconform.fuzz.document import render
from kvconform.harness.checks.hits import bounded_lookups
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.facts import PrefixLookup
from kvconform.oracles.vllm import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    vllm = load()
    space = build_explore_space(vllm)
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    turns: Counter[str] = Counter()

    def measure(doc: dict[str, Any]) -> bool:
        counts["examples"] += 1
        if doc["kind"] != "scheduler":
            return False
        counts["scheduler workloads"] += 1
        try:
            (scenario,) = load_text(render(doc), "<reach>")
            result = run_scenario(scenario, vllm)
        except Exception as error:  # noqa: BLE001 - a count: an unbuildable workload is one
            counts[f"not run ({type(error).__name__})"] += 1
            return False
        trajectory = result.trajectory
        if trajectory is None:
            counts["not run (no recording)"] += 1
            return False
        lookups = [f.what for f in trajectory.facts if isinstance(f.what, PrefixLookup)]
        counts["first admissions with prefix caching"] += len(lookups)
        shared = [w for w in lookups if w.sources]
        counts["... with an earlier request sharing the prompt"] += len(shared)
        for what in shared:
            if what.no_bound:
                reasons[what.no_bound.split(" (")[0]] += 1
        counts["... with a hit rule for every group"] += sum(not w.no_bound for w in shared)
        bounded = [best for _, _, best, _, _ in bounded_lookups(trajectory)]
        counts["... the bound applies"] += len(bounded)
        asking = [best for best in bounded if best.tokens > 0]
        counts["... the bound asks for a hit (> 0 tokens)"] += len(asking)
        counts["workloads with a lookup the bound asks a hit of"] += bool(asking)
        follow = getattr(strategies, "follow_ups", None)
        if follow is not None:
            finished = {
                e.request: e.step for e in trajectory.events if e.kind == "finish"
            }  # fmt: skip
            for name in follow(doc):
                body = doc["requests"][name]
                turns["follow-ups"] += 1
                done = finished.get(body["prefix_from"])
                if done is not None and done < body["arrival"]:
                    turns["... their source finished before they arrived"] += 1
        return False

    try:
        find(
            strategies.workloads(space),
            measure,
            settings=settings(
                max_examples=args.examples,
                deadline=None,
                database=None,
                phases=(Phase.generate,),
                verbosity=Verbosity.quiet,
                suppress_health_check=list(HealthCheck),
            ),
            random=Random(args.seed * 7919),
        )
    except NoSuchExample:
        pass
    print(json.dumps({**counts, **turns, "no bound, why": dict(reasons)}, indent=1))


if __name__ == "__main__":
    main()
