"""``report.html``: one scenario's plots and its step-by-step table."""

from __future__ import annotations

import re

from kvconform.model.observations import FreeEvent, Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import ScenarioResult
from kvconform.reports import plots
from kvconform.reports.html_base import e


def row_id(request: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", request)


def scenario_plots(result: ScenarioResult, only: set[int] | None = None) -> list[str]:
    out = ["<h4>Blocks held, step by step</h4>"]
    for plot in plots.group_plots(result, only):
        hidden = (
            f" Requests not shown: {e(', '.join(plot.requests_hidden))}."
            if plot.requests_hidden
            else ""
        )
        out.append(
            f'<figure><img class="plot" alt="{e("blocks held per step, " + plot.title)}" '
            f'src="data:image/png;base64,{plot.png_base64}">'
            f"<figcaption><b>{e(plot.title)}</b>: blocks held at each step by each party, one "
            "panel per request. Dashed black: the floor, the fewest blocks the group must hold; "
            "red shading: a party holding fewer; red rings: the values a failed check is about."
            f"{hidden}</figcaption></figure>"
        )
    return out


def _cell(obs: Observation, attr: str, reference: int | None) -> str:
    value = getattr(obs, attr)
    if value is None:
        return '<td class="na">-</td>'
    classes, why = [], []
    if value < obs.floor:
        classes.append("below")
        why.append(f"below the floor of {obs.floor}")
    elif reference is not None and value != reference:
        classes.append("disagree")
        why.append(f"differs from the predictor's running maximum {reference}")
    text = str(value)
    if attr == Party.PREDICTED and obs.predicted_max is not None and obs.predicted_max != value:
        text += f" <span class='note'>(max {obs.predicted_max})</span>"
    title = f' title="{e("; ".join(why))}"' if why else ""
    css = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{css}{title}>{text}</td>"


def steps_table(result: ScenarioResult, trajectory: Trajectory, slug: str) -> list[str]:
    parties = [p for p in (Party.LIVE, Party.PREDICTED, Party.WARMUP) if p in trajectory.parties]
    if Party.WARMUP not in parties and any(o.warmup is not None for o in trajectory.observations):
        parties.append(Party.WARMUP)
    failing = {(f.step, f.request) for f in result.failures if f.step is not None}
    groups = trajectory.groups
    out = [
        "<h4>Step by step</h4>",
        '<p class="legend note"><span class="mono" style="background:var(--fail-bg);'
        'color:var(--fail)">n</span>below the floor '
        '<span class="mono" style="background:var(--warn-bg);color:var(--warn)">n</span>'
        "differs from the predictor (running maximum after rejected drafts) "
        "&nbsp; a red edge marks a row with a failed check. computed: tokens computed before "
        "the step; scheduled: tokens scheduled in it.</p>",
        '<div class="tablewrap"><table class="steps"><thead><tr>',
        '<th rowspan="2">step</th><th rowspan="2">line</th><th rowspan="2" class="l">request</th>'
        '<th rowspan="2" class="l">action</th><th rowspan="2">computed</th>'
        '<th rowspan="2">scheduled</th>',
    ]
    for g in groups:
        reason = g.floor_rule.reason
        out.append(
            f'<th colspan="{1 + len(parties)}" class="sep" title="{e(reason)}">'
            f"g{g.index} {e(g.label)}</th>"
        )
    out.append("</tr><tr>")
    for _ in groups:
        out.append('<th class="sep">floor</th>')
        out += [f"<th>{e(p)}</th>" for p in parties]
    out.append("</tr></thead><tbody>")
    rows: dict[tuple[int, str], list[Observation]] = {}
    order: list[FreeEvent | tuple[int, str]] = []
    events = list(trajectory.events)
    next_event = 0
    for seq, obs in enumerate(trajectory.observations):
        while next_event < len(events) and events[next_event].seq <= seq:
            order.append(events[next_event])
            next_event += 1
        key = (obs.step, obs.request)
        if key not in rows:
            rows[key] = []
            order.append(key)
        rows[key].append(obs)
    order += events[next_event:]
    width = 6 + len(groups) * (1 + len(parties))
    for item in order:
        if isinstance(item, FreeEvent):
            freed = item.free_after - item.free_before
            out.append(
                f'<tr class="event"><td>{item.step}</td><td>{e(item.line or "")}</td>'
                f'<td class="l">{e(item.request)}</td>'
                f'<td class="l" colspan="{width - 3}">{e(item.kind)}: {freed} blocks went back '
                "to the pool</td></tr>"
            )
            continue
        step, request = item
        observations = sorted(rows[(step, request)], key=lambda o: o.group)
        first = observations[0]
        hit = " hit" if (step, request) in failing else ""
        out.append(
            f'<tr class="row{hit}" id="{slug}-r{step}-{row_id(request)}"><td>{step}</td>'
            f'<td>{e(first.line or "")}</td><td class="l">{e(request)}</td>'
            f'<td class="l">{e(first.label)}</td><td>{first.computed}</td>'
            f"<td>{first.scheduled}</td>"
        )
        for obs in observations:
            out.append(f'<td class="sep">{obs.floor}</td>')
            for party in parties:
                reference = obs.predicted_max if party != Party.PREDICTED else None
                out.append(_cell(obs, party, reference))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return out
