"""``report.html``: the page a person opens when the nightly is red.

One self-contained file (inline CSS, plots as base64 PNG, no script, nothing
fetched), written for a reader who did not write the scenarios:

* the overview: verdict, counts, which vLLM (version and where it came from),
  torch and device, how long the run took, the command;
* per failed, xfailed or errored scenario: what it does, how it is set up
  (method, lookahead and where it came from, groups), the checks' messages,
  the command that reruns it alone, a plot per group of the blocks each party
  held against step with the floor, and the step-by-step table of live /
  predicted / warmup / floor per group, the offending cells marked;
* scenarios that were expected to diverge and now conform (xpassed), shown as
  such with their expectations entry, never folded into "passed";
* the passing scenarios, compactly;
* the coverage matrix: what the run exercised and what vLLM offers that no
  scenario covers.

Plots are drawn only for failed and xfailed scenarios (at most
:data:`MAX_PLOTTED` of them) so a run with hundreds of failures still writes its
page in seconds. Every piece of text from a scenario, vLLM or the command line
goes through :func:`html.escape`.
"""

from __future__ import annotations

import datetime
import html
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from kvconform import __version__
from kvconform.harness.expectations_update import is_unreviewed
from kvconform.model.coverage import KIND_LETTERS, Coverage, OfferedItem, status_rank
from kvconform.model.floors import FLOORS
from kvconform.model.observations import FreeEvent, Observation, Trajectory
from kvconform.model.results import RunReport, ScenarioResult, Verdict
from kvconform.reports import plots

MAX_PLOTTED = 25
MAX_MESSAGES = 25
PROBLEM_ORDER = (Verdict.FAILED, Verdict.ERROR, Verdict.XFAILED)


def e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _slug(text: str, used: set[str]) -> str:
    base = "s-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "scenario")
    slug, n = base, 1
    while slug in used:
        n += 1
        slug = f"{base}-{n}"
    used.add(slug)
    return slug


