"""The report of a run against a vLLM with an injected bug, opened in headless Chromium.

The bug goes into a COPY of the installed vLLM's Python tree: the warmup
predictor ``_reserved_block_count`` forgets the lookahead, as releases before
0.28.0 did. ``kvconform run --vllm-src`` against that copy must fail, and its
``report.html`` must show the root-cause groups on top (the predictor's, named
with its file), the representative scenario's table, rendered plots and the
command that reruns it, and a filter that hides and shows the cards by check and
verdict, in a real browser without console errors. The screenshots land in
``build/browser/`` for a person to look at (``first-screen.png``: what a reader
sees on opening the page).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The browser driver speaks CDP over websockets, a test dependency (pyproject's test
# extra); a machine without it (a bare GPU image running `-m cuda`) skips this module.
pytest.importorskip("websockets")
from cdp import Browser, find_chromium  # noqa: E402
from vllm_copy import tree_with_replacement

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "build" / "browser"
FIXED = "    num_tokens = min(num_tokens + num_lookahead_tokens, max_model_len)\n"
BROKEN = "    num_tokens = min(num_tokens, max_model_len)  # injected: lookahead forgotten\n"

SPEC = """\
name: eagle-two-groups
description: EAGLE with 3 drafts over full attention and a sliding window; drafts partly rejected.
model: {groups: [full_attention, {type: sliding_window, sliding_window: 64}]}
speculative: {method: eagle, num_speculative_tokens: 3}
requests: {a: {prompt_len: 61}, b: {prompt_len: 30}}
steps:
  - {a: {prefill: 61}, b: {prefill: 30}}
  - {repeat: 4, step: {a: {spec: 3, accepted: 1}, b: {spec: 3}}}
  - {a: finish, b: finish}
"""
PLAIN = """\
name: plain-decode
requests: {a: {prompt_len: 30}}
steps:
  - {a: {prefill: 30}}
  - {repeat: 3, step: {a: decode}}
  - {a: finish}
