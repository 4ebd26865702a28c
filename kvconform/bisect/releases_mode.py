"""``kvconform bisect --releases A..B``: bisect vLLM's PyPI releases.

The candidates are the releases from A to B on pip's index, oldest first
(:mod:`.release_index`). Both ends are probed first: A must be old and B new
(without ``--find-fix``: A conforms and B does not; with it, the reverse), or
the bisection stops with exit 2 and both verdicts. Then :mod:`.search` picks
each next release; a probe downloads the release's Python tree once
(:func:`kvconform.harness.releases.release_tree`) and runs ``kvconform check
--vllm-release VER`` in a fresh process (:mod:`.probe`). A release that
cannot be downloaded or exercised is skipped.

:func:`run_search` is the loop itself, over any list of labels and any probe
function, so that it is tested without vLLM and without the network.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kvconform.bisect import release_index
from kvconform.bisect.outcome import (
    Outcome,
    describe_status,
    outcome_of,
    terms,
)
from kvconform.bisect.probe import ProbeCache, run_check
from kvconform.bisect.search import conclude, next_probe, probe_budget
from kvconform.bisect.selection import Selection, bisect_key, select
from kvconform.bisect.state import BisectState, ProbeRecord
from kvconform.bisect.summary import (
    Say,
    flipped,
    next_commit_bisection,
    print_flip_causes,
    print_flips,
    print_probes,
    probe_line,
)
from kvconform.errors import BisectAborted, ExitStatus, KvconformError, UsageError
from kvconform.paths import cache_dir

Probe = Callable[[str], ProbeRecord]

# Exit statuses of `kvconform bisect` itself: found the boundary; the ends do not
# differ as asked (the user's range is wrong); some probe could not decide.
FOUND, ENDS_WRONG, UNDECIDED = ExitStatus.CONFORM, ExitStatus.BAD_INPUT, ExitStatus.NOT_EXERCISED


def bisect_releases(args: argparse.Namespace, say: Say) -> int:
    first, last = release_index.parse_range(args.releases)
    selection = select(
        args.paths,
        args.expression,
        args.expectations,
        args.no_expectations,
        checks=getattr(args, "checks", None),
    )
    settings = {
        "mode": "releases",
        "range": f"{first}..{last}",
        "pre": bool(args.pre),
        "find_fix": bool(args.find_fix),
        "selection": selection.digest,
    }
    key = bisect_key(**settings)
    state, resumed = BisectState.open(cache_dir("bisect", key), key, settings, fresh=args.fresh)
    if resumed:
        say(f"resuming the bisection saved in {state.path} ({len(state.probes)} probes done)")
    if not state.candidates:
        versions = release_index.list_releases(refresh=args.fresh, say=say)
        state.candidates = release_index.releases_between(versions, first, last, args.pre)
        state.save()
    cache = ProbeCache(selection)
    say(
        f"bisecting {len(state.candidates)} vLLM releases {first}..{last} "
        f"({', '.join(state.candidates)}) on {len(selection.scenario_ids)} scenarios"
        + (f" with checks {','.join(selection.checks)}" if selection.checks_args() else "")
        + (", looking for the fix" if args.find_fix else "")
    )
    status = run_search(
        state, release_prober(selection, cache, args.fresh, say), args.find_fix, say, "release"
    )
    if state.result is not None and status in (FOUND, UNDECIDED):
        command = next_commit_bisection(
            state.result["last_old"],
            state.result["first_new"],
            bool(args.find_fix),
            selection_args(args, selection),
        )
        state.result["next"] = command
        state.save()
        say(
            "\nNext, the commit: bisect a vLLM checkout (VLLM_CHECKOUT, a clone of "
            "github.com/vllm-project/vllm; vLLM tags release X.Y.Z as vX.Y.Z) between the two "
            "releases, on the same scenarios with the same checks and expectations:"
        )
        say(f"  {command}")
    return status


def selection_args(args: argparse.Namespace, selection: Selection) -> list[str]:
    """The paths, ``-k``, ``--checks`` and expectation options as the user gave them, for
    a command printed to run next (from the same folder)."""
    words = list(args.paths)
    if args.expression:
        words += ["-k", args.expression]
    words += selection.checks_args()
    if args.no_expectations:
        words.append("--no-expectations")
    elif args.expectations:
        words += ["--expectations", args.expectations]
    return words


def release_prober(selection: Selection, cache: ProbeCache, fresh: bool, say: Say) -> Probe:
    from kvconform.harness.releases import cached_releases, release_tree

    def probe(version: str) -> ProbeRecord:
        label = version
        if not fresh:
            cached = cache.get(label)
            if cached is not None:
                return cached
        if version not in cached_releases():
            say(f"         fetching vllm=={version} from PyPI (once; its Python tree is cached)")
        try:
            release_tree(version)  # download here, where a failure is a skip, not an abort
        except KvconformError as exc:
            return ProbeRecord(label, ExitStatus.NOT_EXERCISED, reason=str(exc), cacheable=False)
        record = run_check(label, ["--vllm-release", version], selection, cache.fresh_folder(label))
        cache.put(record)
        return record

    return probe


def run_search(
    state: BisectState, probe: Probe, find_fix: bool, say: Say, what: str = "candidate"
) -> int:
    """Verify the ends, bisect, print the conclusion; the exit status of ``bisect``."""
    labels = state.candidates
    n = len(labels)
    if n < 2:
        raise UsageError(f"need at least two {what}s to bisect, got {labels}")
    old, new = terms(find_fix)
    outcomes: dict[int, Outcome] = {}
    budget = probe_budget(n)

    def take(index: int) -> Outcome:
        label = labels[index]
        record = state.probes.get(label)
        if record is None:
            record = probe(label)
            state.record(record)
        else:
            record.cached = True
        say(probe_line(state.number(label), record, find_fix, f" (of at most {budget})"))
        outcome = outcome_of(record.run_status, find_fix)
        if outcome is Outcome.ABORT:
            state.probes.pop(label, None)
            state.save()
            raise BisectAborted(f"probe of {what} {label} aborted: {record.reason}")
        outcomes[index] = outcome
        return outcome

    ends = (take(0), take(n - 1))
    if ends != (Outcome.OLD, Outcome.NEW):
        a, b = (state.probes[labels[i]] for i in (0, n - 1))
        wanted = "nonconform" if find_fix else "conform"
        say(
            f"\ncannot bisect: {labels[0]} is {describe_status(a.run_status)} and {labels[-1]} "
            f"is {describe_status(b.run_status)}; the oldest {what} must {wanted} and the "
            f"newest must not" + _hint(a.run_status, b.run_status, find_fix)
        )
        return ENDS_WRONG
    while (index := next_probe(n, outcomes)) is not None:
        take(index)
        lo, hi = conclude(n, outcomes).last_old, conclude(n, outcomes).first_new
        say(f"         now between {labels[lo]} ({old}) and {labels[hi]} ({new})")
    boundary = conclude(n, outcomes)
    last_old, first_new = labels[boundary.last_old], labels[boundary.first_new]
    flips = flipped(state.probes[last_old], state.probes[first_new])
    say("")
    kind = "fixed (first conforming)" if find_fix else "bad (first nonconforming)"
    if boundary.exact:
        say(f"First {kind} {what}: {first_new}  (last {old}: {last_old})")
    else:
        maybe = [labels[i] for i in boundary.untestable] + [first_new]
        say(
            f"Only {what}s that cannot be exercised lie between {last_old} ({old}) and "
            f"{first_new} ({new}): the first {new} {what} is any of {', '.join(maybe)}"
        )
    print_flips(flips, last_old, first_new, say)
    nonconforming = state.probes[last_old if find_fix else first_new]
    causes = print_flip_causes(flips, nonconforming, say)
    print_probes(state, find_fix, say)
    state.result = {
        "first_new": first_new,
        "last_old": last_old,
        "untestable": [labels[i] for i in boundary.untestable],
        "flipped": [f.to_json() for f in flips],
        "root_causes": [c.to_json() for c in causes],
        "probes": len(state.probes),
    }
    state.save()
    return FOUND if boundary.exact else UNDECIDED


def _hint(first: int | None, last: int | None, find_fix: bool) -> str:
    if (first, last) == (1, 0) and not find_fix:
        return " (it looks like a fix: add --find-fix)"
    if (first, last) == (0, 1) and find_fix:
        return " (it looks like a regression: drop --find-fix)"
    if first == last:
        return " (nothing changed between them for these scenarios)"
    if ExitStatus.NOT_EXERCISED in (first, last):
        return " (an end that cannot be exercised cannot anchor a bisection)"
    return ""
