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

import ast
import datetime
import html
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from kvconform import __version__
from kvconform.harness.expectations_update import is_unreviewed
from kvconform.model.coverage import KIND_LETTERS, Coverage, OfferedItem, status_rank
from kvconform.model.observations import FreeEvent, Observation, Trajectory
from kvconform.model.results import Failure, RunReport, ScenarioResult, Verdict
from kvconform.model.root_causes import RootCause, RootCauseScenario
from kvconform.model.vllm_code import VllmCodeCoverage
from kvconform.model.wording import count
from kvconform.reports import plots
from kvconform.reports.root_causes import never_below_floor_text

MAX_MESSAGES = 25


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
.chip.unsupported, .badge.unsupported { background: #eceff1; color: #455a64; }
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
.filter { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; position: sticky;
  top: 0; z-index: 5; padding: 8px 16px; }
.card.group { border-left: 5px solid var(--fail); }
.card.group > .card { margin-left: 8px; }
p.cause { font-size: 15px; margin: 4px 0 8px; }
ol.causes li { margin: 4px 0; }
details.members { margin-top: 10px; } details.member { margin: 2px 0 2px 14px; }
details.member > summary { font-weight: 400; }
details.how summary { font-weight: 600; }
pre.yaml { background: #f7f7f7; border: 1px solid var(--line); padding: 8px 10px;
  overflow-x: auto; }
pre.yaml span:target { background: #fff59d; }
[hidden] { display: none !important; }
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
    page = _Page(report, slugs)
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
        parts += _coverage(report.coverage, report.vllm_coverage is not None)
    if report.vllm_coverage is not None:
        parts += _vllm_code(report.vllm_coverage)
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


def _link_or_text(text: str) -> str:
    if re.match(r"^https?://\S+$", text.strip()):
        return f'<a href="{e(text.strip())}">{e(text.strip())}</a>'
    return e(text)


GROUPS_HOW = (
    "Failure records are gathered by the party that falls short or disagrees, the check, and "
    "the shape of the miss (computed from each record's numbers: the counts, the floor, the "
    "floor without the lookahead, the max_model_len cap, the DCP factor), so one bug in vLLM "
    "reads as a handful of groups. An <b>agree</b> record is blamed on the party below the "
    "floor or, where both hold at least the floor, on the one holding more. Each card names "
    "the vLLM code its party stands for, shows one representative scenario in full (plots and "
    "step table) and lists every scenario of the group underneath."
)
# Per scenario of a group, the messages shown under it; the representative shows more.
MESSAGES_PER_SCENARIO = 2


def _why_stripped(message: str) -> str:
    """A check's message without its trailing "(why: ...)": the card says it once."""
    match = re.match(r"(?s)(.*) \(why: .*\)$", message)
    return match.group(1) if match else message


def _file_slug(path: str) -> str:
    return "y-" + re.sub(r"[^A-Za-z0-9_-]+", "-", path).strip("-")


# What a manager class of vLLM's single_type_kv_cache_manager.py counts and allocates its
# blocks with: where a group of records names the class, the page links these.
_COUNTING = (("counted", "get_num_blocks_to_allocate"), ("allocated", "allocate_new_blocks"))


class _Page:
    """What the page's parts share: the report, slugs, which scenarios are drawn, files."""

    def __init__(self, report: RunReport, slugs: dict[int, str]) -> None:
        self.report = report
        self.slugs = slugs
        self.shown: set[int] = set()  # results drawn in full (representatives and others)
        self.files: dict[str, str] = {}  # scenario file -> its anchor, for the YAML section
        self.by_id = {r.id: r for r in report.results}
        root = (report.vllm_path or "").removesuffix("/vllm")
        self.vllm_root = Path(root) if root else None
        self._parsed: dict[str, dict[str, tuple[list[str], dict[str, int]]]] = {}

    # -- links ------------------------------------------------------------------------

    def file_link(self, file: str, line: int | None) -> str:
        """``file:line`` as a link to the line in the scenario file embedded below."""
        anchor = self.files.setdefault(file, _file_slug(file))
        target = f"{anchor}-L{line}" if line else anchor
        text = f"{file}:{line}" if line else file
        return f'<a class="yaml-link" href="#{target}"><code>{e(text)}</code></a>'

    def message(self, text: str, file: str) -> str:
        """A message escaped, its "line N" linked to the scenario file's line."""
        anchor = self.files.setdefault(file, _file_slug(file))
        return re.sub(
            r"\bline (\d+)\b",
            lambda m: f'<a class="yaml-link" href="#{anchor}-L{m.group(1)}">line {m.group(1)}</a>',
            self.vllm_locations(e(text)),
        )

    def vllm_locations(self, escaped: str) -> str:
        """``vllm/...py:N`` in escaped text as links into the vLLM tree that ran."""
        root = self.vllm_root
        if root is None:
            return escaped
        return re.sub(
            r"\b(vllm/[\w/]+\.py)(?::(\d+))?",
            lambda m: f'<a href="{e((root / m.group(1)).as_uri())}">{m.group(0)}</a>',
            escaped,
        )

    def vllm_code(self, function: str, file: str) -> str:
        """The party's function(s) and file, linked to the file with the def's line. A
        manager class is linked to the methods that count and allocate its blocks (its
        own or those it inherits), not to its ``class`` line."""
        lines = []
        for name in function.split(" / "):
            counting = self._counting_methods(file, name) if "." not in name else []
            if counting:
                said = [
                    f"{verb} by <code>{e(method)}</code> ({self._where(file, line)})"
                    for verb, method, line in counting
                ]
                lines.append(f"<code>{e(name)}</code>, its blocks {' and '.join(said)}")
                continue
            line = self._def_line(file, name.rsplit(".", 1)[-1])
            lines.append(f"<code>{e(name)}</code> ({self._where(file, line)})")
        return " / ".join(lines)

    def _where(self, file: str, line: int | None) -> str:
        where = f"{file}:{line}" if line else file
        if self.vllm_root is not None and (self.vllm_root / file).is_file():
            return f'<a href="{e((self.vllm_root / file).as_uri())}">{e(where)}</a>'
        return e(where)

    def _counting_methods(self, file: str, name: str) -> list[tuple[str, str, int]]:
        """For a class of ``file``: (verb, Class.method, line) of the methods that count and
        allocate its blocks, found along its bases within the file; empty for a function."""
        classes = self._classes(file)
        if name not in classes:
            return []
        found = []
        for verb, method in _COUNTING:
            todo, seen = [name], set()
            while todo:
                current = todo.pop(0)
                if current in seen or current not in classes:
                    continue
                seen.add(current)
                bases, methods = classes[current]
                if method in methods:
                    found.append((verb, f"{current}.{method}", methods[method]))
                    break
                todo.extend(bases)
        return found

    def _classes(self, file: str) -> dict[str, tuple[list[str], dict[str, int]]]:
        """The classes of a vLLM file: their base names and methods' lines (once per file)."""
        cached = self._parsed.get(file)
        if cached is not None:
            return cached
        classes: dict[str, tuple[list[str], dict[str, int]]] = {}
        tree = None
        if self.vllm_root is not None:
            try:
                tree = ast.parse((self.vllm_root / file).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                tree = None
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                methods = {
                    f.name: f.lineno
                    for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                classes[node.name] = (bases, methods)
        self._parsed[file] = classes
        return classes

    def _def_line(self, file: str, name: str) -> int | None:
        if self.vllm_root is None:
            return None
        try:
            text = (self.vllm_root / file).read_text(encoding="utf-8")
        except OSError:
            return None
        match = re.search(rf"^[ \t]*(?:def|class) {re.escape(name)}\b", text, re.M)
        return text.count("\n", 0, match.start()) + 1 if match else None

    # -- groups -----------------------------------------------------------------------

    def group_index(self) -> list[str]:
        """The groups in one line each, in rank: the first screen of the page."""
        out = ['<ol class="causes">']
        for number, group in enumerate(self.report.root_causes, 1):
            rep = group.representative
            out.append(
                f'<li data-verdict="failed" data-check="{e(" ".join(group.check_names))}" '
                f'data-types="{e(" ".join(group.group_types))}"><a href="#g-{number}">'
                f"<b>{count(group.records, 'record')}, "
                f"{count(len(group.scenarios), 'scenario')}</b></a>: "
                f"{e(group.vllm.description)} <code>{e(group.vllm_function)}</code> "
                f"{e(group.miss)} <span class='check'>[{e(', '.join(group.check_names))}]</span>; e.g. "
                f"<code>{e(rep.id)}</code>: <code>"
                f"{e(self.report.explain_command(rep.file, rep.id))}</code></li>"
            )
        out.append("</ol>")
        fine = never_below_floor_text(self.report)
        if fine:
            out.append(f'<p class="note">{e(fine[0].upper() + fine[1:])}.</p>')
        return out

    def group_card(self, number: int, group: RootCause) -> list[str]:
        report, party = self.report, group.vllm
        rep = group.representative
        out = [
            f'<section class="card group" id="g-{number}" data-verdict="failed" '
            f'data-check="{e(" ".join(group.check_names))}" '
            f'data-types="{e(" ".join(group.group_types))}">',
            f'<h3><span class="badge failed">#{number}</span>{count(group.records, "record")} '
            f"in {count(len(group.scenarios), 'scenario')} "
            f'<span class="check">{e(", ".join(group.check_names))}</span></h3>',
            f'<p class="cause"><b>{e(party.description)}</b> '
            f"{self.vllm_code(group.vllm_function, group.vllm_file)} <b>{e(group.miss)}</b></p>",
            '<dl class="facts">',
            f"<dt>group types</dt><dd>{e(', '.join(group.group_types) or '-')}</dd>",
            f"<dt>methods</dt><dd>{e(', '.join(group.methods) or '-')}</dd>",
        ]
        if group.managers:
            out.append(
                "<dt>vLLM dispatched to</dt><dd>"
                + ", ".join(self.vllm_code(name, file) for name, file in group.managers)
                + "</dd>"
            )
        if len(group.checks) > 1:
            out.append(
                "<dt>checks</dt><dd>"
                + e(", ".join(f"{name} ({count(n, 'record')})" for name, n in group.checks.items()))
                + "</dd>"
            )
        if group.why:
            out.append(f'<dt>why</dt><dd class="why">{e(group.why)}</dd>')
        out.append(
            f"<dt>representative</dt><dd><code>{e(rep.id)}</code> ({count(rep.records, 'record')})</dd>"
        )
        out.append(
            f'<dt>explain it</dt><dd><pre class="cmd">'
            f"{e(report.explain_command(rep.file, rep.id))}</pre></dd>"
        )
        out.append("</dl>")
        result = self.by_id.get(rep.id)
        if result is not None:
            if id(result) in self.shown:
                out.append(
                    f'<p class="note">The representative is drawn in full above: '
                    f'<a href="#{self.slugs[id(result)]}">{e(result.id)}</a>.</p>'
                )
            else:
                # Plots of the KV-cache groups this cause's records are about.
                involved = {f.group for f in self._records(group, result) if f.group is not None}
                out += self.scenario_card(result, draw=True, open_=False, plot_groups=involved)
        out.append(
            f'<details class="members"><summary>{"The" if len(group.scenarios) == 1 else "All"} '
            f"{count(len(group.scenarios), 'scenario')} of this group</summary>"
        )
        for member in group.scenarios:
            out += self._member(group, member)
        out.append("</details></section>")
        return out

    def _member(self, group: RootCause, member: RootCauseScenario) -> list[str]:
        result = self.by_id.get(member.id)
        if result is None:
            return []
        mine = self._records(group, result)
        types = sorted(
            {
                result.trajectory.groups[f.group].type
                for f in mine
                if result.trajectory is not None and f.group is not None
            }
        )
        out = [
            f'<details class="member" data-verdict="failed" '
            f'data-check="{e(" ".join(sorted({f.check for f in mine})))}" '
            f'data-types="{e(" ".join(types))}"><summary><code>{e(member.id)}</code> '
            f'<span class="note">{member.records} record{"s" if member.records != 1 else ""}'
            f"</span></summary>",
            f"<p>{self.file_link(result.file, result.line)}</p>",
            '<ul class="failures">',
        ]
        for failure in mine[:MESSAGES_PER_SCENARIO]:
            out.append(f"<li>{self.message(_why_stripped(failure.message), result.file)}</li>")
        if len(mine) > MESSAGES_PER_SCENARIO:
            out.append(
                f"<li>... and {len(mine) - MESSAGES_PER_SCENARIO} more like them (report.json; "
                "<code>kvconform explain</code> shows every step)</li>"
            )
        out.append("</ul>")
        out.append(f'<pre class="cmd">{e(self.report.rerun_command(result))}</pre>')
        out.append(
            f'<pre class="cmd">{e(self.report.explain_command(result.file, result.id))}</pre>'
        )
        out.append("</details>")
        return out

    @staticmethod
    def _records(group: RootCause, result: ScenarioResult) -> list[Failure]:
        """The records of ``result`` that fall into ``group``."""
        for member in group.scenarios:
            if member.id == result.id:
                return [result.failures[i] for i in member.failures if i < len(result.failures)]
        return []

    # -- one scenario in full ---------------------------------------------------------

    def scenario_card(
        self,
        result: ScenarioResult,
        draw: bool,
        open_: bool = True,
        plot_groups: set[int] | None = None,
    ) -> list[str]:
        self.shown.add(id(result))
        report, slug = self.report, self.slugs[id(result)]
        verdict = result.verdict.value
        trajectory = result.trajectory
        checks = " ".join(sorted({f.check for f in result.failures}))
        types = (
            " ".join(sorted({g.type for g in trajectory.groups})) if trajectory is not None else ""
        )
        out = [
            f'<article class="card {verdict}" id="{slug}" data-verdict="{verdict}" '
            f'data-check="{e(checks)}" data-types="{e(types)}">',
            f'<h3><span class="badge {verdict}">{verdict}</span><code>{e(result.id)}</code></h3>',
        ]
        if result.description:
            out.append(f'<p class="desc">{e(result.description)}</p>')
        out.append('<dl class="facts">')
        out += [f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in self.setup_facts(result)]
        out.append("</dl>")
        out.append("<h4>Rerun this scenario alone</h4>")
        out.append(f'<pre class="cmd">{e(report.rerun_command(result))}</pre>')
        if result.error:
            kind = result.error_kind.value if result.error_kind else "error"
            out.append(f"<h4>Error ({e(kind)})</h4>")
            out.append(f'<pre class="mono">{self.message(result.error, result.file)}</pre>')
        if result.failures:
            out += self.failures(result, slug)
        if (
            trajectory is not None
            and trajectory.observations
            and result.verdict is not Verdict.PASSED
        ):
            missing = plots.missing_reason()
            if draw and missing is None:
                out += _plots(result, plot_groups)
            elif draw and missing:
                out.append(f'<p class="note">No plots: {e(missing)}.</p>')
            out.append(f"<details{' open' if open_ else ''}><summary>Step by step</summary>")
            out += _steps_table(result, trajectory, slug)
            out.append("</details>")
        out.append("</article>")
        return out

    def setup_facts(self, result: ScenarioResult) -> list[tuple[str, str]]:
        facts = [("file", self.file_link(result.file, result.line))]
        trajectory = result.trajectory
        if trajectory is not None:
            method = (
                f"{e(trajectory.method)}, k = {trajectory.num_speculative_tokens}"
                if trajectory.method
                else "no speculative decoding"
            )
            facts.append(("speculation", method))
            expected = (
                ""
                if trajectory.expected_lookahead in (None, trajectory.lookahead)
                else f"; kvconform's table says {e(trajectory.expected_lookahead)}"
            )
            facts.append(
                (
                    "lookahead",
                    f"{trajectory.lookahead} tokens, from {e(trajectory.lookahead_source)}{expected}",
                )
            )
            groups = "<br>".join(
                f"<b>g{g.index}</b> {e(g.label)}, block_size {g.block_size}"
                for g in trajectory.groups
            )
            facts.append(("KV-cache groups", groups))
            facts.append(("max_model_len", e(trajectory.max_model_len)))
            facts.append(("parties", e(", ".join(trajectory.parties))))
            for note in trajectory.notes:
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

    def failures(self, result: ScenarioResult, slug: str) -> list[str]:
        by_check = Counter(f.check for f in result.failures)
        summary = ", ".join(f"{n} x {e(check)}" for check, n in by_check.items())
        out = [f"<h4>What failed ({summary})</h4>"]
        # Each floor reason once, above the messages that would each repeat it.
        reasons = dict.fromkeys(
            m.group(1)
            for f in result.failures
            if (m := re.search(r"(?s) \(why: (.*)\)$", f.message)) is not None
        )
        out += [f'<p class="why">why: {e(reason)}</p>' for reason in reasons]
        out.append('<ul class="failures">')
        for failure in result.failures[:MAX_MESSAGES]:
            link = ""
            if failure.step is not None and failure.request is not None:
                link = f' <a href="#{slug}-r{failure.step}-{_rid(failure.request)}">row</a>'
            out.append(
                f'<li><span class="check">{e(failure.check)}</span> '
                f"{self.message(_why_stripped(failure.message), result.file)}{link}</li>"
            )
        if len(result.failures) > MAX_MESSAGES:
            out.append(
                f"<li>... and {len(result.failures) - MAX_MESSAGES} more: all are marked in the "
                "table below and listed in report.json</li>"
            )
        out.append("</ul>")
        return out

    # -- the scenario files -----------------------------------------------------------

    def scenario_files(self) -> list[str]:
        """Every scenario file the page links to, embedded once, one anchor per line."""
        if not self.files:
            return []
        out = [
            '<h2 id="files">Scenario files</h2>',
            '<p class="note">The YAML of every scenario shown above, as it was when the run '
            "wrote this page; <code>file:line</code> links open it at the line.</p>",
        ]
        for file, anchor in sorted(self.files.items()):
            try:
                text = Path(file).read_text(encoding="utf-8")
            except OSError as exc:
                out.append(
                    f'<p id="{anchor}" class="note"><code>{e(file)}</code>: not readable '
                    f"({e(exc.strerror or exc)})</p>"
                )
                continue
            numbered = "".join(
                f'<span id="{anchor}-L{n}">{e(line)}</span>\n'
                for n, line in enumerate(text.splitlines(), 1)
            )
            out.append(
                f'<details class="yaml" id="{anchor}"><summary><code>{e(file)}</code></summary>'
                f'<pre class="yaml">{numbered}</pre></details>'
            )
        return out


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


# The page's only script: the filter and opening a collapsed YAML file at a linked line.
# Plain DOM calls, nothing fetched: the page works from a file:// URL or an artifact store.
SCRIPT = """
(function () {
  const selects = Array.from(document.querySelectorAll('select[data-filter]'));
  const items = Array.from(document.querySelectorAll('[data-verdict]'));
  function matches(el, name, value) {
    return !value || (el.dataset[name === 'types' ? 'types' : name] || '').split(' ')
      .includes(value);
  }
  function apply() {
    let shown = 0;
    for (const el of items) {
      const ok = selects.every(s => matches(el, s.dataset.filter, s.value));
      el.hidden = !ok;
      if (ok && !el.parentElement.closest('[data-verdict]')) shown += 1;
    }
    const count = document.getElementById('filter-count');
    if (count) count.textContent = selects.some(s => s.value) ? shown + ' shown' : '';
  }
  selects.forEach(s => s.addEventListener('change', apply));
  function reveal() {
    const target = location.hash && document.getElementById(location.hash.slice(1));
    for (let el = target; el; el = el.parentElement) {
      if (el.tagName === 'DETAILS') el.open = true;
    }
    if (target) target.scrollIntoView({block: 'center'});
  }
  window.addEventListener('hashchange', reveal);
  reveal();
})();
"""


def _rid(request: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", request)


def _plots(result: ScenarioResult, only: set[int] | None = None) -> list[str]:
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
    if attr == "predicted" and obs.predicted_max is not None and obs.predicted_max != value:
        text += f" <span class='note'>(max {obs.predicted_max})</span>"
    title = f' title="{e("; ".join(why))}"' if why else ""
    css = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{css}{title}>{text}</td>"


def _steps_table(result: ScenarioResult, trajectory: Trajectory, slug: str) -> list[str]:
    parties = [p for p in ("live", "predicted", "warmup") if p in trajectory.parties]
    if "warmup" not in parties and any(o.warmup is not None for o in trajectory.observations):
        parties.append("warmup")
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


def _xpassed(results: list[ScenarioResult], page: _Page) -> list[str]:
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


def _coverage(coverage: Coverage, with_code: bool = False) -> list[str]:
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


def _vllm_code(coverage: VllmCodeCoverage) -> list[str]:
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


def write_html(report: RunReport, directory: Path) -> Path:
    path = directory / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path
