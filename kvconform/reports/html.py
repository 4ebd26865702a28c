"""``report.html``: the page a person opens when the nightly is red.

One self-contained file (inline CSS, plots as base64 PNG, one small inline
script, nothing fetched), written for a reader who did not write the scenarios:

* the overview: verdict, counts, which vLLM (version and where it came from),
  torch and device, how long the run took, the command; then a filter by
  verdict, check and group type (plain JavaScript in the page, no server);
* the root-cause groups, upstream causes first, then the largest (:mod:`kvconform.harness.root_causes`), one
  card each: the vLLM function and file its party stands for (linked into the
  tree that ran, at the ``def``), the shape of the miss, the group types and
  methods it spans, the floor rule's "why" once, a representative scenario in
  full (plots of the KV-cache groups the records are about, the step table, its
  rerun and ``explain`` commands) and every scenario of the group collapsed
  under it (``<details>``) with its messages, never cut;
* errored and xfailed scenarios in full (tables, no plots), xpassed ones with
  their expectations entry, the passing ones compactly, the coverage matrix;
* every scenario file the page names, embedded once, so that each
  ``file:line`` (and each "line N" in a message) is a link to the line.

Plots are drawn for the representatives only, so a run with hundreds of
failures stays a page of about a megabyte. Every piece of text from a scenario,
vLLM or the command line goes through :func:`html.escape`.
"""


from __future__ import annotations

import datetime
import re
from pathlib import Path

from kvconform import __version__
from kvconform.model.results import RunReport, ScenarioResult, Verdict
from kvconform.model.wording import count
from kvconform.reports.html_base import CSS, SCRIPT, e
from kvconform.reports.html_cards import Page
from kvconform.reports.html_coverage import coverage_section, vllm_code_section


