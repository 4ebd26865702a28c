"""``--with-fuzz N``: the fuzzer as a second net under the corpus.

Each mutant that survived the corpus gets a forked child that swaps its code in
and runs ``kvconform fuzz`` for ``N`` examples (seed 0, no files written). The
clean vLLM gets the same run first, in a child of its own: the fuzzer finds
the known divergences of the clean vLLM too, so only a finding signature the
clean run does not show kills the mutant. Such a mutant is ``killed`` with
``killed_by`` naming the fuzzer and ``fuzz.killed`` true: "killed by fuzz
only", against the "killed by corpus" of every other killed mutant.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.mutate.campaign import MutantResult, ResolvedTarget
from kvconform.mutate.mutants import mutated_module_text
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.mutation import compiled_function_code, swap_code

FUZZ_SEED = 0
FUZZ_TIMEOUT_BASE_S = 60.0


def call_in_fork(work: Callable[[], dict[str, Any]], timeout: float) -> dict[str, Any] | None:
    """``work()`` in a forked child; its payload, or None if it ran past ``timeout``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            payload = work()
        except BaseException:  # noqa: BLE001 - the child's failure is its payload
            payload = {"error": traceback.format_exc(limit=3)[-600:]}
        data = memoryview(json.dumps(payload).encode())
        while data:
            data = data[os.write(write_fd, data) :]
        os._exit(0)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(read_fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(timeout=left):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(read_fd)
                return None
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return dict(json.loads(b"".join(chunks) or b"{}"))


def _signatures(vllm: Vllm, examples: int) -> dict[str, Any]:
    from kvconform.fuzz.runner import run_fuzz

    stats = run_fuzz(vllm, examples, FUZZ_SEED, None)
    return {
        "signatures": sorted(str(f.signature) for f in stats.findings),
        "messages": {str(f.signature): f.to_json()["message"] for f in stats.findings},
        "examples": stats.examples,
    }


def fuzz_survivors(
    vllm: Vllm,
    resolved: Sequence[ResolvedTarget],
    results: Sequence[MutantResult],
    examples: int,
    jobs: int = 1,
    say: Callable[[str], None] = print,
) -> None:
    """Fuzz each survivor; turn those the fuzzer tells apart from clean vLLM into kills."""
    survivors = [r for r in results if r.verdict == "survived" and r.mutant.swappable]
    if not survivors:
        return
    timeout = FUZZ_TIMEOUT_BASE_S + examples * 0.5
    clean = call_in_fork(lambda: _signatures(vllm, examples), timeout)
    if clean is None or "error" in clean:
        say(f"fuzz: the clean run failed: {clean}")
        return
    known = set(clean["signatures"])
    by_key = {r.target.key: r for r in resolved}
    say(
        f"fuzz: {len(survivors)} survivors, {examples} examples each (clean vLLM: {len(known)} findings)"
    )
    for result in survivors:
        mutant = result.mutant
        target = by_key[f"{mutant.module}:{mutant.function}"]
        assert target.source is not None
        source = target.source
        text = mutated_module_text(source, mutant)

        def work(
            text: str = text, function: Any = target.function, source: Any = source
        ) -> dict[str, Any]:
            swap_code(function, compiled_function_code(text, source.path, source.function))
            vllm.forget_answers()
            return _signatures(vllm, examples)

        found = call_in_fork(work, timeout)
        if found is None:
            result.fuzz = {"examples": examples, "killed": False, "note": "timed out"}
            continue
        if "error" in found:
            result.fuzz = {"examples": examples, "killed": False, "note": found["error"]}
            continue
        new = [s for s in found["signatures"] if s not in known]
        result.fuzz = {"examples": found["examples"], "killed": bool(new), "signatures": new}
        if new:
            result.verdict = "killed"
            result.killed_by = [
                {
                    "scenario": f"fuzz (seed {FUZZ_SEED}, {examples} examples)",
                    "checks": sorted({s.split(" ")[0] for s in new}),
                    "message": found["messages"].get(new[0], ""),
                    "verdict": "survived the corpus",
                }
            ]
            say(f"fuzz killed {mutant.id}: {new[0]}")