CSS = """
:root { --fail:#c62828; --fail-bg:#fde8e7; --warn:#a15c00; --warn-bg:#fff1d6; --ok:#2e7d32;
  --ok-bg:#e6f4ea; --muted:#666; --line:#ddd; --xpass:#6a1b9a; --xpass-bg:#f3e5f5; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1b1b1b;
  margin: 0; background:#fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 0 20px 40px; }
header.banner { padding: 18px 20px; color: white; }
header.banner h1 { margin: 0; font-size: 22px; max-width: 1200px; margin: 0 auto; }
header.banner.ok { background: var(--ok); } header.banner.bad { background: var(--fail); }
header.banner.error { background: #5d4037; }
h2 { margin-top: 32px; border-bottom: 2px solid var(--line); padding-bottom: 4px; }
h3 { margin: 0 0 6px; font-size: 17px; }
h4 { margin: 14px 0 6px; font-size: 14px; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
  font-size: 12.5px; }
pre.cmd { background: #1e1e1e; color: #f0f0f0; padding: 8px 10px; border-radius: 4px;
  overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
.chips { display: flex; flex-wrap: wrap; gap: 8px; margin: 12px 0; }
.chip { border-radius: 14px; padding: 3px 12px; background: #eee; font-weight: 600; }
.chip.failed, .badge.failed { background: var(--fail-bg); color: var(--fail); }
.chip.error, .badge.error { background: #efebe9; color: #5d4037; }
.chip.xfailed, .badge.xfailed { background: var(--warn-bg); color: var(--warn); }
.chip.xpassed, .badge.xpassed { background: var(--xpass-bg); color: var(--xpass); }
.chip.passed, .badge.passed { background: var(--ok-bg); color: var(--ok); }
.chip.zero { opacity: .45; }
.badge { border-radius: 3px; padding: 1px 6px; font-size: 12px; font-weight: 700;
  text-transform: uppercase; margin-right: 6px; vertical-align: 2px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 8px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; word-break: break-word; }
.card { background: white; border: 1px solid var(--line); border-radius: 6px; padding: 14px 16px;
  margin: 14px 0; }
.card.failed { border-left: 5px solid var(--fail); } .card.error { border-left: 5px solid #5d4037; }
.card.xfailed { border-left: 5px solid var(--warn); } .card.xpassed { border-left: 5px solid var(--xpass); }
.how { color: #333; background: #f2f6fb; border: 1px solid #d6e2f0; border-radius: 6px;
  padding: 10px 14px; }
.desc { margin: 2px 0 8px; color: #333; }
ul.failures { padding-left: 18px; margin: 4px 0; } ul.failures li { margin: 3px 0; }
.why { color: var(--muted); font-size: 12px; }
.check { font-weight: 700; font-family: ui-monospace, Menlo, monospace; }
.note { color: var(--muted); font-size: 13px; }
.todo { background: var(--warn-bg); color: var(--warn); padding: 0 4px; border-radius: 3px;
  font-weight: 600; }
figure { margin: 8px 0 14px; } figure img { max-width: 100%; height: auto; display: block;
  border: 1px solid var(--line); background: white; }
figcaption { font-size: 12.5px; color: var(--muted); }
.tablewrap { max-height: 560px; overflow: auto; border: 1px solid var(--line); }
table { border-collapse: collapse; background: white; }
table.steps { font-size: 12.5px; width: 100%; }
table th, table td { border: 1px solid #e3e3e3; padding: 2px 6px; text-align: right; }
table th { background: #f3f3f3; position: sticky; top: 0; z-index: 1; }
table thead tr:nth-child(2) th { top: 22px; }
table td.l, table th.l { text-align: left; }
table th[colspan] { text-align: center; }
pre.mono { white-space: pre-wrap; word-break: break-word; }
td.sep, th.sep { border-left: 2px solid #999; }
td.below { background: var(--fail-bg); color: var(--fail); font-weight: 700; }
td.disagree { background: var(--warn-bg); color: var(--warn); font-weight: 700; }
tr.hit td:first-child { box-shadow: inset 4px 0 0 var(--fail); }
table.steps td.l { white-space: nowrap; }
tr.event td { color: var(--muted); font-style: italic; background: #fbfbfb; }
td.na { color: #bbb; }
.legend span { display: inline-block; padding: 0 6px; margin-right: 8px; border-radius: 3px; }
table.matrix { margin-bottom: 12px; }
table.matrix td, table.matrix th { text-align: center; }
table.matrix td.l, table.matrix th.l { text-align: left; }
td.hit0 { color: #bbb; } td.hitn { background: var(--ok-bg); }
td.attempt { background: #efebe9; color: #5d4037; }
.status { font-weight: 600; font-size: 12px; border-radius: 3px; padding: 0 5px; }
.status.covered { background: var(--ok-bg); color: var(--ok); }
.status.uncovered, .status.new { background: var(--fail-bg); color: var(--fail); }
.status.attempted { background: #efebe9; color: #5d4037; }
.status.not-built { background: #eee; color: var(--muted); }
details > summary { cursor: pointer; font-weight: 600; margin: 6px 0; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""

HOW_TO_READ = (
    "Each scenario drives a few requests through prefill, plain decode and speculative-decode "
    "steps. At every step and for every KV-cache group, kvconform records how many blocks each "
    "party holds: <b>live</b>, vLLM's own <code>KVCacheManager</code> driven as the scheduler "
    "drives it; <b>predicted</b>, the warmup's <code>_reserved_block_count</code> for the same "
    "token count; and, in warmup scenarios, the <b>warmup</b> as recorded. The <b>floor</b> is "
    "the fewest blocks the group must hold so that every position the target model and the "
    "drafter write (computed + scheduled + lookahead) has a block. "
    "<b>floor</b> fails when a party holds fewer; <b>agree</b> fails when live and predicted "
    "differ (after rejected drafts, live is compared with the predictor's running maximum, "
    "because blocks are not given back); <b>lookahead</b> compares vLLM's "
    "<code>num_lookahead_tokens</code> with kvconform's table; <b>sanity</b> checks allocator "
    "invariants."
)


def render_html(report: RunReport, now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now()
    used: set[str] = set()
    slugs = {id(r): _slug(r.id, used) for r in report.results}
    counts = report.counts()
    status = report.exit_status
    verdict_text, banner = (
        ("conform", "ok")
        if status == 0
        else ("NOT conform", "bad")
        if status == 1
        else ("could not run everything", "error")
    )
    vllm = report.vllm_version or "unavailable"
    title = f"kvconform: {verdict_text} (exit {status}) - vLLM {vllm}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f'<header class="banner {banner}"><h1>{e(title)}</h1></header><main>',
    ]
    parts += _overview(report, counts)
    problems = [r for v in PROBLEM_ORDER for r in report.results if r.verdict is v]
    xpassed = [r for r in report.results if r.verdict is Verdict.XPASSED]
    passed = [r for r in report.results if r.verdict is Verdict.PASSED]
    parts += _contents(problems, xpassed, slugs)
    if report.vllm_error:
        parts.append('<h2 id="vllm-error">vLLM could not be exercised</h2>')
        parts.append(
            f'<div class="card error"><pre class="mono">{e(report.vllm_error)}</pre></div>'
        )
    if report.input_errors:
        parts.append(f'<h2 id="input-errors">Input errors ({len(report.input_errors)})</h2>')
        parts.append('<div class="card error"><ul class="failures">')
        parts += [f'<li class="mono">{e(err)}</li>' for err in report.input_errors]
        parts.append("</ul></div>")
    if problems:
        parts.append(
            '<h2 id="problems">Scenarios that failed, errored or are known to diverge</h2>'
        )
        parts.append(f'<div class="how">{HOW_TO_READ}</div>')
        missing = plots.missing_reason()
        plotted = 0
        for result in problems:
            want_plot = result.verdict in (Verdict.FAILED, Verdict.XFAILED)
            draw = want_plot and missing is None and plotted < MAX_PLOTTED
            plotted += draw and result.trajectory is not None
            note = None
            if want_plot and not draw and result.trajectory is not None:
                note = missing or f"plots are drawn for the first {MAX_PLOTTED} scenarios only"
            parts += _scenario(result, report, slugs[id(result)], draw, note)
    if xpassed:
        parts += _xpassed(xpassed, report, slugs)
    parts += _passed(passed)
    if report.coverage is not None:
        parts += _coverage(report.coverage)
    parts.append(
        f"<footer>Written by kvconform {e(__version__)} on {e(now.isoformat(timespec='seconds'))}. "
        "Every number here is also in report.json beside this file.</footer>"
    )
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def _overview(report: RunReport, counts: dict[str, int]) -> list[str]:
    chips = []
    for name, count in counts.items():
        css = name if name in {v.value for v in Verdict} else "error"
        chips.append(
            f'<span class="chip {e(css)}{" zero" if not count else ""}">{count} {e(name)}</span>'
        )
    source = report.vllm_source or "-"
    where = f" ({e(report.vllm_path)})" if report.vllm_path else ""
    if report.vllm_release:
        source = f"PyPI release {report.vllm_release}"
    started = (
        datetime.datetime.fromtimestamp(report.started).isoformat(timespec="seconds")
        if report.started
        else "-"
    )
    facts = [
        ("vLLM", f"<b>{e(report.vllm_version or 'unavailable')}</b>, {e(source)}{where}"),
        ("torch / device", f"{e(report.torch_version or '-')} / {e(report.device or '-')}"),
        ("started", e(started)),
        ("duration", f"{report.duration:.1f} s"),
        ("command", f"<code>{e(report.command or '-')}</code>"),
        ("checks", e(", ".join(report.checks) or "-")),
        ("exit status", e(report.exit_status)),
    ]
    if report.expectations_file:
        facts.append(("expectations", f"<code>{e(report.expectations_file)}</code>"))
    out = ['<section id="overview"><h2>Overview</h2>', '<div class="chips">', *chips, "</div>"]
    out.append('<dl class="facts">')
    out += [f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in facts]
    out.append("</dl>")
    out += [f'<p class="note">{e(note)}</p>' for note in report.notes]
    out.append("</section>")
    return out


def _contents(
    problems: list[ScenarioResult], xpassed: list[ScenarioResult], slugs: dict[int, str]
) -> list[str]:
    if not problems and not xpassed:
        return []
    out = ['<nav class="card" id="contents"><h3>Needs a look</h3><ul class="failures">']
    for result in [*problems, *xpassed]:
        headline = result.headline() if result.verdict is not Verdict.XPASSED else ""
        if result.verdict is Verdict.XPASSED:
            headline = "conforms now, but the expectations file still lists it"
        short = headline if len(headline) <= 180 else headline[:177] + "..."
        out.append(
            f'<li><span class="badge {result.verdict.value}">{result.verdict.value}</span>'
            f'<a href="#{slugs[id(result)]}"><code>{e(result.id)}</code></a> '
            f'<span class="note">{e(short)}</span></li>'
        )
    out.append("</ul></nav>")
    return out


def _setup_facts(result: ScenarioResult, report: RunReport) -> list[tuple[str, str]]:
    location = f"{result.file}:{result.line}" if result.line else result.file
    facts = [("file", f"<code>{e(location)}</code>")]
    run = result.trajectory
    if run is not None:
        method = (
            f"{e(run.method)}, k = {run.num_speculative_tokens}"
            if run.method
            else "no speculative decoding"
        )
        facts.append(("speculation", method))
        expected = (
            ""
            if run.expected_lookahead in (None, run.lookahead)
            else f"; kvconform's table says {e(run.expected_lookahead)}"
        )
        facts.append(
            ("lookahead", f"{run.lookahead} tokens, from {e(run.lookahead_source)}{expected}")
        )
        groups = "<br>".join(
            f"<b>g{g.index}</b> {e(g.label)}, block_size {g.block_size}" for g in run.groups
        )
        facts.append(("KV-cache groups", groups))
        facts.append(("max_model_len", e(run.max_model_len)))
        facts.append(("parties", e(", ".join(run.parties))))
        for note in run.notes:
            facts.append(("note", e(note)))
    if result.expectation:
        reason = e(result.expectation)
        if is_unreviewed(result.expectation):
            reason = f'<span class="todo">{reason}</span> (added automatically, not reviewed)'
        facts.append(("known divergence", reason))
        if result.expectation_evidence:
            facts.append(("evidence", _link_or_text(result.expectation_evidence)))
    facts.append(("duration", f"{result.duration * 1000:.0f} ms"))
    return facts


def _link_or_text(text: str) -> str:
    if re.match(r"^https?://\S+$", text.strip()):
        return f'<a href="{e(text.strip())}">{e(text.strip())}</a>'
    return e(text)


def _scenario(
    result: ScenarioResult, report: RunReport, slug: str, draw: bool, plot_note: str | None
) -> list[str]:
    verdict = result.verdict.value
    out = [
        f'<article class="card {verdict}" id="{slug}">',
        f'<h3><span class="badge {verdict}">{verdict}</span><code>{e(result.id)}</code></h3>',
    ]
    if result.description:
        out.append(f'<p class="desc">{e(result.description)}</p>')
    out.append('<dl class="facts">')
    out += [f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in _setup_facts(result, report)]
    out.append("</dl>")
    out.append("<h4>Rerun this scenario alone</h4>")
    out.append(f'<pre class="cmd">{e(report.rerun_command(result))}</pre>')
    if result.error:
        kind = result.error_kind.value if result.error_kind else "error"
        out.append(f"<h4>Error ({e(kind)})</h4>")
        out.append(f'<pre class="mono">{e(result.error)}</pre>')
    if result.failures:
        out += _failures(result, slug)
    run = result.trajectory
    if run is not None and run.observations and result.verdict is not Verdict.PASSED:
        if draw:
            out += _plots(result)
        elif plot_note:
            out.append(f'<p class="note">No plots: {e(plot_note)}.</p>')
        out += _steps_table(result, run, slug)
    out.append("</article>")
    return out


def _failures(result: ScenarioResult, slug: str) -> list[str]:
    by_check = Counter(f.check for f in result.failures)
    summary = ", ".join(f"{n} x {e(check)}" for check, n in by_check.items())
    out = [f"<h4>What failed ({summary})</h4>", '<ul class="failures">']
    for failure in result.failures[:MAX_MESSAGES]:
        link = ""
        if failure.step is not None and failure.request is not None:
            link = f' <a href="#{slug}-r{failure.step}-{_rid(failure.request)}">row</a>'
        out.append(
            f'<li><span class="check">{e(failure.check)}</span> {_message(failure.message)}{link}</li>'
        )
    if len(result.failures) > MAX_MESSAGES:
        out.append(
            f"<li>... and {len(result.failures) - MAX_MESSAGES} more: all are marked in the "
            "table below and listed in report.json</li>"
        )
    out.append("</ul>")
    return out


def _message(message: str) -> str:
    """A check's message, its trailing "(why: ...)" set in small print: it is the floor
    rule's reason, the same for every step of a group."""
    match = re.match(r"(?s)(.*) \(why: (.*)\)$", message)
    if match is None:
        return e(message)
    return f'{e(match.group(1))} <span class="why">(why: {e(match.group(2))})</span>'


