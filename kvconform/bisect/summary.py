"""How a bisection reports: one line per probe, then the boundary and what flipped.

The scenarios that *flipped* are those whose verdict differs between the two
probes on either side of the boundary (the nearest old candidate and the first
new one); each is shown with the first failure or error of whichever side did
not conform, which is usually the whole story. Then the flips by root cause: the
nonconforming side's probe is a ``kvconform check`` run, whose ``report.json``
holds its failures gathered as ``kvconform run`` gathers them
(:func:`kvconform.harness.root_causes.find_root_causes`); each group is shown
with the flipped scenarios in it. After a release bisection, the commit
bisection to run next (:func:`next_commit_bisection`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvconform.bisect.outcome import describe_status, outcome_of, terms
from kvconform.bisect.state import BisectState, ProbeRecord
from kvconform.model.root_causes import PARTIES

Say = Callable[[str], None]


_OK = ("passed", "xfailed", "xpassed", "absent")


@dataclass(frozen=True)
class Flip:
    """A scenario whose verdict differs across the boundary.

    ``decisive`` when it went from conforming to not or back (what the
    bisection tracked); otherwise a change such as xfailed -> xpassed.
    """

    scenario: str
    before: str
    after: str
    headline: str

    @property
    def decisive(self) -> bool:
        return (self.before in _OK) != (self.after in _OK)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decisive": self.decisive}


def flipped(old: ProbeRecord, new: ProbeRecord) -> list[Flip]:
    flips = []
    for scenario in dict.fromkeys([*old.verdicts, *new.verdicts]):
        before = old.verdicts.get(scenario, "absent")
        after = new.verdicts.get(scenario, "absent")
        if before != after:
            headline = new.headlines.get(scenario) or old.headlines.get(scenario) or ""
            flips.append(Flip(scenario, before, after, headline))
    return flips


def probe_line(number: int, record: ProbeRecord, find_fix: bool, title: str = "") -> str:
    """``probe 3: 0.30.0  nonconform (1 of 1 failed) -> bad  19.2 s  DIR``."""
    outcome = outcome_of(record.run_status, find_fix)
    old, new = terms(find_fix)
    meaning = {"old": old, "new": new, "skip": "skip", "abort": "abort"}[outcome.value]
    status = describe_status(record.run_status) if record.run_status is not None else "no report"
    counts = ""
    if record.verdicts:
        counts = f" ({record.failed_count()} of {len(record.verdicts)} failed)"
    when = "cached" if record.cached else f"{record.duration:.1f} s"
    line = f"probe {number}: {record.label}{title}  {status}{counts} -> {meaning}  [{when}]"
    if outcome.value in ("skip", "abort") and record.reason:
        line += f"\n         {record.reason}"
    return line


MAX_SHOWN = 12
MAX_HEADLINE = 220


def short(headline: str) -> str:
    """A failure message without its explanation, on about two lines."""
    text = headline.split(" (why:", 1)[0]
    return text if len(text) <= MAX_HEADLINE else text[: MAX_HEADLINE - 3] + "..."


def print_flips(flips: list[Flip], old_label: str, new_label: str, say: Say) -> None:
    decisive = [f for f in flips if f.decisive]
    if not decisive:
        say(
            f"No scenario went from conforming to not, or back, between {old_label} and {new_label}."
        )
    else:
        say(f"Scenarios that flipped between {old_label} and {new_label}:")
    for flip in decisive[:MAX_SHOWN]:
        say(f"  {flip.scenario}: {flip.before} -> {flip.after}")
        if flip.headline:
            say(f"      {short(flip.headline)}")
    if len(decisive) > MAX_SHOWN:
        say(f"  ... and {len(decisive) - MAX_SHOWN} more (every one is in bisect's state file)")
    others = [f for f in flips if not f.decisive]
    if others:
        say(
            "Other verdict changes there: "
            + ", ".join(f"{f.scenario} {f.before} -> {f.after}" for f in others)
        )


@dataclass(frozen=True)
class FlipCause:
    """One root-cause group of the nonconforming side, and the flipped scenarios in it."""

    check: str
    party: str
    miss: str
    scenarios: tuple[str, ...]
    # What the group names in vLLM where narrower than the party (report.json's
    # vllm_function / vllm_file: the manager class a group points at), and its checks.
    function: str | None = None
    file: str | None = None
    checks: tuple[str, ...] = ()

    def sentence(self) -> str:
        party = PARTIES.get(self.party)
        if party is None:
            who = self.party
        elif self.function and self.function != party.function:
            who = f"{party.description}'s {self.function} ({self.file or party.file})"
        else:
            who = f"{party.description} {party.function} ({party.file})"
        n = len(self.scenarios)
        checks = ", ".join(self.checks or (self.check,))
        return f"{n} flipped scenario{'s' if n != 1 else ''}: {who} {self.miss} [{checks}]"

    def to_json(self) -> dict[str, Any]:
        named = {k: v for k, v in asdict(self).items() if v not in (None, ())}
        return {**named, "scenarios": list(self.scenarios)}


def flip_causes(flips: Sequence[Flip], nonconforming: ProbeRecord) -> list[FlipCause]:
    """The decisive flips by the root-cause groups of the probe that did not conform,
    largest first (a scenario with records of two groups is in both)."""
    decisive = {f.scenario for f in flips if f.decisive}
    causes = []
    for group in nonconforming.root_causes:
        ids = tuple(s for s in group.get("scenarios", []) if s in decisive)
        if ids:
            causes.append(
                FlipCause(
                    group["check"],
                    group["party"],
                    group["miss"],
                    ids,
                    group.get("vllm_function"),
                    group.get("vllm_file"),
                    tuple(group.get("checks") or ()),
                )
            )
    return sorted(causes, key=lambda c: -len(c.scenarios))


def print_flip_causes(
    flips: Sequence[Flip], nonconforming: ProbeRecord, say: Say
) -> list[FlipCause]:
    causes = flip_causes(flips, nonconforming)
    if not causes:
        return causes
    say(
        f"The flips by root cause (the failures of {nonconforming.label}, gathered as "
        "`kvconform run` gathers them):"
    )
    for number, cause in enumerate(causes[:MAX_SHOWN], 1):
        say(f"  {number}. {cause.sentence()}")
        shown = ", ".join(cause.scenarios[:5])
        say(
            f"     {shown}"
            + (f", ... {len(cause.scenarios) - 5} more" if len(cause.scenarios) > 5 else "")
        )
    grouped = {s for c in causes for s in c.scenarios}
    rest = [f.scenario for f in flips if f.decisive and f.scenario not in grouped]
    if rest:
        say(f"  in no group (an error, not a failed check): {', '.join(rest[:MAX_SHOWN])}")
    return causes


def release_tag(version: str) -> str:
    """vLLM's git tag of a release: ``v0.28.0``."""
    return f"v{version}"


