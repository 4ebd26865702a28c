"""The campaign's reports: ``mutation.json``, ``mutation.md``, the Stryker report and ``mutation.html``.

``mutation.json`` (schema in docs/mutation.md) carries at the top ``vllm``,
``mutants``, ``killed``, ``survived``, ``timeout``, ``incompetent``,
``equivalent``, ``score`` = killed / (mutants - equivalent - incompetent) and
``seconds``, a row per target function (``targets``) and one entry per mutant
(``results``: id, diff, verdict, killing scenarios and checks, rerun command).
Reports of shards (``--shard I/N``) merge into one (:func:`merge`): their
mutants are disjoint, their counts add up, the score is recomputed.

``mutation-testing-report.json`` is the same campaign in the schema of Stryker's
mutation-testing-elements (schema version 2), which its report viewer and
dashboard read; ``mutation.html`` is a page of its own, with no script from
anywhere: per target function its counts, then each mutant not killed with
its diff, and the killed ones folded.
"""

from __future__ import annotations

import html
import json
import shlex
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kvconform.peer.verdict import CATCH_CELLS, catch_cell

VERDICTS = ("killed", "survived", "timeout", "incompetent", "equivalent", "skipped")


def score(counts: dict[str, int], mutants: int) -> float | None:
    judged = mutants - counts.get("equivalent", 0) - counts.get("incompetent", 0)
    return round(counts.get("killed", 0) / judged, 4) if judged > 0 else None


def rerun_command(mutant_id: str, targets_file: str, vllm_option: Sequence[str]) -> str:
    return shlex.join(
        ["kvconform", "mutate", "--targets", targets_file, "--mutant", mutant_id, *vllm_option]
    )


