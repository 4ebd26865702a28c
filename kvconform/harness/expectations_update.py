"""``kvconform run --update-expectations``: rewrite the expectations file from a run.

The expectations file is reviewed like code, so the rewrite changes as little
as it can and only what this run proves, for the vLLM version it ran against:

* **added** -- a scenario that failed (or crashed vLLM) with no entry covering
  it gets an entry for its exact id, pinned to this version (``==V``), listing
  the checks that failed. Its ``reason`` is ``TODO: investigate`` and its
  ``evidence`` the first failure message, and comments above it say when it was
  added and how to rerun it: a reviewer sees at once that nobody has explained
  it yet, and :func:`is_unreviewed` lets the reports say so too.
* **narrowed** -- an entry under which every scenario of this run now passes
  (xpassed) stops applying to this version: ``,!=V`` is added to its ``vllm``
  specifier. Other versions keep it: the divergence may well be real there.
* **dropped** -- the same, for an entry that applied to this version only
  (``vllm: ==V``).
* **split** -- a pattern entry under which some scenarios pass now and others
  still diverge is narrowed, and the ones still diverging get exact ``==V``
  entries that copy its reason, evidence and checks.

Entries that do not apply to this version, or that no scenario of this run
matched (``-k`` selected others), are left as they are, byte for byte. Existing
reasons are never changed. The file is written by hand rather than by a YAML
dumper so that comments, order and quoting survive; an entry that has to change
keeps its comments and has only its ``vllm`` line edited. Before writing, the
new text is loaded back and applied to the run's results: nothing may stay
``failed`` or ``xpassed`` for this version, or nothing is written.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from kvconform.errors import ExpectationsUpdateError, ScenarioError
from kvconform.harness.expectations import (
    Expectation,
    apply_expectations,
    load_expectations,
    parse_expectations,
    raw_verdict,
)
from kvconform.harness.yamlio import load_yaml
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict

TODO_REASON = "TODO: investigate"
EVIDENCE_LIMIT = 300
HEADER = """\
# Known divergences: scenarios expected to fail against some vLLM versions.
# Read by `kvconform run` and `pytest scenarios/` (see kvconform/harness/expectations.py).
# Each entry: id (a scenario id or an fnmatch pattern), vllm (a PEP 440 specifier; omitted:
# every version), checks (what is expected to fail, or [error]; omitted: anything), reason,
# evidence (a link to the issue, finding or PR). `kvconform run --update-expectations`
# adds entries for new failures and narrows entries that no longer diverge.
"""


@dataclass
class Change:
    kind: str  # added | narrowed | dropped | split
    pattern: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.pattern}: {self.detail}"


@dataclass
class Plan:
    """What the rewrite does to each existing entry, and what it appends."""

    version: str
    narrow: dict[int, str] = field(default_factory=dict)  # entry index -> new specifier
    drop: set[int] = field(default_factory=set)
    added: list[tuple[Expectation, list[str]]] = field(default_factory=list)  # entry, comments
    # Exact entries split off an entry, written right after it: entry index -> (entry, comments)
    split: dict[int, list[tuple[Expectation, list[str]]]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)


def is_unreviewed(reason: str | None) -> bool:
    """An entry added by the updater that nobody has explained yet."""
    return bool(reason) and str(reason).startswith("TODO")


def _failed_checks(result: ScenarioResult) -> tuple[str, ...]:
    if raw_verdict(result) is Verdict.ERROR:
        return ("error",)
    return tuple(sorted({f.check for f in result.failures}))


def _narrowed(spec: SpecifierSet | None, version: str) -> str | None:
    """``spec`` minus ``version``; None when nothing of it would be left."""
    target = Version(version)
    for item in spec or ():
        if item.operator in ("==", "===") and "*" not in item.version:
            try:
                if Version(item.version) == target:
                    return None
            except InvalidVersion:
                continue
    return f"{spec},!={version}" if spec else f"!={version}"


def _first_failure(result: ScenarioResult) -> str:
    if result.failures:
        failure = result.failures[0]
        text = f"[{failure.check}] {failure.message}"
    else:
        text = result.error or result.verdict.value
    text = " ".join(text.split())
    return text if len(text) <= EVIDENCE_LIMIT else text[: EVIDENCE_LIMIT - 3] + "..."


def plan_update(
    entries: Sequence[Expectation],
    results: Sequence[ScenarioResult],
    version: str,
    rerun: dict[str, str] | None = None,
    today: datetime.date | None = None,
) -> Plan:
    """Decide the rewrite from a run's results (already judged against ``entries``)."""
    try:
        Version(version)
    except InvalidVersion:
        raise ExpectationsUpdateError(
            f"--update-expectations needs a PEP 440 vLLM version to pin entries to, not {version!r}"
        ) from None
    plan = Plan(version)
    today = today or datetime.date.today()
    judged = [r for r in results if r.error_kind is not ErrorKind.INPUT]
    stamp = f"Added by `kvconform run --update-expectations` on {today.isoformat()}"

    for index, entry in enumerate(entries):
        matched = [r for r in judged if entry.applies(r.id, version)]
        passing = [r for r in matched if raw_verdict(r) is Verdict.PASSED]
        if not passing:
            continue
        # Those the entry itself excuses; ones failing some other way get their own entry below.
        still = [
            r
            for r in matched
            if raw_verdict(r) is not Verdict.PASSED
            and entry.covers(replace(r, verdict=raw_verdict(r)))
        ]
        narrowed = _narrowed(entry.vllm, version)
        if narrowed is None:
            plan.drop.add(index)
            plan.changes.append(
                Change("dropped", entry.pattern, f"conforms on vLLM {version}, the only version")
            )
        else:
            plan.narrow[index] = narrowed
            plan.changes.append(
                Change(
                    "narrowed",
                    entry.pattern,
                    f"vllm {str(entry.vllm or '') or '(all)'} -> {narrowed}: "
                    f"{len(passing)} scenario(s) conform on vLLM {version}",
                )
            )
        for result in still:
            # The pattern no longer holds for this version as a whole: keep it for
            # exactly the scenarios that still diverge.
            exact = replace(entry, pattern=result.id, vllm=SpecifierSet(f"=={version}"), line=None)
            comments = [
                f"Split from {entry.pattern!r} by `kvconform run --update-expectations` on "
                f"{today.isoformat()}: it still diverges on vLLM {version}."
            ]
            plan.split.setdefault(index, []).append((exact, comments))
            plan.changes.append(
                Change("split", result.id, f"kept from {entry.pattern!r} for vLLM {version}")
            )

    for result in judged:
        if result.verdict is Verdict.FAILED or (
            result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH
        ):
            checks = _failed_checks(result)
            entry = Expectation(
                result.id,
                TODO_REASON,
                evidence=f"first seen on vLLM {version}: {_first_failure(result)}",
                vllm=SpecifierSet(f"=={version}"),
                checks=checks,
            )
            comments = [f"{stamp} against vLLM {version}; not reviewed yet."]
            if rerun and result.id in rerun:
                comments.append(f"Rerun: {rerun[result.id]}")
            plan.added.append((entry, comments))
            plan.changes.append(
                Change("added", result.id, f"{', '.join(checks)} on vLLM {version} ({TODO_REASON})")
            )
    return plan