"""


@pytest.fixture(scope="module")
def injected(tmp_path_factory, pristine_tree):
    root = tmp_path_factory.mktemp("injected")
    tree = tree_with_replacement(
        pristine_tree, root / "vllm-tree", "v1/worker/gpu/warmup.py", FIXED, BROKEN
    )
    scenarios = root / "scenarios"
    scenarios.mkdir()
    (scenarios / "eagle.yaml").write_text(SPEC)
    (scenarios / "plain.yaml").write_text(PLAIN)
    out = root / "report"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("KVCONFORM_PROGRESS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvconform",
            "run",
            str(scenarios),
            "--vllm-src",
            str(tree),
            "--report-dir",
            str(out),
            "-v",
            "--progress",
            "lines",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    return proc, out, tree


def test_the_injected_bug_fails_the_run(injected):
    proc, out, tree = injected
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED   eagle-two-groups" in proc.stdout
    assert "PASSED   plain-decode" in proc.stdout
    assert "the warmup predictor _reserved_block_count holds" in proc.stdout
    # Lines asked for, stderr not a terminal: plain progress lines, no carriage returns.
    assert "progress: 2/2 scenarios (100%)" in proc.stderr and "\r" not in proc.stderr


def test_the_page_shows_table_plots_and_rerun_command(injected):
    proc, out, tree = injected
    page = (out / "report.html").read_text()
    assert f"src ({html.escape(str(tree / 'vllm'))})" in page
    section = page.split('id="s-eagle-two-groups"')[1].split("</article>")[0]
    rerun = f"kvconform run {tree.parent / 'scenarios' / 'eagle.yaml'}::eagle-two-groups --vllm-src {tree}"
    assert f'<pre class="cmd">{html.escape(rerun)}</pre>' in section
    assert section.count('<img class="plot"') == 2
    # The predictor's cells fall below the floor; the live ones differ from it.
    assert re.search(r'<td class="below" title="below the floor of \d+">\d+</td>', section)
    assert re.search(r'<td class="disagree" title="differs from the predictor', section)
    assert "[floor]" not in section and '<span class="check">floor</span>' in section
    assert 'id="s-plain-decode"' not in page  # passing: listed, not expanded
    assert "<code>plain-decode</code>" in page.split('id="passed"')[1]


CHECK_PLOTS = """
(() => {
  const images = Array.from(document.images).map(img => ({
    alt: img.alt, complete: img.complete, width: img.naturalWidth, height: img.naturalHeight,
    shown: img.getBoundingClientRect().width }));
  const svgs = Array.from(document.querySelectorAll('svg')).map(svg => svg.getBBox().width);
  const table = document.querySelector('#s-eagle-two-groups table.steps');
  return { images, svgs,
           belowCells: document.querySelectorAll('#s-eagle-two-groups td.below').length,
           tableRows: table ? table.tBodies[0].rows.length : 0,
           title: document.title };
})()
"""


FILTER = """
(() => {
  const visible = sel => Array.from(document.querySelectorAll(sel)).filter(el => {
    for (let e = el; e; e = e.parentElement) if (e.hidden) return false;
    return true; }).length;
  const set = (name, value) => { const s = document.getElementById('filter-' + name);
    s.value = value; s.dispatchEvent(new Event('change')); };
  const groups = Array.from(document.querySelectorAll('section.group'));
  const state = { groups: groups.length,
    causes: groups.map(g => g.querySelector('p.cause').textContent),
    checks: groups.map(g => g.dataset.check) };
  state.all = visible('section.group');
  set('check', 'agree'); state.agree = visible('section.group');
  state.agreeChecks = groups.filter(g => !g.hidden).map(g => g.dataset.check);
  set('check', ''); set('verdict', 'passed');
  state.passedGroups = visible('section.group');
  state.passedRows = visible('tr[data-verdict="passed"]');
  set('verdict', ''); set('types', 'sliding_window');
  state.windowGroups = visible('section.group');
  set('types', ''); set('verdict', 'passed'); set('check', 'floor');
  state.count = document.getElementById('filter-count').textContent;
  set('verdict', ''); set('check', '');
  state.reset = visible('section.group');
  return state;
})()
"""


def test_the_page_renders_in_chromium(injected):
    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium is not installed and could not be (`make browser` installs it)")
    proc, out, tree = injected
    page = out / "report.html"
    with Browser(executable) as browser:
        browser.open(page.as_uri())
        state = browser.evaluate(CHECK_PLOTS)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        first = browser.screenshot(SCREENSHOTS / "first-screen.png", top=0, height=1100)
        filtered = browser.evaluate(FILTER)
        errors = browser.console_errors()
        whole = browser.screenshot(SCREENSHOTS / "report.png")
        top = browser.evaluate(
            "document.getElementById('s-eagle-two-groups').getBoundingClientRect().top + scrollY"
        )
        failing = browser.screenshot(SCREENSHOTS / "failing-scenario.png", top=top, height=2400)
    assert errors == []
    assert state["title"].startswith("kvconform: NOT conform (exit 1)")
    assert len(state["images"]) >= 1  # the representative's, of the groups its cause is about
    for image in state["images"]:
        assert image["complete"] and image["width"] > 300 and image["height"] > 150, image
        assert image["shown"] > 0, image
    assert all(width > 0 for width in state["svgs"])
    assert state["belowCells"] > 0
    assert state["tableRows"] >= 1 + 4 * 2
    # The groups: the predictor's shortfall first, named with its function and file, the
    # live allocator's disagreement with it folded in (one cause, one group).
    assert filtered["groups"] >= 1 and filtered["all"] == filtered["groups"]
    assert (
        "the warmup predictor _reserved_block_count (vllm/v1/worker/gpu/warmup.py"
        in (filtered["causes"][0])
    )
    assert "the whole lookahead" in filtered["causes"][0]
    # The filter: by check (a group shows under each check it holds), by verdict (no
    # group is "passed"), by group type, and back.
    assert filtered["checks"][0] == "floor agree"
    assert filtered["agree"] >= 1 and "floor agree" in filtered["agreeChecks"]
    assert filtered["passedGroups"] == 0 and filtered["passedRows"] == 1
    assert filtered["windowGroups"] >= 1
    assert filtered["count"] == "0 shown"  # no passed scenario failed a check
    assert filtered["reset"] == filtered["groups"]
    for shot in (first, whole, failing):
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