def build(
    *,
    vllm: dict[str, Any],
    targets: list[dict[str, Any]],
    results: list[dict[str, Any]],
    seconds: float,
    phases: dict[str, float],
    shard: str,
    command: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    counts = Counter(r["verdict"] for r in results)
    report: dict[str, Any] = {
        "vllm": vllm,
        "mutants": len(results),
        **{verdict: counts.get(verdict, 0) for verdict in VERDICTS[:5]},
        "score": score(counts, len(results)),
        "seconds": round(seconds, 1),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "shard": shard,
        "command": command,
        "engine": "cosmic-ray",
        "targets": _target_rows(targets, results),
        "results": results,
    }
    if counts.get("skipped"):
        report["skipped"] = counts["skipped"]
    if any("peer" in r for r in results):
        report["peer"] = who_catches(results)
    report.update(extra or {})
    return report


def _target_rows(
    targets: list[dict[str, Any]], results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = []
    for target in targets:
        mine = [r for r in results if r["target"] == target["key"]]
        counts = Counter(r["verdict"] for r in mine)
        rows.append(
            {
                **target,
                "mutants": len(mine),
                **{verdict: counts.get(verdict, 0) for verdict in VERDICTS[:5]},
                "not_covered": sum(1 for r in mine if not r["covered"]),
                "score": score(counts, len(mine)),
            }
        )
    return rows


def merge(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One report of several shards' reports (same vLLM, same targets)."""
    reports = list(reports)
    if not reports:
        raise ValueError("no reports to merge")
    versions = {json.dumps(r["vllm"], sort_keys=True) for r in reports}
    if len(versions) > 1:
        raise ValueError(f"the shards ran against different vLLMs: {sorted(versions)}")
    results: dict[str, dict[str, Any]] = {}
    for report in reports:
        for result in report["results"]:
            results.setdefault(result["id"], result)
    targets: dict[str, dict[str, Any]] = {}
    for report in reports:
        for row in report["targets"]:
            targets.setdefault(
                row["key"],
                {
                    k: row[k]
                    for k in ("key", "module", "function", "missing", "reached_by", "focus")
                },
            )
    merged = build(
        vllm=reports[0]["vllm"],
        targets=list(targets.values()),
        results=sorted(results.values(), key=lambda r: r["order"]),
        seconds=sum(r["seconds"] for r in reports),
        phases={},
        shard=f"merged {len(reports)}: " + ", ".join(r["shard"] for r in reports),
        command=reports[0]["command"],
    )
    merged["shard_seconds"] = [r["seconds"] for r in reports]
    return merged


# -- Markdown ------------------------------------------------------------------------------


def _fmt_score(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(report: dict[str, Any]) -> str:
    vllm = report["vllm"]
    lines = [
        f"# Mutation campaign: vLLM {vllm['version']}",
        "",
        f"{report['mutants']} mutants (cosmic-ray's operators), score **{_fmt_score(report['score'])}** "
        f"= killed / (mutants - equivalent - incompetent); {report['seconds']:.0f} s; shard {report['shard']}.",
        "",
        "| target function | mutants | killed | survived | timeout | incompetent | equivalent | not reached | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["targets"]:
        if row.get("missing"):
            lines.append(f"| `{row['key']}` | missing: {row['missing']} | | | | | | | |")
            continue
        lines.append(
            f"| `{row['key']}` | {row['mutants']} | {row['killed']} | {row['survived']} | "
            f"{row['timeout']} | {row['incompetent']} | {row['equivalent']} | {row['not_covered']} | "
            f"{_fmt_score(row['score'])} |"
        )
    lines.append(
        f"| **all** | {report['mutants']} | {report['killed']} | {report['survived']} | "
        f"{report['timeout']} | {report['incompetent']} | {report['equivalent']} | | "
        f"{_fmt_score(report['score'])} |"
    )
    if report.get("peer"):
        peer = report["peer"]
        judged = [r for r in report["results"] if "peer" in r]
        missed_by_us = [
            r for r in judged
            if r["peer"]["verdict"] == "killed" and r["verdict"] not in KVCONFORM_CATCHES
        ]  # fmt: skip
        lines += [
            "",
            f"## vLLM's own tests on {len(judged)} of these mutants (docs/peer-tests.md)",
            "",
            "| killed by | mutants |",
            "|---|---:|",
            *(f"| {key} | {count} |" for key, count in peer.items()),
        ]
        if missed_by_us:
            lines += ["", "Killed by vLLM's tests and not by kvconform:", ""]
            lines += [
                f"- `{r['id']}`: `{r['replacement']}` — {r['peer']['first_failure']}"
                for r in missed_by_us
            ]
    for row in report["targets"]:
        if row.get("missing"):
            continue
        mine = [r for r in report["results"] if r["target"] == row["key"]]
        lines += ["", f"## `{row['function']}` ({row['module']})", ""]
        lines.append(
            f"{row['mutants']} mutants, {row['killed']} killed, reached by {row['reached_by']} "
            f"scenarios; score {_fmt_score(row['score'])}."
        )
        killers = Counter(k["scenario"] for r in mine for k in r["killed_by"][:1])
        if killers:
            lines.append(
                "First killers: "
                + ", ".join(f"`{s}` ({n})" for s, n in killers.most_common(5))
                + "."
            )
        for verdict in ("survived", "timeout", "incompetent", "equivalent"):
            chosen = [r for r in mine if r["verdict"] == verdict]
            if not chosen:
                continue
            lines += ["", f"### {verdict} ({len(chosen)})", ""]
            for r in chosen:
                why = r.get("equivalent_reason") or r.get("note") or ""
                lines.append(
                    f"- `{r['id']}` line {r['line']}: `{r['replacement']}`"
                    + (f" — {why}" if why else "")
                )
    return "\n".join(lines) + "\n"


# -- Stryker's mutation-testing-elements schema ------------------------------------------------

_STRYKER_STATUS = {
    "killed": "Killed",
    "survived": "Survived",
    "timeout": "Timeout",
    "incompetent": "RuntimeError",
    "equivalent": "Ignored",
    "skipped": "Pending",
}


def stryker(report: dict[str, Any], sources: dict[str, str]) -> dict[str, Any]:
    """The report in mutation-testing-elements' schema (version 2)."""
    files: dict[str, dict[str, Any]] = {}
    for r in report["results"]:
        path = r["module"].replace(".", "/") + ".py"
        entry = files.setdefault(
            path, {"language": "python", "source": sources.get(r["module"], ""), "mutants": []}
        )
        status = _STRYKER_STATUS[r["verdict"]]
        if r["verdict"] == "survived" and not r["covered"]:
            status = "NoCoverage"
        entry["mutants"].append(
            {
                "id": r["id"],
                "mutatorName": r["operator"],
                "replacement": r["replacement"],
                "location": {
                    "start": {"line": r["line"], "column": r["column"] + 1},
                    "end": {"line": r["end_line"], "column": r["end_column"] + 1},
                },
                "status": status,
                "statusReason": r.get("equivalent_reason") or r.get("note") or None,
                "killedBy": [k["scenario"] for k in r["killed_by"]],
                "testsCompleted": r["scenarios_run"],
            }
        )
    return {
        "schemaVersion": "2",
        "thresholds": {"high": 95, "low": 80},
        "projectRoot": report["vllm"].get("path", ""),
        "files": files,
        "framework": {"name": "kvconform mutate", "version": report.get("kvconform", "")},
    }


# -- HTML ----------------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}
pre{background:#f6f6f6;padding:.5em;overflow-x:auto}
.survived{color:#b00}.timeout{color:#a60}.incompetent{color:#666}.equivalent{color:#06a}.killed{color:#080}
details{margin:.3em 0}
"""


def html_page(report: dict[str, Any]) -> str:
    e = html.escape
    out = [
        "<!doctype html><meta charset=utf-8>",
        f"<title>kvconform mutate: vLLM {e(report['vllm']['version'])}</title><style>{_STYLE}</style>",
        f"<h1>Mutation campaign: vLLM {e(report['vllm']['version'])}</h1>",
        f"<p>{report['mutants']} mutants, score <b>{_fmt_score(report['score'])}</b>, "
        f"{report['seconds']:.0f} s, shard {e(report['shard'])}.</p>",
        "<table><tr><th>target</th><th>mutants</th><th>killed</th><th>survived</th><th>timeout</th>"
        "<th>incompetent</th><th>equivalent</th><th>score</th></tr>",
    ]
    for row in report["targets"]:
        if row.get("missing"):
            out.append(
                f"<tr><td>{e(row['key'])}</td><td colspan=7>missing: {e(row['missing'])}</td></tr>"
            )
            continue
        out.append(
            f"<tr><td><a href='#{e(row['key'])}'>{e(row['key'])}</a></td><td>{row['mutants']}</td>"
            + "".join(f"<td class={v}>{row[v]}</td>" for v in VERDICTS[:5])
            + f"<td>{_fmt_score(row['score'])}</td></tr>"
        )
    out.append("</table>")
    for row in report["targets"]:
        if row.get("missing"):
            continue
        out.append(
            f"<h2 id='{e(row['key'])}'>{e(row['function'])} <small>{e(row['module'])}</small></h2>"
        )
        mine = [r for r in report["results"] if r["target"] == row["key"]]
        for r in sorted(mine, key=lambda r: (r["verdict"] == "killed", r["order"])):
            killers = "; ".join(
                f"{k['scenario']}: {', '.join(k['checks'])}" for k in r["killed_by"]
            )
            why = r.get("equivalent_reason") or r.get("note") or killers
            opened = "" if r["verdict"] == "killed" else " open"
            out.append(
                f"<details{opened}><summary class={r['verdict']}>{e(r['verdict'])}: "
                f"<code>{e(r['id'])}</code> line {r['line']}</summary>"
                f"<p>{e(why)}</p><pre>{e(r['diff'])}</pre><p><code>{e(r['rerun'])}</code></p></details>"
            )
    return "\n".join(out) + "\n"


def write(report: dict[str, Any], directory: str | Path, sources: dict[str, str]) -> list[Path]:
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("mutation.json", json.dumps(report, indent=1) + "\n"),
        ("mutation.md", markdown(report)),
        ("mutation-testing-report.json", json.dumps(stryker(report, sources)) + "\n"),
        ("mutation.html", html_page(report)),
    ):
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# What kvconform's verdict means for "who catches it" beside vLLM's own tests.
KVCONFORM_CATCHES = frozenset({"killed"})


def who_catches(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The four-way table over the results that have a ``peer`` entry."""
    table: Counter[str] = Counter()
    for result in results:
        peer = result.get("peer")
        if not peer or peer["verdict"] in ("broken", "timeout"):
            table["not judged by vLLM's tests"] += 1 if peer else 0
            continue
        table[catch_cell(result["verdict"] in KVCONFORM_CATCHES, peer["verdict"] == "killed")] += 1
    keys = (*CATCH_CELLS, "not judged by vLLM's tests")
    return {key: table.get(key, 0) for key in keys}
