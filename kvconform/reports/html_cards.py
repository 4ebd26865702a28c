"""``report.html``: the root-cause groups and the scenarios drawn in full (:class:`Page`)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from kvconform.harness.expectations_update import is_unreviewed
from kvconform.model.results import Failure, RunReport, ScenarioResult, Verdict
from kvconform.model.root_causes import RootCause, RootCauseScenario
from kvconform.model.wording import count
from kvconform.reports import plots
from kvconform.reports.html_base import e
from kvconform.reports.html_steps import row_id, scenario_plots, steps_table
from kvconform.reports.root_causes import never_below_floor_text

MAX_MESSAGES = 25


def link_or_text(text: str) -> str:
    if re.match(r"^https?://\S+$", text.strip()):
        return f'<a href="{e(text.strip())}">{e(text.strip())}</a>'
    return e(text)


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


class Page:
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
                out += scenario_plots(result, plot_groups)
            elif draw and missing:
                out.append(f'<p class="note">No plots: {e(missing)}.</p>')
            out.append(f"<details{' open' if open_ else ''}><summary>Step by step</summary>")
            out += steps_table(result, trajectory, slug)
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
                facts.append(("evidence", link_or_text(result.expectation_evidence)))
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
                link = f' <a href="#{slug}-r{failure.step}-{row_id(failure.request)}">row</a>'
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
