"""``report.html``: the coverage sections (what the run exercised against what vLLM
offers; with ``coverage --vllm-code``, which lines of vLLM's reservation code ran)."""

from __future__ import annotations

from collections.abc import Iterable

from kvconform.model.coverage import KIND_LETTERS, Coverage, OfferedItem, status_rank
from kvconform.model.vllm_code import VllmCodeCoverage
from kvconform.reports.html_base import e


def coverage_section(coverage: Coverage, with_code: bool = False) -> list[str]:
    types, methods, kinds = coverage.group_types(), coverage.methods(), coverage.step_kinds()
    out = [
        '<h2 id="coverage">Coverage</h2>',
        f'<p class="note">{coverage.exercised} of {coverage.scenarios} scenarios were exercised '
        "(the others errored before their checks ran; their group types and methods count as "
        "attempted only). Computed from this run's scenarios and results.</p>",
    ]
    if with_code:
        out.append(
            '<p class="note">Which lines and branches of vLLM\'s reservation code these '
            'scenarios executed: <a href="#vllm-code">below</a>, each file\'s source with its '
            "unexecuted lines marked one click further.</p>"
        )
    if types:
        legend = ", ".join(f"<b>{e(KIND_LETTERS.get(k, '?'))}</b> {e(k)}" for k in kinds)
        out.append(f"<h4>Group type x speculative method</h4><p class='note'>{legend}</p>")
        out.append('<table class="matrix"><thead><tr><th class="l">group type</th>')
        out += [f"<th>{e(m)}</th>" for m in methods]
        out.append("</tr></thead><tbody>")
        for t in types:
            out.append(f'<tr><td class="l"><code>{e(t)}</code></td>')
            for m in methods:
                found = coverage.kinds_for(t, m)
                if found:
                    letters = "".join(KIND_LETTERS.get(k, "?") for k in found)
                    out.append(
                        f'<td class="hitn mono" title="{e(", ".join(found))}">{letters}</td>'
                    )
                elif (t, m) in coverage.attempted:
                    ids = ", ".join(sorted(coverage.attempted[(t, m)]))
                    out.append(f'<td class="attempt" title="errored: {e(ids)}">errored</td>')
                else:
                    out.append('<td class="hit0">&middot;</td>')
            out.append("</tr>")
        out.append("</tbody></table>")
        out.append("<h4>Group type x step kind (number of scenarios)</h4>")
        out.append('<table class="matrix"><thead><tr><th class="l">group type</th>')
        out += [f"<th>{e(k)}</th>" for k in kinds]
        out.append("</tr></thead><tbody>")
        for t in types:
            out.append(f'<tr><td class="l"><code>{e(t)}</code></td>')
            for k in kinds:
                n = len(coverage.scenarios_for(t, k))
                css = "hitn" if n else "hit0"
                out.append(f'<td class="{css}">{n if n else "&middot;"}</td>')
            out.append("</tr>")
        out.append("</tbody></table>")
    if coverage.offered is not None:
        out.append(f"<h4>What vLLM {e(coverage.offered.version)} offers</h4>")
        out += _offered_table("KV spec class", coverage.offered_spec_classes(), with_type=True)
        out += _offered_table("speculative method", coverage.primary_methods(), with_type=False)
        aliases = coverage.method_variants()
        if aliases:
            listed = "; ".join(f"as {k}: {', '.join(v)}" for k, v in aliases.items())
            out.append(
                '<p class="note">Not listed above: variants that vLLM runs as another method, '
                f"so they share its status ({e(listed)}).</p>"
            )
    gaps = coverage.gaps()
    if gaps:
        out.append(f"<h4>Not exercised ({len(gaps)})</h4><ul>")
        out += [f"<li>{e(gap)}</li>" for gap in gaps]
        out.append("</ul>")
    return out


def vllm_code_section(coverage: VllmCodeCoverage) -> list[str]:
    """Per file of vLLM's reservation code: lines and branches executed, each file linked to
    its source with the unexecuted lines marked (coverage.py's HTML); per function, the
    branches no scenario took."""
    out = [
        f'<h2 id="vllm-code">vLLM {e(coverage.vllm_version or "")} reservation code executed '
        "by the scenarios</h2>",
        f'<p class="note">coverage.py, branch mode, measured in {e(", ".join(coverage.processes))}'
        + (
            f'; <a href="{e(coverage.html_index)}">every file\'s source, unexecuted lines '
            "marked</a>"
            if coverage.html_index
            else ""
        )
        + ". A branch <code>a-&gt;b</code> jumps from line a to line b; <code>exit</code> "
        "leaves the function.</p>",
        '<table class="matrix"><thead><tr><th class="l">file</th><th>lines</th><th>lines %</th>'
        "<th>branches</th><th>branches %</th></tr></thead><tbody>",
    ]
    for unit in [*coverage.files]:
        c = unit.counts
        name = e(unit.path) + ("" if unit.whole else " (lookahead only)")
        link = f'<a href="{e(unit.html)}">{name}</a>' if unit.html else name
        out.append(
            f'<tr><td class="l"><code>{link}</code></td><td>{c.executed_lines}/{c.statements}'
            f"</td><td>{c.line_percent:.1f}</td><td>{c.executed_branches}/{c.branches}</td>"
            f"<td>{c.branch_percent:.1f}</td></tr>"
        )
    t = coverage.total
    out.append(
        f'<tr><td class="l"><b>total</b></td><td>{t.executed_lines}/{t.statements}</td>'
        f"<td>{t.line_percent:.1f}</td><td>{t.executed_branches}/{t.branches}</td>"
        f"<td>{t.branch_percent:.1f}</td></tr></tbody></table>"
    )
    for unit in coverage.files:
        missed = [f for f in unit.functions if f.missed_branches or f.missing_lines]
        if not missed:
            continue
        out.append(
            f"<details><summary><code>{e(unit.path)}</code>: {len(unit.missed_branches)} "
            "branches never taken</summary>"
            '<table class="matrix"><thead><tr><th class="l">function</th><th>lines</th>'
            '<th>branches</th><th class="l">never taken</th></tr></thead><tbody>'
        )
        for f in missed:
            c = f.counts
            branches = "<br>".join(e(m.describe()) for m in f.missed_branches)
            out.append(
                f'<tr><td class="l"><code>{e(f.name)}</code></td>'
                f"<td>{c.executed_lines}/{c.statements}</td>"
                f"<td>{c.executed_branches}/{c.branches}</td>"
                f'<td class="l mono">{branches}</td></tr>'
            )
        out.append("</tbody></table></details>")
    return out


def _offered_table(label: str, items: Iterable[OfferedItem], with_type: bool) -> list[str]:
    out = [
        f'<table class="matrix"><thead><tr><th class="l">{e(label)}</th>'
        + ('<th class="l">group type</th>' if with_type else "")
        + '<th class="l">status</th><th class="l">note</th></tr></thead><tbody>'
    ]
    for item in sorted(items, key=status_rank):
        status = item.status
        out.append(
            f'<tr><td class="l"><code>{e(item.name)}</code></td>'
            + (f'<td class="l">{e(item.group_type or "-")}</td>' if with_type else "")
            + f'<td class="l"><span class="status {e(status.replace(" ", "-"))}">{e(status)}</span>'
            f'</td><td class="l note">{e(item.note)}</td></tr>'
        )
    out.append("</tbody></table>")
    return out
