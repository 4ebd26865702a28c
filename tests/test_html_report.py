"""report.html: overview, root-cause group cards, tables and plots, rerun commands, all escaped."""

from __future__ import annotations

import base64
import html
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvconform.harness.checks import run_checks
from kvconform.harness.coverage import compute_coverage, offered_by
from kvconform.harness.root_causes import find_root_causes
from kvconform.harness.runner import run_scenario
from kvconform.model.results import ErrorKind, RunReport, ScenarioResult, Verdict
from kvconform.reports import WRITERS, plots, write_reports
from kvconform.reports import html as html_report

SCENARIO = """
name: two-groups
description: Eagle over full attention and a <script>alert("window")</script> sliding window.
model: {groups: [full_attention, {type: sliding_window, sliding_window: 32}]}
speculative: {method: eagle, num_speculative_tokens: 2}
requests: {a: {prompt_len: 40}, b: {prompt_len: 20}}
steps:
  - {a: {prefill: 40}, b: {prefill: 20}}
  - {a: {spec: 2, accepted: 1}, b: decode}
  - {a: {spec: 2, accepted: 0}, b: finish}
  - {a: {spec: 2}}
  - {a: finish}
"""
SHORTED_STEP = 2


def shorted(result: ScenarioResult) -> ScenarioResult:
    """The recorded run with one live count lowered below the floor, judged again.

    The checks read recorded trajectories only, so this is the page's input for
    a shortfall without needing a vLLM that has one.
    """
    run = result.trajectory
    assert run is not None
    for i, obs in enumerate(run.observations):
        if (obs.step, obs.request, obs.group) == (SHORTED_STEP, "a", 0):
            run.observations[i] = obs._replace(live=obs.floor - 1)
    result.failures = run_checks(run)
    result.verdict = Verdict.FAILED
    return result


@pytest.fixture
def report(vllm, scenario_from):
    scenario = scenario_from(SCENARIO)
    failed = shorted(run_scenario(scenario, vllm))
    passed = run_scenario(scenario_from(SCENARIO.replace("two-groups", "fine")), vllm)
    xfailed = shorted(run_scenario(scenario_from(SCENARIO.replace("two-groups", "known")), vllm))
    xfailed.verdict, xfailed.expectation = Verdict.XFAILED, "TODO: investigate"
    xfailed.expectation_evidence = "https://example.invalid/issue/7?a=1&b=2"
    xpassed = run_scenario(scenario_from(SCENARIO.replace("two-groups", "stale")), vllm)
    xpassed.verdict, xpassed.expectation = Verdict.XPASSED, "used to over-predict"
    crashed = ScenarioResult("crashy", "scenarios/crashy.yaml", Verdict.ERROR)
    crashed.error_kind, crashed.error = ErrorKind.CRASH, "vLLM raised TypeError: <bad> & worse"
    results = [passed, failed, crashed, xfailed, xpassed]
    torch_version, device = vllm.runtime()
    run = RunReport(
        results=results,
        input_errors=[],
        vllm_version=vllm.version,
        vllm_source="installed",
        vllm_path=vllm.location,
        torch_version=torch_version,
        device=device,
        duration=12.5,
        command="kvconform run scenarios",
        exit_status=1,
        checks=("floor", "agree"),
    )
    run.root_causes = find_root_causes(results)
    run.coverage = compute_coverage([(scenario, failed), (scenario, passed)], offered_by(vllm))
    return run