def _slug(text: str, used: set[str]) -> str:
    base = "s-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "scenario")
    slug, n = base, 1
    while slug in used:
        n += 1
        slug = f"{base}-{n}"
    used.add(slug)
    return slug


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
    page = Page(report, slugs)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f'<header class="banner {banner}"><h1>{e(title)}</h1></header><main>',
    ]
    parts += _overview(report, counts)
    by_verdict = {v: [r for r in report.results if r.verdict is v] for v in Verdict}
    parts += _filter_bar(report)
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
    if report.root_causes:
        records = sum(g.records for g in report.root_causes)
        failed = len(by_verdict[Verdict.FAILED])
        parts.append(
            f'<h2 id="groups">Root causes: {records:,} failure records of {failed} failed '
            f"scenario{'s' if failed != 1 else ''} in {len(report.root_causes)} "
            f"group{'s' if len(report.root_causes) != 1 else ''}</h2>"
        )
        parts += page.group_index()
        parts.append(
            f'<details class="how"><summary>How to read this</summary>{HOW_TO_READ}'
            f"<p>{GROUPS_HOW}</p></details>"
        )
        for number, group in enumerate(report.root_causes, 1):
            parts += page.group_card(number, group)
    members = {s.id for g in report.root_causes for s in g.scenarios}
    ungrouped = [
        r for r in by_verdict[Verdict.FAILED] if id(r) not in page.shown and r.id not in members
    ]
    if ungrouped:  # failed without records: not expected, but never hidden
        parts.append('<h2 id="failed">Other failed scenarios</h2>')
        for result in ungrouped:
            parts += page.scenario_card(result, draw=False)
    if by_verdict[Verdict.ERROR]:
        parts.append(f'<h2 id="errors">Errored ({len(by_verdict[Verdict.ERROR])})</h2>')
        for result in by_verdict[Verdict.ERROR]:
            parts += page.scenario_card(result, draw=False)
    if by_verdict[Verdict.XFAILED]:
        parts.append(
            f'<h2 id="xfailed">Known divergences that still diverge '
            f"({len(by_verdict[Verdict.XFAILED])} xfailed)</h2>"
        )
        for result in by_verdict[Verdict.XFAILED]:
            parts += page.scenario_card(result, draw=False)
    if by_verdict[Verdict.XPASSED]:
        parts += _xpassed(by_verdict[Verdict.XPASSED], page)
    parts += _passed(by_verdict[Verdict.PASSED])
    parts += _skipped(by_verdict[Verdict.SKIPPED])
    parts += _unsupported(by_verdict[Verdict.UNSUPPORTED])
    if report.coverage is not None:
        parts += coverage_section(report.coverage, report.vllm_coverage is not None)
    if report.vllm_coverage is not None:
        parts += vllm_code_section(report.vllm_coverage)
    parts += page.scenario_files()
    parts.append(
        f"<footer>Written by kvconform {e(__version__)} on {e(now.isoformat(timespec='seconds'))}. "
        "Every number here is also in report.json beside this file.</footer>"
    )
    parts.append(f"</main><script>{SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"


def _overview(report: RunReport, counts: dict[str, int]) -> list[str]:
    chips = []
    for name, n in counts.items():
        css = name if name in {v.value for v in Verdict} else "error"
        # Verdicts are adjectives ("1 passed"); "error" and "input errors" are nouns.
        said = count(n, name.removesuffix("s")) if "error" in name else f"{n} {name}"
        chips.append(f'<span class="chip {e(css)}{" zero" if not n else ""}">{e(said)}</span>')
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


GROUPS_HOW = (
    "Failure records are gathered by the party that falls short or disagrees, the check, and "
    "the shape of the miss (computed from each record's numbers: the counts, the floor, the "
    "floor without the lookahead, the max_model_len cap, the DCP factor), so one bug in vLLM "
    "reads as a handful of groups. An <b>agree</b> record is blamed on the party below the "
    "floor or, where both hold at least the floor, on the one holding more. Each card names "
    "the vLLM code its party stands for, shows one representative scenario in full (plots and "
    "step table) and lists every scenario of the group underneath."
)


def _filter_bar(report: RunReport) -> list[str]:
    """Selects for verdict, check and group type; the page's script hides what they exclude."""
    if not report.results:
        return []
    verdicts = [v.value for v in Verdict if any(r.verdict is v for r in report.results)]
    checks = sorted({f.check for r in report.results for f in r.failures})
    types = sorted(
        {g.type for r in report.results if r.trajectory is not None for g in r.trajectory.groups}
    )

    def select(name: str, label: str, values: list[str]) -> str:
        options = "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in values)
        return (
            f'<label>{e(label)} <select id="filter-{name}" data-filter="{name}">'
            f'<option value="">all</option>{options}</select></label>'
        )

    return [
        '<div class="filter card" id="filter">',
        "<b>Show</b> ",
        select("verdict", "verdict", verdicts),
        select("check", "check", checks),
        select("types", "group type", types),
        '<span class="note" id="filter-count"></span>',
        "</div>",
    ]




def _xpassed(results: list[ScenarioResult], page: Page) -> list[str]:
    out = [
        f'<h2 id="xpassed">Known divergences that conform now ({len(results)} xpassed)</h2>',
        '<p class="note">These scenarios are listed in the expectations file as known '
        "divergences for this vLLM version, but every check passed. The entry is stale for this "
        "version: <code>kvconform run --update-expectations</code> narrows it (or drops it when "
        "it applied to this version only).</p>",
    ]
    for result in results:
        types = (
            " ".join(sorted({g.type for g in result.trajectory.groups}))
            if result.trajectory is not None
            else ""
        )
        out.append(
            f'<article class="card xpassed" id="{page.slugs[id(result)]}" data-verdict="xpassed" '
            f'data-check="" data-types="{e(types)}">'
        )
        out.append(
            f'<h3><span class="badge xpassed">xpassed</span><code>{e(result.id)}</code></h3>'
        )
        if result.description:
            out.append(f'<p class="desc">{e(result.description)}</p>')
        out.append('<dl class="facts">')
        out += [f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in page.setup_facts(result)]
        out.append("</dl>")
        out.append(f'<pre class="cmd">{e(page.report.rerun_command(result))}</pre></article>')
    return out


def _unsupported(results: list[ScenarioResult]) -> list[str]:
    if not results:
        return []
    out = [
        f'<h2 id="unsupported">Not offered by this vLLM ({len(results)} unsupported)</h2>',
        '<p class="note">These scenarios need a spec type, method, runner or scheduler option '
        "this release does not offer (or none of the selected checks can run on them). They do "
        "not count against it and leave the exit status alone.</p>",
        '<table class="matrix"><thead><tr><th class="l">scenario</th><th class="l">why</th>'
        "</tr></thead><tbody>",
    ]
    for r in results:
        out.append(
            f'<tr><td class="l"><code>{e(r.id)}</code></td>'
            f'<td class="l">{e(r.error or "")}</td></tr>'
        )
    out.append("</tbody></table>")
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
        types = " ".join(sorted({g.type for g in r.trajectory.groups})) if r.trajectory else ""
        out.append(
            f'<tr data-verdict="passed" data-check="" data-types="{e(types)}">'
            f'<td class="l"><code>{e(r.id)}</code></td><td class="l">{e(r.file)}</td>'
            f"<td>{steps}</td><td>{r.duration * 1000:.0f}</td></tr>"
        )
    out.append("</tbody></table></details>")
    return out


def _skipped(results: list[ScenarioResult]) -> list[str]:
    """Scenarios that could not run here (engine mode without CUDA), with why: never passed."""
    if not results:
        return []
    out = [
        f'<h2 id="skipped">Skipped ({len(results)})</h2>',
        "<details><summary>Not run on this machine (click to list them with the reason)</summary>",
        '<table class="matrix"><thead><tr><th class="l">scenario</th><th class="l">file</th>'
        '<th class="l">why</th></tr></thead><tbody>',
    ]
    for r in results:
        out.append(
            f'<tr data-verdict="skipped" data-check="" data-types=""><td class="l">'
            f'<code>{e(r.id)}</code></td><td class="l">{e(r.file)}</td>'
            f'<td class="l note">{e(r.skip_reason)}</td></tr>'
        )
    out.append("</tbody></table></details>")
    return out

def write_html(report: RunReport, directory: Path) -> Path:
    path = directory / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path
