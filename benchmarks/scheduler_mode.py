"""Benchmark: what scheduler mode costs at start-up and per step.

Run from the repository root::

    python benchmarks/scheduler_mode.py            # warm: caches under ~/.cache/kvconform
    python benchmarks/scheduler_mode.py --cold     # a fresh, empty cache (first run on a machine)

It reports, in one process: vLLM's import; per speculative method the first
``ModelConfig`` + ``SpeculativeConfig`` of the process (the expensive part:
vLLM inspects the model architectures, cached on disk) and a second, cached
build; then, per scheduler mode, one long scenario (4 requests, a few hundred
steps) run twice, with the cost per ``schedule()`` step of the whole driver
(scheduler, fabricated output, predictor, observations) and of the checks.
Timings are wall-clock on whatever machine runs it; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LONG = """
name: bench
kind: scheduler
model: {{block_size: 16, max_model_len: 4096, num_blocks: 1024}}
{speculative}
scheduler: {{mode: {mode}, max_num_seqs: 4, max_num_batched_tokens: 256}}
requests:
  a: {{prompt_len: 700, max_tokens: 400, accept: {{rate: 0.7, seed: 1}}}}
  b: {{prompt_len: 300, max_tokens: 400, accept: {{rate: 0.5, seed: 2}}, arrival: 5}}
  c: {{prompt_len: 1200, max_tokens: 300, accept: {{repeat: [3, 0, 1]}}, arrival: 20}}
  d: {{prompt_len: 64, max_tokens: 500, accept: none, arrival: 40}}
"""

METHODS = ("eagle", "mtp", "draft_model", "dflash", "ngram")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="start from an empty cache")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (default 3)")
    args = parser.parse_args()
    if args.cold:
        os.environ["KVCONFORM_CACHE"] = tempfile.mkdtemp(prefix="kvconform-cold-")
        os.environ.pop("VLLM_CACHE_ROOT", None)

    from kvconform.harness.checks import run_checks
    from kvconform.harness.drivers.scheduler import drive_scheduler
    from kvconform.harness.loader import load_text
    from kvconform.oracles import scheduler as oracle
    from kvconform.oracles.vllm import load

    started = time.perf_counter()
    vllm = load()
    print(f"vLLM {vllm.version}: import {time.perf_counter() - started:.1f} s")

    print("\nconfigs (ModelConfig + SpeculativeConfig), first in process / cached:")
    for method in METHODS:
        (scenario,) = load_text(
            LONG.format(
                speculative=f"speculative: {{method: {method}, num_speculative_tokens: 3}}",
                mode="sync",
            ),
            "bench.yaml",
        )
        times = []
        for _ in range(2):
            t = time.perf_counter()
            oracle.model_and_speculative_config(vllm, scenario, vllm.canonical_method(method))
            times.append(time.perf_counter() - t)
        print(f"  {method:12} {times[0]:7.2f} s   {times[1] * 1000:6.1f} ms")

    print("\nper mode, eagle k=3, 4 requests (median of runs after the first):")
    spec = "speculative: {method: eagle, num_speculative_tokens: 3}"
    for mode in ("sync", "async", "overlapped"):
        (scenario,) = load_text(LONG.format(speculative=spec, mode=mode), "bench.yaml")
        drive_s, check_s = [], []
        steps = rows = 0
        for _ in range(args.repeat + 1):
            t = time.perf_counter()
            run = drive_scheduler(scenario, vllm)
            drive_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            failures = run_checks(run)
            check_s.append(time.perf_counter() - t)
            assert not failures, failures[0].message
            steps = len({o.step for o in run.observations})
            rows = len(run.observations)
        drive = statistics.median(drive_s[1:])
        check = statistics.median(check_s[1:])
        print(
            f"  {mode:10} {steps} steps, {rows} rows: scenario {drive * 1000:6.0f} ms "
            f"(first {drive_s[0] * 1000:.0f} ms), {drive / steps * 1000:.2f} ms/step driven, "
            f"{check / steps * 1000:.3f} ms/step checked"
        )


if __name__ == "__main__":
    main()
