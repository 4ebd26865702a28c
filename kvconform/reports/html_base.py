"""What every part of ``report.html`` shares: escaping, the stylesheet, the script.

The page is assembled by :mod:`kvconform.reports.html`; its parts live in
:mod:`.html_cards` (root-cause groups and scenarios in full), :mod:`.html_steps`
(plots and the step table) and :mod:`.html_coverage` (the coverage sections).
"""

from __future__ import annotations

import html


def e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)



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
