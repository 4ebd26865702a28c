"""The root-cause groups as the few lines a console or a CI summary shows first.

Upstream causes first, then the largest (:mod:`kvconform.harness.root_causes`), each with its count, what falls short where in vLLM, one
representative scenario and the ``kvconform explain`` command that shows it step
by step. The HTML report draws the same groups as cards (:mod:`kvconform.reports.html`).
"""

from __future__ import annotations

from kvconform.harness.root_causes import never_below_floor
from kvconform.model.results import RunReport
from kvconform.model.root_causes import PARTIES, RootCause
from kvconform.model.wording import count

__all__ = ["MAX_GROUPS_LISTED", "group_lines", "never_below_floor_text", "spans"]

# A run with more groups than this lists the largest; report.json has every one.
MAX_GROUPS_LISTED = 8


def spans(group: RootCause) -> str:
    """What a group reaches across: its group types and methods."""
    return (
        f"group types {', '.join(group.group_types) or '-'}; "
        f"methods {', '.join(group.methods) or '-'}"
    )


def group_lines(report: RunReport, limit: int = MAX_GROUPS_LISTED) -> list[str]:
    """Plain-text lines, one block per group: the sentence, the representative, its explain."""
    groups = report.root_causes
    if not groups:
        return []
    records = sum(g.records for g in groups)
    lines = [
        f"{count(records, 'failure record')} in {count(len(groups), 'root-cause group')}"
        + (", upstream causes first, then the largest:" if len(groups) > 1 else ":")
    ]
    fine = never_below_floor_text(report)
    if fine:
        lines.append(f"  ({fine})")
    for number, group in enumerate(groups[:limit], 1):
        rep = group.representative
        lines.append(f"  {number}. {group.sentence()}")
        lines.append(f"     {spans(group)}")
        lines.append(f"     e.g. {rep.id}: {report.explain_command(rep.file, rep.id)}")
    if len(groups) > limit:
        lines.append(f"  ... {len(groups) - limit} smaller groups in report.json and report.html")
    return lines


def never_below_floor_text(report: RunReport) -> str:
    """ "the live allocator never falls below the floor", for the parties that did not."""
    parties = [PARTIES[p].description for p in never_below_floor(report.results) if p in PARTIES]
    if not parties:
        return ""
    verb = "never falls" if len(parties) == 1 else "never fall"
    return f"{' and '.join(parties)} {verb} below the floor"
