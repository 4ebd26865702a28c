"""``--with-fuzz N``: the fuzzer as a second net under the corpus, and the equivalents' audit.

Each mutant the corpus does not kill, the survivors and the mutants
``scenarios/mutation-equivalents.yaml`` declares equivalent alike, gets a forked
child that swaps its code in and runs ``kvconform fuzz`` for ``N`` examples
(seed 0, no files written), ``--jobs`` children at a time.

The search is *aimed at the mutated function*: before any child starts, each
group type's probe trajectory (:func:`kvconform.fuzz.space.probe`) runs once
under the campaign's reach recorder, and the types whose probe calls the
function are the ones every example's first group is drawn from
(``FuzzSpace.aimed_types``); the other groups are drawn from the whole space,
so hybrid layouts stay in. A function every type's probe reaches (the
coordinator, ``allocate_slots``) is fuzzed over the whole space; one no probe
reaches (the scheduler's, the warmup's: the fuzzer draws trajectories) is
fuzzed over the whole space too, and its result says so (``aimed: null``).

The clean vLLM gets the same run first, once per aim, in a child of its own:
the fuzzer finds the known divergences of the clean vLLM too, so only a finding
signature the clean run does not show kills the mutant. Such a mutant is
``killed`` with ``killed_by`` naming the fuzzer and ``fuzz.killed`` true
("killed by fuzz only"); a declared equivalent the fuzzer kills was not
equivalent, and its note says the entry is stale.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from kvconform.fuzz.space import FuzzSpace, build_space, probe
from kvconform.harness.expectations import Expectation
from kvconform.mutate.campaign import MutantResult, ResolvedTarget
from kvconform.mutate.mutants import mutated_module_text
from kvconform.oracles.vllm import Vllm
from kvconform.oracles.vllm.mutation import ReachRecorder, compiled_function_code, swap_code

FUZZ_SEED = 0
FUZZ_TIMEOUT_BASE_S = 60.0
# What the fuzzer runs against: the corpus' survivors and the declared equivalents (the audit).
FUZZED_VERDICTS = ("survived", "equivalent")

Work = Callable[[], dict[str, Any]]


def _fork(work: Work) -> tuple[int, int]:
    """Start ``work()`` in a forked child; its pid and the pipe its JSON payload comes on."""
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
    return pid, read_fd


def map_in_forks(
    works: Sequence[Work],
    jobs: int,
    timeout: float,
    on_done: Callable[[int, dict[str, Any] | None], None] = lambda index, payload: None,
) -> list[dict[str, Any] | None]:
    """Each ``work()`` in a forked child, ``jobs`` at a time; its payload, or None past ``timeout``.

    Children, not threads: each starts from the parent's clean state and a mutant's
    code swap dies with its child. ``on_done(index, payload)`` hears each as it ends, so a
    long run says what it has while it goes."""
    results: list[dict[str, Any] | None] = [None] * len(works)
    pending = list(range(len(works)))[::-1]
    running: dict[int, tuple[int, int, float, list[bytes]]] = {}  # fd -> index, pid, deadline
    with selectors.DefaultSelector() as selector:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                index = pending.pop()
                pid, fd = _fork(works[index])
                running[fd] = (index, pid, time.monotonic() + timeout, [])
                selector.register(fd, selectors.EVENT_READ)
            soonest = min(deadline for _, _, deadline, _ in running.values())
            for key, _ in selector.select(timeout=max(0.0, soonest - time.monotonic())):
                fd = int(key.fd)
                index, pid, _, chunks = running[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks.append(chunk)
                    continue
                selector.unregister(fd)
                os.close(fd)
                os.waitpid(pid, 0)
                del running[fd]
                results[index] = dict(json.loads(b"".join(chunks) or b"{}"))
                on_done(index, results[index])
            now = time.monotonic()
            for fd, (index, pid, deadline, _) in list(running.items()):
                if deadline <= now:  # past its time: killed, its payload stays None
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    selector.unregister(fd)
                    os.close(fd)
                    del running[fd]
                    on_done(index, None)
    return results


def aimed_types(vllm: Vllm, space: FuzzSpace, target: ResolvedTarget) -> tuple[str, ...] | None:
    """The group types whose probe calls ``target``'s function; None when every type's
    probe does, or none does (the search then covers the whole space)."""
    if target.function is None:
        return None
    recorder = ReachRecorder({target.function.__code__: target.target.key})
    method = next(iter(space.methods), None)
    reaching = []
    for type_name in space.group_types:
        with recorder.recording() as reached:
            probe(vllm, type_name, method)
        if reached:
            reaching.append(type_name)
    if not reaching or len(reaching) == len(space.group_types):
        return None
    return tuple(reaching)


def _signatures(vllm: Vllm, examples: int, space: FuzzSpace) -> dict[str, Any]:
    from kvconform.fuzz.runner import run_fuzz

    stats = run_fuzz(vllm, examples, FUZZ_SEED, None, space=space)
    return {
        "signatures": sorted(str(f.signature) for f in stats.findings),
        "messages": {str(f.signature): f.to_json()["message"] for f in stats.findings},
        "examples": stats.examples,
        "seconds": round(stats.search_seconds + stats.shrink_seconds, 1),
    }


def fuzz_not_killed(
    vllm: Vllm,
    resolved: Sequence[ResolvedTarget],
    results: Sequence[MutantResult],
    examples: int,
    jobs: int = 1,
    say: Callable[[str], None] = print,
    expectations: Sequence[Expectation] = (),
) -> None:
    """Fuzz each survivor and declared equivalent, aimed at its function; turn those the
    fuzzer tells apart from clean vLLM into kills. ``expectations`` (the corpus') keep the
    group types with a known divergence out of the search, as ``kvconform fuzz`` does: else
    every run finds the known divergence first and spends its budget shrinking it."""
    chosen = [r for r in results if r.verdict in FUZZED_VERDICTS and r.mutant.swappable]
    if not chosen:
        return
    timeout = FUZZ_TIMEOUT_BASE_S + examples * 0.5
    by_key = {r.target.key: r for r in resolved}
    space = build_space(vllm, expectations)
    aims: dict[str, tuple[str, ...] | None] = {}
    for result in chosen:
        key = f"{result.mutant.module}:{result.mutant.function}"
        if key not in aims:
            aims[key] = aimed_types(vllm, space, by_key[key])
    spaces = {aim: dataclasses.replace(space, aimed_types=aim or ()) for aim in set(aims.values())}
    order = sorted(spaces, key=lambda aim: aim or ())

    def clean_work(aimed: FuzzSpace) -> Work:
        return lambda: _signatures(vllm, examples, aimed)

    def work_for(result: MutantResult) -> Work:
        mutant = result.mutant
        target = by_key[f"{mutant.module}:{mutant.function}"]
        assert target.source is not None
        source = target.source
        text = mutated_module_text(source, mutant)
        aimed = spaces[aims[target.target.key]]

        def work() -> dict[str, Any]:
            swap_code(target.function, compiled_function_code(text, source.path, source.function))
            vllm.forget_answers()
            return _signatures(vllm, examples, aimed)

        return work

    say(
        f"fuzz: {len(chosen)} mutants the corpus does not kill, {examples} examples each, "
        f"aimed at their function; first the clean vLLM, once per aim ({len(order)})"
    )

    def heard(index: int, payload: dict[str, Any] | None) -> None:
        # Each run's raw signatures as it ends: a run cut short still leaves its record.
        name = (
            f"clean ({order[index] or 'whole space'})"
            if index < len(order)
            else (chosen[index - len(order)].mutant.id)
        )
        state = (
            "timed out"
            if payload is None
            else payload.get("error")
            or (f"{payload['examples']} examples, signatures {payload['signatures']}")
        )
        say(f"fuzz: done {name}: {state}")

    everything = map_in_forks(
        [clean_work(spaces[aim]) for aim in order] + [work_for(r) for r in chosen],
        jobs,
        timeout,
        heard,
    )
    known: dict[tuple[str, ...] | None, set[str]] = {}
    for aim, clean in zip(order, everything[: len(order)], strict=True):
        if clean is None or "error" in clean:
            say(f"fuzz: the clean run aimed at {aim or 'the whole space'} failed: {clean}")
            return
        known[aim] = set(clean["signatures"])
    for result, found in zip(chosen, everything[len(order) :], strict=True):
        mutant = result.mutant
        aim = aims[f"{mutant.module}:{mutant.function}"]
        base = {"examples": examples, "aimed": list(aim) if aim else None}
        if found is None:
            result.fuzz = {**base, "killed": False, "note": "timed out"}
            continue
        if "error" in found:
            result.fuzz = {**base, "killed": False, "note": found["error"]}
            continue
        new = [s for s in found["signatures"] if s not in known[aim]]
        result.fuzz = {
            **base,
            "examples": found["examples"],
            "seconds": found.get("seconds"),
            "killed": bool(new),
            "signatures": new,
        }
        if not new:
            continue
        if result.verdict == "equivalent":
            result.note = (
                result.note + "; " if result.note else ""
            ) + "listed as equivalent but killed by the fuzzer: the entry is stale"
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
