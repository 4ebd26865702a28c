"""vLLM's own tests against the campaign's mutants: who catches what.

A mutation score over kvconform's corpus says how much of vLLM's code kvconform
would notice changing; the fair yardstick is what vLLM's *own* tests notice on the
same mutants. ``kvconform mutate --peer-tests`` runs, after the campaign, the
release's CPU-runnable tests (:mod:`kvconform.peer`) against every mutant kvconform
does not kill (survived, timeout, declared equivalent) and a stratified random
sample of those it kills (per target function, in proportion; ``--peer-sample``,
seeded): only the test files that reach the mutated function, stopping at the first
failure. Each result gets a ``peer`` entry (vLLM's tests' verdict and first
failure), and the report the four-way table (:func:`kvconform.mutate.report.who_catches`):
killed by kvconform only, by vLLM's tests only, by both, by neither.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvconform.harness.releases import link_tree
from kvconform.mutate.campaign import MutantResult, ResolvedTarget
from kvconform.mutate.mutants import mutated_module_text
from kvconform.mutate.report import KVCONFORM_CATCHES
from kvconform.peer import PeerSuite

PEER_TIMEOUT_S = 900.0


def choose(results: Sequence[MutantResult], sample: int, seed: int) -> list[MutantResult]:
    """Every mutant kvconform does not kill, and ``sample`` of those it kills, stratified
    by target function (each function's share in proportion, at least one), seeded."""
    missed = [
        r for r in results if r.verdict not in KVCONFORM_CATCHES and r.verdict != "incompetent"
    ]
    killed: dict[str, list[MutantResult]] = defaultdict(list)
    for result in results:
        if result.verdict in KVCONFORM_CATCHES:
            killed[f"{result.mutant.module}:{result.mutant.function}"].append(result)
    total = sum(len(group) for group in killed.values())
    rng = random.Random(seed)
    chosen: list[MutantResult] = []
    for key in sorted(killed):
        group = sorted(killed[key], key=lambda r: r.mutant.id)
        share = max(1, round(sample * len(group) / total)) if total else 0
        chosen.extend(rng.sample(group, min(share, len(group))))
    return missed + chosen


def run_peer(
    suite: PeerSuite,
    vllm_package: Path,
    resolved: Sequence[ResolvedTarget],
    chosen: Sequence[MutantResult],
    jobs: int = 1,
    timeout: float = PEER_TIMEOUT_S,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, dict[str, Any]]:
    """vLLM's tests against each chosen mutant's tree; mutant id -> its ``peer`` entry."""
    by_key = {entry.target.key: entry for entry in resolved}

    def one(result: MutantResult) -> tuple[str, dict[str, Any]]:
        mutant = result.mutant
        source = by_key[f"{mutant.module}:{mutant.function}"].source
        assert source is not None
        relative = Path(source.path).resolve().relative_to(vllm_package.resolve().parent)
        with tempfile.TemporaryDirectory(prefix="kvconform-peer-") as tmp:
            root = link_tree(vllm_package, Path(tmp) / "tree")
            target = root / relative
            target.unlink()  # a hard link: never write through it into the original
            target.write_text(mutated_module_text(source, mutant), encoding="utf-8")
            outcome = suite.run(root, {(relative.as_posix(), mutant.function)}, timeout)
            shutil.rmtree(root, ignore_errors=True)
        entry = {
            "verdict": outcome.verdict.value,
            "first_failure": str(outcome.first_failure) if outcome.first_failure else None,
            "tests_run": outcome.tests_run,
            "seconds": outcome.seconds,
            "files": list(outcome.files),
        }
        say(f"  peer {mutant.id}: {outcome.verdict.value} (kvconform: {result.verdict})")
        return mutant.id, entry

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, chosen))
