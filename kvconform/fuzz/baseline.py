"""A differential baseline: does another vLLM tree fail the same document the same way?

A search over a vLLM under test (a patched tree, a checkout) meets failures that
the release it started from shows as well: standing divergences and false alarms,
not what the change did. Differential testing asks the reference the same
question before it spends anything on an answer: when the search's first failing
example of a round has a signature not seen yet, :func:`kvconform.fuzz.search.search`
runs the very same document on the *baseline* vLLM; a signature the baseline shows
on it too is recorded as the baseline's (:class:`BaselineFailure`) and never
searched for again, and the search goes on. While a finding is shrunk, a candidate
only counts when the baseline does *not* show the finding's signature on it, so
the shrunk reproducer is one the baseline passes (for that signature).

Two vLLM trees cannot live in one interpreter (``--vllm-src`` must be the first vLLM
it imports), so the baseline runs in a process of its own that stays up for the whole
search (:class:`BaselineProcess`): ``python -m kvconform.fuzz.baseline --vllm-src
TREE`` imports vLLM once, then reads one scenario document a line (JSON) on stdin and
answers each with the signatures of its failures on stdout. The document is the text
the search itself runs, loaded by the same loader and run by the same driver as
``kvconform run``. The search only needs :class:`Baseline` (a protocol: the fast
tests stand in for the process).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from kvconform.errors import VllmUnavailable
from kvconform.fuzz.findings import Signature, first_message, signatures

# What the baseline made of a document it could not judge: no signature to compare.
UNJUDGED = ("rejected", "unsupported", "input", "internal", "refused")


@dataclass(frozen=True)
class BaselineAnswer:
    """The baseline's run of one document: its failures' signatures, and how it ended."""

    signatures: tuple[Signature, ...]
    outcome: str  # passed | failed | crash | one of UNJUDGED
    messages: tuple[str, ...] = ()  # each signature's first failure message, in order
    seconds: float = 0.0  # the run in the baseline process, transfer apart

    def message(self, signature: Signature) -> str:
        """The baseline's message for the failure it shows like ``signature``."""
        for shown, message in zip(self.signatures, self.messages, strict=False):
            if across_trees(shown) == across_trees(signature):
                return message
        return ""

    def shows(self, signature: Signature) -> bool:
        """Whether the baseline failed the document as ``signature`` says, in its own tree."""
        return across_trees(signature) in {across_trees(s) for s in self.signatures}


_LINE = re.compile(r":\d+(?= )")


def across_trees(signature: Signature) -> Signature:
    """``signature`` as two vLLM trees can share it: a crash's vLLM frame without its line.

    A patch moves the lines below what it changes, so the same assertion of the same
    function raises at another line number in the patched tree than in its release.
    """
    if signature.check != "crash":
        return signature
    return Signature(signature.check, signature.subject, _LINE.sub("", signature.detail))


class Baseline(Protocol):
    """The reference a search compares its failures with."""

    def describe(self) -> str:
        """Which vLLM it is (for the statistics and the summary)."""
        ...

    def judge(self, text: str) -> BaselineAnswer:
        """Run the scenario document ``text`` on the baseline vLLM."""
        ...


@dataclass
class BaselineFailure:
    """A signature the search met that the baseline shows on the same document."""

    signature: Signature
    examples_before: int  # examples of the search until it showed
    message: str  # the baseline's message for it

    def to_json(self) -> dict[str, Any]:
        return {
            "signature": str(self.signature),
            "parts": [self.signature.check, self.signature.subject, self.signature.detail],
            "examples_before": self.examples_before,
            "message": self.message,
        }


@dataclass
class BaselineStats:
    """What comparing with the baseline cost and found, for the summary."""

    vllm: str = ""
    setup_seconds: float = 0.0  # starting the process (vLLM's import) until it answered
    search_runs: int = 0  # first-failing examples run on the baseline
    shrink_runs: int = 0  # shrink candidates that showed the target, run on the baseline
    seconds: float = 0.0  # wall time of those runs, as the search waited for them
    unjudged: int = 0  # runs the baseline could not judge (rejected, unsupported, ...)
    failures: list[BaselineFailure] = field(default_factory=list)

    def count(self, answer: BaselineAnswer, waited: float, shrinking: bool) -> None:
        if shrinking:
            self.shrink_runs += 1
        else:
            self.search_runs += 1
        self.seconds += waited
        self.unjudged += answer.outcome in UNJUDGED

    def to_json(self) -> dict[str, Any]:
        runs = self.search_runs + self.shrink_runs
        return {
            "vllm": self.vllm,
            "setup_seconds": round(self.setup_seconds, 2),
            "search_runs": self.search_runs,
            "shrink_runs": self.shrink_runs,
            "seconds": round(self.seconds, 2),
            "seconds_per_run": round(self.seconds / runs, 3) if runs else 0.0,
            "unjudged": self.unjudged,
            "failures": [f.to_json() for f in self.failures],
        }

    def add(self, other: dict[str, Any]) -> None:
        """Fold a worker's ``to_json`` in (``--jobs``): counts add, failures once a signature."""
        self.vllm = self.vllm or str(other.get("vllm", ""))
        self.setup_seconds = max(self.setup_seconds, float(other["setup_seconds"]))
        for name in ("search_runs", "shrink_runs", "unjudged"):
            setattr(self, name, getattr(self, name) + int(other[name]))
        self.seconds += float(other["seconds"])
        seen = {f.signature for f in self.failures}
        for entry in other["failures"]:
            signature = Signature(*entry["parts"])
            if signature not in seen:
                seen.add(signature)
                self.failures.append(
                    BaselineFailure(signature, int(entry["examples_before"]), entry["message"])
                )

    def summary_line(self) -> str:
        runs = self.search_runs + self.shrink_runs
        per_run = f"{self.seconds / runs:.2f} s a run" if runs else "no run"
        shown = ", ".join(str(f.signature) for f in self.failures) or "none"
        return (
            f"  baseline {self.vllm}: {runs} runs ({self.search_runs} first failures, "
            f"{self.shrink_runs} shrink candidates) in {self.seconds:.1f} s ({per_run}), "
            f"start {self.setup_seconds:.1f} s; the baseline's own failures: {shown}"
        )