def _rid(request: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", request)


def _plots(result: ScenarioResult) -> list[str]:
    out = ["<h4>Blocks held, step by step</h4>"]
    for plot in plots.group_plots(result):
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
    if attr == "predicted" and obs.predicted_max is not None and obs.predicted_max != value:
        text += f" <span class='note'>(max {obs.predicted_max})</span>"
    title = f' title="{e("; ".join(why))}"' if why else ""
    css = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{css}{title}>{text}</td>"


def _steps_table(result: ScenarioResult, run: Trajectory, slug: str) -> list[str]:
    parties = [p for p in ("live", "predicted", "warmup") if p in run.parties]
    if "warmup" not in parties and any(o.warmup is not None for o in run.observations):
        parties.append("warmup")
    failing = {(f.step, f.request) for f in result.failures if f.step is not None}
    groups = run.groups
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
        reason = FLOORS[g.type].reason if g.type in FLOORS else ""
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
    events = list(run.events)
    next_event = 0
    for seq, obs in enumerate(run.observations):
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
            f'<tr class="row{hit}" id="{slug}-r{step}-{_rid(request)}"><td>{step}</td>'
            f'<td>{e(first.line or "")}</td><td class="l">{e(request)}</td>'
            f'<td class="l">{e(first.label)}</td><td>{first.computed}</td>'
            f"<td>{first.scheduled}</td>"
        )
        for obs in observations:
            out.append(f'<td class="sep">{obs.floor}</td>')
            for party in parties:
                reference = obs.predicted_max if party != "predicted" else None
                out.append(_cell(obs, party, reference))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return out