class Structure(HTMLParser):
    """Checks that every element is closed in order, and collects ids."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.ids: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.ids += [v for k, v in attrs if k == "id"]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def article(page: str, scenario_id: str) -> str:
    match = re.search(
        rf'<article class="card \w+" id="(s-[^"]+)"[^>]*>\s*<h3><span class="badge \w+">\w+</span>'
        rf"<code>{re.escape(html.escape(scenario_id))}</code>.*?</article>",
        page,
        re.S,
    )
    assert match, scenario_id
    return match.group(0)


def png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", raw[16:24])


def test_the_writer_is_registered(report, tmp_path):
    assert html_report.write_html in WRITERS
    written = write_reports(report, tmp_path)
    assert tmp_path / "report.html" in written


def test_page_is_well_formed_and_escaped(report):
    page = html_report.render_html(report)
    parser = Structure()
    parser.feed(page)
    assert parser.errors == [] and parser.stack == []
    assert len(parser.ids) == len(set(parser.ids))
    assert page.count("<script") == 1  # the page's filter; the description's markup is text
    assert "&lt;script&gt;alert(&quot;window&quot;)&lt;/script&gt;" in page
    assert "vLLM raised TypeError: &lt;bad&gt; &amp; worse" in page
    assert 'href="https://example.invalid/issue/7?a=1&amp;b=2"' in page
    assert "http://" not in page.replace("https://example.invalid", "")  # nothing to fetch


def test_overview(report, vllm):
    page = html_report.render_html(report)
    assert f"<title>kvconform: NOT conform (exit 1) - vLLM {vllm.version}</title>" in page
    assert f"<b>{vllm.version}</b>, installed ({html.escape(vllm.location)})" in page
    assert f"{report.torch_version} / {report.device}" in page
    assert "<dd>12.5 s</dd>" in page
    for count, verdict in [
        (1, "passed"),
        (1, "failed"),
        (1, "error"),
        (1, "xfailed"),
        (1, "xpassed"),
    ]:
        assert f'<span class="chip {verdict}">{count} {verdict}</span>' in page


def test_failed_scenario_table_marks_the_offending_cells(report):
    page = html_report.render_html(report)
    failed = report.results[1]
    section = article(page, "two-groups")
    obs = next(
        o
        for o in failed.trajectory.observations
        if (o.step, o.request, o.group) == (SHORTED_STEP, "a", 0)
    )
    row = re.search(
        rf'<tr class="row hit" id="s-two-groups-r{SHORTED_STEP}-a">(.*?)</tr>', section, re.S
    )
    assert row, "the shorted step's row is marked"
    cells = re.findall(r"<td[^>]*>.*?</td>", row.group(1))
    # step, line, request, action, computed, scheduled, then floor | live | predicted per group
    assert cells[6] == f'<td class="sep">{obs.floor}</td>'
    assert cells[7] == (
        f'<td class="below" title="below the floor of {obs.floor}">{obs.floor - 1}</td>'
    )
    assert '<td class="below"' not in "".join(cells[9:])  # group 1 held enough
    # Every failure message, with a link to its row; the floor rule's reason once.
    text_only = re.sub(r"<a [^>]*>|</a>", "", section)  # "line N" links to the YAML
    for failure in failed.failures:
        text, _, why = failure.message.partition(" (why: ")
        assert html.escape(text) in text_only
        if why:
            assert section.count(f'<p class="why">why: {html.escape(why[:-1])}</p>') == 1
    assert section.count(f'href="#s-two-groups-r{SHORTED_STEP}-a"') == len(failed.failures)
    assert f'<pre class="cmd">{html.escape(report.rerun_command(failed))}</pre>' in section
    # Finish rows say what went back to the pool.
    assert re.search(r'<tr class="event">.*?finish: \d+ blocks went back to the pool', section)


def test_the_representative_is_plotted_for_the_groups_its_cause_is_about(report):
    page = html_report.render_html(report)
    section = article(page, "two-groups")
    images = re.findall(
        r'<img class="plot" alt="([^"]*)" src="data:image/png;base64,([^"]+)"', section
    )
    # Only group 0 was shorted: the cause's records are about it alone.
    assert [alt for alt, _ in images] == ["blocks held per step, g0 full_attention (block_size 16)"]
    for _, data in images:
        width, height = png_size(data)
        assert width > 300 and height > 150
    assert page.count('<img class="plot"') == 1  # xfailed / passed / xpassed / error: none
    assert "<code>fine</code>" in page.split('id="passed"')[1]  # listed compactly
    known = article(page, "known")
    assert (
        '<span class="todo">TODO: investigate</span> (added automatically, not reviewed)' in known
    )


def test_one_card_per_root_cause_with_its_scenarios_collapsed(report):
    page = html_report.render_html(report)
    # The lowered live count is below the floor and below the predictor: two records of
    # one cause, the floor's, with the disagreement folded in.
    (group,) = report.root_causes
    number = 1
    assert (group.party, group.check, group.checks) == ("live", "floor", {"floor": 1, "agree": 1})
    assert group.miss.startswith("is one block short")  # live = floor - 1
    card = page.split(f'<section class="card group" id="g-{number}"')[1].split("</section>")[0]
    assert 'data-verdict="failed" data-check="floor agree" data-types="full_attention"' in card
    # Only the full-attention group fell short, while the sliding window ran under the
    # same lookahead: the manager vLLM dispatched it to is named, linked at the methods
    # that count and allocate its blocks (inherited here), not at its class line.
    assert "<b>the live allocator</b> <code>FullAttentionManager</code>, its blocks " in card
    cause = card.split('<p class="cause">')[1].split("</p>")[0]
    links = re.findall(
        r"by <code>(\w+)\.(\w+)</code> \(<a href=\"(file://[^\"]+single_type_kv_cache_manager"
        r"\.py)\">vllm/v1/core/single_type_kv_cache_manager\.py:(\d+)</a>\)",
        cause,
    )
    assert [method for _, method, _, _ in links] == [
        "get_num_blocks_to_allocate",
        "allocate_new_blocks",
    ], card[:2000]
    source = (Path(report.vllm_path) / "v1/core/single_type_kv_cache_manager.py").read_text()
    lines = source.splitlines()
    for owner, method, _, line in links:
        assert lines[int(line) - 1].lstrip().startswith(f"def {method}("), (owner, line)
        # The method is the one FullAttentionManager runs: its own, or its base's.
        assert owner in ("FullAttentionManager", "SingleTypeKVCacheManager")
        assert not lines[int(line) - 1].lstrip().startswith("class ")
    assert f"<b>{html.escape(group.miss)}</b>" in card
    assert html.escape(report.explain_command(group.representative.file, "two-groups")) in card
    members = re.findall(r'<details class="member".*?</details>', card, re.S)
    assert len(members) == len(group.scenarios) == 1
    assert "<code>two-groups</code>" in members[0]


def test_file_lines_link_into_the_embedded_yaml(report):
    page = html_report.render_html(report)
    failed = report.results[1]
    links = re.findall(r'<a class="yaml-link" href="#(y-[^"]+)">', page)
    assert links
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert set(links) <= ids  # every link lands
    yaml_section = page.split('<h2 id="files">')[1]
    first_line = Path(failed.file).read_text().splitlines()[0]
    assert f'-L1">{html.escape(first_line)}</span>' in yaml_section
    assert f"-L{failed.line}" in " ".join(links)


def test_xpassed_is_its_own_section(report):
    page = html_report.render_html(report)
    section = page.split('<h2 id="xpassed">')[1].split("<h2")[0]
    assert "Known divergences that conform now (1 xpassed)" in section
    assert "<code>stale</code>" in section and "used to over-predict" in section
    assert "<code>stale</code>" not in page.split('id="passed"')[1].split('id="coverage"')[0]


def test_coverage_section(report):
    page = html_report.render_html(report)
    section = page.split('<h2 id="coverage">')[1]
    assert '<td class="l"><code>full_attention</code></td>' in section
    assert 'title="prefill, decode, spec, rollback, finish">pdsrf</td>' in section
    assert "CrossAttentionSpec" in section and '<span class="status uncovered">' in section


def test_without_matplotlib_the_tables_stay(report, monkeypatch):
    monkeypatch.setattr(plots, "missing_reason", lambda: "matplotlib is not installed")
    page = html_report.render_html(report)
    assert "<img" not in page
    assert "No plots: matplotlib is not installed." in page
    assert '<td class="below"' in page


def test_a_run_that_could_not_start_still_has_a_page():
    from kvconform.errors import Location, ScenarioError

    bad = ScenarioError(Location("scenarios/x.yaml", 3, "steps[0].a"), "prefill 6 is outside 1..5")
    run = RunReport(
        results=[],
        input_errors=[bad],
        vllm_version="0.27.1",
        vllm_source=None,
        vllm_path=None,
        vllm_error="vLLM 0.27.1 lacks an importable vllm: ImportError: <no module>",
        exit_status=2,
    )
    page = html_report.render_html(run)
    parser = Structure()
    parser.feed(page)
    assert parser.errors == [] and parser.stack == []
    assert "could not run everything (exit 2)" in page
    assert "ImportError: &lt;no module&gt;" in page
    assert "scenarios/x.yaml:3: steps[0].a: prefill 6 is outside 1..5" in page
    assert '<h2 id="coverage">' not in page and "<img" not in page