class BaselineProcess:
    """The baseline vLLM in a process of its own, kept up for a whole search."""

    def __init__(self, src: str | Path, log: Path | None = None) -> None:
        """Start the process; it imports vLLM while the caller does other work (its own
        vLLM's import): :meth:`wait_ready` waits for it, :meth:`judge` does too."""
        self.src = str(src)
        self.version = ""
        self.setup_seconds = 0.0
        self._log: IO[bytes] | None = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._log = log.open("ab")
        self._started = time.perf_counter()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "kvconform.fuzz.baseline", "--vllm-src", self.src],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )

    def wait_ready(self) -> BaselineProcess:
        """Wait until the baseline's vLLM is imported; ``setup_seconds`` since the start."""
        if self.version:
            return self
        hello = self._receive()
        self.setup_seconds = time.perf_counter() - self._started
        if not hello.get("ready"):
            self.close()
            raise VllmUnavailable(
                "(baseline)", f"a baseline vLLM at {self.src}", str(hello.get("error", "?"))
            )
        self.version = str(hello["version"])
        return self

    def describe(self) -> str:
        return f"vLLM {self.version} ({self.src})"

    def judge(self, text: str) -> BaselineAnswer:
        self.wait_ready()
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps({"text": text}) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # the answer's read below says the process died
        reply = self._receive()
        return BaselineAnswer(
            tuple(Signature(*parts) for parts in reply["signatures"]),
            str(reply["outcome"]),
            tuple(str(m) for m in reply.get("messages", ())),
            float(reply.get("seconds", 0.0)),
        )

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> BaselineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            status = self._process.wait()
            raise VllmUnavailable(
                "(baseline)",
                f"a baseline vLLM at {self.src}",
                f"its process ended (exit {status})"
                + (f"; its log: {self._log.name}" if self._log is not None else ""),
            )
        answer: dict[str, Any] = json.loads(line)
        return answer


def _answer(text: str, vllm: Any) -> dict[str, Any]:
    """One document run on the baseline: its signatures and outcome, as the search signs them."""
    from kvconform.errors import ScenarioError
    from kvconform.harness.loader import load_text
    from kvconform.harness.runner import run_scenario
    from kvconform.model.results import ErrorKind, Verdict

    started = time.perf_counter()
    try:
        (scenario,) = load_text(text, "<baseline>")
    except ScenarioError as exc:  # the search's own loader took it: another kvconform? say so
        return {"signatures": [], "outcome": "refused", "messages": [str(exc)]}
    result = run_scenario(scenario, vllm)
    found = signatures(result)
    if result.pool_exhausted:
        outcome = "rejected"
    elif result.error_kind is ErrorKind.UNSUPPORTED:
        outcome = "unsupported"
    elif result.error_kind is ErrorKind.INPUT:
        outcome = "input"
    elif result.error_kind is ErrorKind.INTERNAL:
        outcome = "internal"
    elif result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH:
        outcome = "crash"
    else:
        outcome = "failed" if found else "passed"
    return {
        "signatures": [[s.check, s.subject, s.detail] for s in found],
        "outcome": outcome,
        "messages": [first_message(result, signature) for signature in found],
        "seconds": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The baseline process: answers documents on stdin, one JSON line each, until EOF."""
    parser = argparse.ArgumentParser(prog="python -m kvconform.fuzz.baseline")
    parser.add_argument("--vllm-src", required=True, metavar="TREE")
    args = parser.parse_args(argv)
    # The answers get a descriptor of their own; whatever vLLM or a library prints
    # (vLLM logs to stdout) goes to stderr, the caller's log, not into the answers.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    from kvconform.harness.session import load_vllm

    try:
        vllm = load_vllm(args.vllm_src)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the answer, said once
        reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 3
    reply({"ready": True, "version": vllm.version})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply(_answer(json.loads(line)["text"], vllm))
        except Exception as exc:  # noqa: BLE001 - kvconform's own error: not a comparison
            reply({"signatures": [], "outcome": "internal",
                   "messages": [f"{type(exc).__name__}: {exc}"]})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