def _xpassed(results: list[ScenarioResult], report: RunReport, slugs: dict[int, str]) -> list[str]:
    out = [
        f'<h2 id="xpassed">Known divergences that conform now ({len(results)} xpassed)</h2>',
        '<p class="note">These scenarios are listed in the expectations file as known '
        "divergences for this vLLM version, but every check passed. The entry is stale for this "
        "version: <code>kvconform run --update-expectations</code> narrows it (or drops it when "
        "it applied to this version only).</p>",
    ]
    for result in results:
        out.append(f'<article class="card xpassed" id="{slugs[id(result)]}">')
        out.append(
            f'<h3><span class="badge xpassed">xpassed</span><code>{e(result.id)}</code></h3>'
        )
        if result.description:
            out.append(f'<p class="desc">{e(result.description)}</p>')
        out.append('<dl class="facts">')
        out += [f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in _setup_facts(result, report)]
        out.append("</dl>")
        out.append(f'<pre class="cmd">{e(report.rerun_command(result))}</pre></article>')
    return out


def _passed(results: list[ScenarioResult]) -> list[str]:
    if not results:
        return []
    out = [
        f'<h2 id="passed">Passed ({len(results)})</h2>',
        "<details><summary>Every check held for these scenarios (click to list them)</summary>",
        '<table class="matrix"><thead><tr><th class="l">scenario</th><th class="l">file</th>'
        "<th>steps</th><th>ms</th></tr></thead><tbody>",
    ]
    for r in results:
        steps = len({o.step for o in r.trajectory.observations}) if r.trajectory else 0
        out.append(
            f'<tr><td class="l"><code>{e(r.id)}</code></td><td class="l">{e(r.file)}</td>'
            f"<td>{steps}</td><td>{r.duration * 1000:.0f}</td></tr>"
        )
    out.append("</tbody></table></details>")
    return out


def _coverage(coverage: Coverage) -> list[str]:
    types, methods, kinds = coverage.group_types(), coverage.methods(), coverage.step_kinds()
    out = [
        '<h2 id="coverage">Coverage</h2>',
        f'<p class="note">{coverage.exercised} of {coverage.scenarios} scenarios were exercised '
        "(the others errored before their checks ran; their group types and methods count as "
        "attempted only). Computed from this run's scenarios and results.</p>",
    ]
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


def write_html(report: RunReport, directory: Path) -> Path:
    path = directory / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path
