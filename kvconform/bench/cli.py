"""``python -m kvconform.bench``: measure, write ``build/bench.json``, append a row.

Every figure is measured by one function and guarded: a figure that cannot be
measured (machinery absent, a subprocess failing, ``--skip``) is written as not
available with its reason, and the other figures are still measured. Targets are
reported in the output, never asserted: the exit status is 0 whenever the
benchmark ran, whether or not the targets were met.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform.bench import explorer, overhead, plugins, processes, scaling
from kvconform.bench.figures import Figure, guarded, not_available
from kvconform.bench.machine import machine_facts
from kvconform.bench.report import append_row, write_json
from kvconform.harness.expectations import find_expectations, load_expectations
from kvconform.harness.loader import load_paths
from kvconform.oracles.vllm import Vllm, load

SCHEMA = "kvconform-bench/1"
ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_FIGURES = ("import_seconds", "suite_seconds", "xdist_speedup", "mutation_campaign")
SKIPPABLE = (
    "step_overhead_ratio",
    "scaling",
    "kinds",
    "checks",
    "fuzz_examples_per_second",
    "explore_workloads_per_second",
    "explore_step_ratio",
    *SUBPROCESS_FIGURES,
)
TARGETED = (
    "step_overhead_ratio",
    "suite_seconds",
    "fuzz_examples_per_second",
    "explore_workloads_per_second",
    "explore_step_ratio",
    "xdist_speedup",
    "scaling",
    "mutation_campaign",
)


@dataclass
class Options:
    scenarios: list[str] = field(default_factory=lambda: ["scenarios"])
    rounds: int = 9
    lengths: tuple[int, ...] = scaling.LENGTHS
    widths: tuple[int, ...] = scaling.WIDTHS
    width_steps: int = scaling.WIDTH_STEPS
    scaling_rounds: int = 5
    scaling_min_calls: int = scaling.MIN_CALLS_PER_PASS
    fuzz_examples: int = 300
    explore_workloads: int = 40  # drawn workloads of the explorer's figures
    party_sample: int = 10  # scenarios a check's own party (slots) is timed on
    fuzz_seed: int = 0
    skip: tuple[str, ...] = ()
    root: Path = ROOT
    profile_dir: Path | None = None
    mutation_targets: str = "scenarios/mutation-targets.yaml"
    say: Callable[[str], None] = field(default=lambda line: print(line, flush=True))


def quick_options(**overrides: Any) -> Options:
    """Tiny sizes for the smoke test: every code path, no subprocess figures."""
    values: dict[str, Any] = dict(
        rounds=1,
        lengths=(3, 5),
        widths=(1, 2),
        width_steps=4,
        scaling_rounds=1,
        scaling_min_calls=1,
        fuzz_examples=3,
        explore_workloads=2,
        party_sample=1,
        skip=SUBPROCESS_FIGURES,
        say=lambda line: None,
    )
    values.update(overrides)
    return Options(**values)


def run_bench(vllm: Vllm, options: Options, load_seconds: float | None = None) -> dict[str, Any]:
    """Measure every figure; returns what ``build/bench.json`` holds."""
    started = time.perf_counter()
    say = options.say
    paths = [str(options.root / p) for p in options.scenarios]
    loaded = load_paths(paths)
    scenarios = loaded.scenarios
    # The expectations `kvconform run` would apply: part of the harness's work per scenario.
    expectations_path = find_expectations(paths)
    expectations = load_expectations(expectations_path) if expectations_path else []
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_facts(vllm, options.root),
        "corpus": plugins.corpus_facts(scenarios, loaded.errors),
        "bench_process_load_seconds": load_seconds,
    }

    def figure(name: str, measure: Callable[[], Any]) -> Any:
        if name in options.skip:
            results[name] = not_available(f"skipped (--skip {name})")
        else:
            say(f"bench: {name} ...")
            results[name] = (
                guarded(measure, name) if name not in ("kinds", "checks") else _all(measure, name)
            )
            say(f"bench: {name}: {_summary(results[name])}")
        return results[name]

    figure(
        "step_overhead_ratio",
        lambda: overhead.step_overhead_ratio(scenarios, vllm, options.rounds, expectations),
    )
    figure(
        "scaling",
        lambda: scaling.measure_scaling(
            vllm,
            options.scaling_rounds,
            options.lengths,
            options.widths,
            options.width_steps,
            options.scaling_min_calls,
        ),
    )
    figure("kinds", lambda: plugins.kinds(scenarios, vllm, options.rounds))
    figure(
        "checks",
        lambda: plugins.checks(scenarios, vllm, options.rounds, options.party_sample),
    )
    figure(
        "fuzz_examples_per_second",
        lambda: plugins.fuzz_examples_per_second(vllm, options.fuzz_examples, options.fuzz_seed),
    )
    figure(
        "explore_workloads_per_second",
        lambda: explorer.explore_workloads_per_second(
            vllm, options.explore_workloads, options.rounds, options.fuzz_seed
        ),
    )
    figure(
        "explore_step_ratio",
        lambda: explorer.explore_step_ratio(
            vllm, options.explore_workloads, options.rounds, options.fuzz_seed
        ),
    )
    imported = figure("import_seconds", lambda: processes.import_seconds(options.root))
    figure(
        "suite_seconds",
        lambda: processes.suite_seconds(options.root, options.scenarios, imported),
    )
    figure("xdist_speedup", lambda: processes.xdist_speedup(options.root, options.scenarios))
    figure(
        "mutation_campaign",
        lambda: processes.mutation_campaign(
            options.root, options.scenarios, options.mutation_targets
        ),
    )
    if options.profile_dir is not None:
        results["profiles"] = _profiles(vllm, options, scenarios)
    results["targets"] = {
        name: {
            "target": results[name].get("target"),
            "value": results[name].get("value"),
            "met": results[name].get("meets_target"),
        }
        for name in TARGETED
        if name in results
    }
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    return results


def _all(measure: Callable[[], dict[str, Figure]], name: str) -> dict[str, Figure]:
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - reported, like guarded()
        return {"all": not_available(f"{name} failed: {type(exc).__name__}: {exc}")}


def _summary(figure: Any) -> str:
    if isinstance(figure, dict) and "available" not in figure:
        return ", ".join(f"{k} {_summary(v)}" for k, v in figure.items())
    if not figure.get("available"):
        return f"n/a ({figure.get('reason')})"
    met = figure.get("meets_target")
    verdict = "" if met is None else (" (target met)" if met else " (target MISSED)")
    return f"{figure['value']} {figure['unit']}{verdict}"


def _profiles(vllm: Vllm, options: Options, scenarios: Sequence[Any]) -> dict[str, Any]:
    from kvconform.bench import profiles

    assert options.profile_dir is not None
    out = options.profile_dir
    work = overhead.workload(scenarios, vllm)
    long_point = scaling.scenario(max(options.lengths), 1)
    written: dict[str, Any] = {}
    for name, job in (
        ("harness-corpus.txt", lambda: overhead.harness_pass(work.scenarios, vllm)),
        ("harness-scaling.txt", lambda: overhead.harness_pass([long_point], vllm)),
    ):
        reason = profiles.call_tree(job, out / name)
        written[name] = reason or str(out / name)
    written["import"] = profiles.import_times(options.root, out / "import.txt")
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvconform.bench",
        description="Measure kvconform's cost against vLLM's allocator; write build/bench.json "
        "and append a row to docs/benchmarks.md.",
    )
    parser.add_argument("scenarios", nargs="*", default=["scenarios"], help="the corpus")
    parser.add_argument("--out", default="build/bench.json", help="the JSON file to write")
    parser.add_argument(
        "--doc", default="docs/benchmarks.md", help="append a row here ('' for none)"
    )
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per figure")
    parser.add_argument("--fuzz-examples", type=int, default=300)
    parser.add_argument(
        "--skip", action="append", default=[], choices=SKIPPABLE, help="leave a figure out"
    )
    parser.add_argument("--profile", metavar="DIR", help="also write profiles into DIR")
    parser.add_argument(
        "--mutation-targets",
        default="scenarios/mutation-targets.yaml",
        metavar="FILE",
        help="the targets of the mutation_campaign figure (default: the whole campaign)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, no subprocess figures (a smoke run)"
    )
    return parser


def load_for_bench() -> Vllm:
    """vLLM as ``kvconform run`` loads it: ready for every registered check's party."""
    return load()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    vllm = load_for_bench()
    load_seconds = time.perf_counter() - started
    base = quick_options(say=Options().say) if args.quick else Options()
    base.scenarios = list(args.scenarios)
    base.root = Path.cwd()
    if not args.quick:
        base.rounds = args.rounds
        base.fuzz_examples = args.fuzz_examples
    base.skip = tuple(base.skip) + tuple(args.skip)
    base.profile_dir = Path(args.profile) if args.profile else None
    base.mutation_targets = args.mutation_targets
    results = run_bench(vllm, base, load_seconds)
    out = Path(args.out)
    write_json(results, out)
    print(f"bench: wrote {out}")
    if args.doc:
        append_row(Path(args.doc), results)
        print(f"bench: appended a row to {args.doc}")
    return 0