# -- writing ----------------------------------------------------------------------------


def _quote(text: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar; quoting every value
    # keeps ids with [ ] * and messages with ': ' or '#' intact.
    return json.dumps(text, ensure_ascii=False)


def _plain_or_quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else _quote(name)


def _splits(plan: Plan, index: int) -> list[str]:
    lines: list[str] = []
    for entry, comments in plan.split.get(index, []):
        lines += ["", *render_entry(entry, comments)]
    return lines


def render_entry(entry: Expectation, comments: Sequence[str] = ()) -> list[str]:
    lines = [f"# {c}" for c in comments]
    lines.append(f"- id: {_quote(entry.pattern)}")
    if entry.vllm is not None:
        lines.append(f"  vllm: {_quote(str(entry.vllm))}")
    if entry.checks:
        lines.append(f"  checks: [{', '.join(_plain_or_quoted(c) for c in entry.checks)}]")
    lines.append(f"  reason: {_quote(entry.reason)}")
    if entry.evidence:
        lines.append(f"  evidence: {_quote(entry.evidence)}")
    return lines


_ITEM = re.compile(r"^-(\s+|$)")
_VLLM_LINE = re.compile(r"^(?P<lead>(?:-\s+)?\s*vllm:\s*)(?P<value>[^#]*?)(?P<tail>\s+#.*)?$")
_KEY_LINE = re.compile(r"^-(?P<pad>\s+)[A-Za-z_]+:")


def _is_glue(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#") or stripped == "---"


def _segments(lines: list[str], starts: list[int]) -> list[tuple[int, int, int]]:
    """Per entry: (first comment line above it, first line, one past its last line)."""
    segments = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(lines)
        while end > start + 1 and _is_glue(lines[end - 1]):
            end -= 1
        lead = start
        while lead > 0 and lines[lead - 1].strip().startswith("#"):
            lead -= 1
        segments.append((lead, start, end))
    return segments


def _edit_vllm(block: list[str], new: str) -> list[str] | None:
    """The entry's lines with its ``vllm`` value replaced or added; None if not block style."""
    if not block or not _ITEM.match(block[0]) or block[0].lstrip("- \t").startswith("{"):
        return None
    for i, line in enumerate(block):
        match = _VLLM_LINE.match(line)
        if match and match.group("value").strip():
            return [
                *block[:i],
                f"{match.group('lead')}{_quote(new)}{match.group('tail') or ''}",
                *block[i + 1 :],
            ]
        if match:
            return None  # a value on the following lines: too unusual to edit in place
    key = _KEY_LINE.match(block[0])
    if key is None:
        return None
    indent = " " * (1 + len(key.group("pad")))
    return [block[0], f"{indent}vllm: {_quote(new)}", *block[1:]]


def rewrite(text: str, file: str, entries: Sequence[Expectation], plan: Plan) -> str:
    """The new file text: ``text`` with the plan applied, everything else kept."""
    lines = text.splitlines()
    doc = load_yaml(text, file) if text.strip() else None
    starts = [n - 1 for n in getattr(doc, "item_lines", [])]
    editable = len(starts) == len(entries) and all(_ITEM.match(lines[s]) for s in starts)
    out: list[str]
    if not entries:
        # Nothing to keep but comments, if the file is only comments.
        keep = any(line.strip() for line in lines) and all(_is_glue(line) for line in lines)
        out = lines if keep else HEADER.rstrip("\n").splitlines()
    elif not editable:
        # A flow-style or otherwise unusual file: written anew in the plain style.
        out = HEADER.rstrip("\n").splitlines()
        for index, entry in enumerate(entries):
            if index in plan.drop:
                continue
            if index in plan.narrow:
                entry = replace(entry, vllm=SpecifierSet(plan.narrow[index]))
            out += ["", *render_entry(entry), *_splits(plan, index)]
    else:
        out = []
        cursor = 0
        for index, (lead, start, end) in enumerate(_segments(lines, starts)):
            out += lines[cursor:lead]
            block = lines[start:end]
            if index in plan.drop:
                # The entry goes with the comments written right above it.
                cursor = end
                while cursor < len(lines) and not lines[cursor].strip() and out and not out[-1]:
                    cursor += 1
                continue
            if index in plan.narrow:
                edited = _edit_vllm(block, plan.narrow[index])
                if edited is None:
                    entry = replace(entries[index], vllm=SpecifierSet(plan.narrow[index]))
                    edited = render_entry(entry)
                block = edited
            out += lines[lead:start] + block + _splits(plan, index)
            cursor = end
        out += lines[cursor:]
    while out and not out[-1].strip():
        out.pop()
    for entry, comments in plan.added:
        out += ["", *render_entry(entry, comments)]
    return "\n".join(out).lstrip("\n") + "\n"


def verify(
    text: str, file: str, results: Sequence[ScenarioResult], version: str
) -> list[ScenarioResult]:
    """Apply the new text to fresh copies of the results; what would still be wrong."""
    try:
        entries = parse_expectations(text, file)
    except ScenarioError as exc:
        raise ExpectationsUpdateError(f"the rewritten expectations do not load: {exc}") from None
    wrong = []
    for result in results:
        if result.error_kind is ErrorKind.INPUT:
            continue
        fresh = replace(result, verdict=raw_verdict(result), expectation=None)
        judged = apply_expectations(fresh, entries, version)
        if judged.verdict is Verdict.XPASSED or (
            judged.verdict is Verdict.FAILED
            or (judged.verdict is Verdict.ERROR and judged.error_kind is ErrorKind.CRASH)
        ):
            wrong.append(judged)
    return wrong


def update_expectations(
    path: str | Path,
    results: Sequence[ScenarioResult],
    version: str,
    rerun: dict[str, str] | None = None,
    today: datetime.date | None = None,
) -> list[Change]:
    """Rewrite (or create) the expectations file at ``path`` from a run's results."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    entries = load_expectations(path) if path.exists() else []
    plan = plan_update(entries, results, version, rerun, today)
    if not plan.changes:
        return []
    new_text = rewrite(text, str(path), entries, plan)
    wrong = verify(new_text, str(path), results, version)
    if wrong:
        raise ExpectationsUpdateError(
            f"not writing {path}: after the rewrite {wrong[0].id} would still be "
            f"{wrong[0].verdict.value} on vLLM {version} (a bug in kvconform; please report it)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new_text, encoding="utf-8")
    return plan.changes