def next_commit_bisection(
    last_old: str, first_new: str, find_fix: bool, selection_args: Sequence[str]
) -> str:
    """The ``kvconform bisect --repo`` command that narrows a release boundary to its
    commit: the two releases' tags, the same scenarios, checks and expectations."""
    good, bad = (first_new, last_old) if find_fix else (last_old, first_new)
    words = ["kvconform", "bisect", "--repo", "VLLM_CHECKOUT", "--good", release_tag(good)]
    words += ["--bad", release_tag(bad), *(["--find-fix"] if find_fix else []), *selection_args]
    return shlex.join(words)


_DEV_COMMIT = re.compile(r"\+g([0-9a-f]{7,40})\b")
_RELEASE = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?$")


def vllm_commit(version: str | None) -> str | None:
    """The vLLM commit a version names: a development build's ``+g<sha>`` (vLLM's
    setuptools-scm versions, ``0.34.0.dev12+g1a2b3c4d``) or a release's tag ``vX.Y.Z``."""
    if not version:
        return None
    found = _DEV_COMMIT.search(version)
    if found:
        return found.group(1)
    return release_tag(version) if _RELEASE.match(version) else None


def nightly_bisect_command(
    report: Mapping[str, Any],
    paths: Sequence[str],
    repo: str | None = None,
    good: str | None = None,
    bad: str | None = None,
) -> str:
    """The ``kvconform bisect --repo`` command that bisects what a nightly judged: its
    scenarios, its checks and its expectation options (``report.json``'s), between the
    last green nightly's vLLM commit (``good``) and this one's (``bad``, else the commit
    its vLLM version names). Unknowns are left as words to fill in."""
    from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS

    checks = tuple(report.get("checks") or DEFAULT_CHECKS)
    options: list[str] = []
    if set(checks) == set(CHECKS):
        options += ["--checks", "all"]
    elif set(checks) != set(DEFAULT_CHECKS):
        options += ["--checks", ",".join(checks)]
    rerun = list(report.get("rerun_options") or [])
    for i, word in enumerate(rerun):
        if word == "--no-expectations":
            options.append(word)
        elif word == "--expectations" and i + 1 < len(rerun):
            options += [word, rerun[i + 1]]
    bad = bad or vllm_commit((report.get("vllm") or {}).get("version")) or "THIS_COMMIT"
    words = ["kvconform", "bisect", "--repo", repo or "VLLM_CHECKOUT"]
    words += ["--good", good or "LAST_GREEN_COMMIT", "--bad", bad, *paths, *options]
    return shlex.join(words)


def print_probes(state: BisectState, find_fix: bool, say: Say) -> None:
    probes = list(state.probes.values())
    cached = sum(1 for p in probes if p.cached)
    total = sum(p.duration for p in probes if not p.cached)
    say(f"Probes ({len(probes)}, {cached} cached, {total:.1f} s of probing) and their reports:")
    old, new = terms(find_fix)
    for record in probes:
        outcome = outcome_of(record.run_status, find_fix).value
        meaning = {"old": old, "new": new}.get(outcome, outcome)
        say(
            f"  {record.label:14} {describe_status(record.run_status):16} {meaning:7} {record.report_dir}"
        )
    say(f"State: {state.path}")
