"""``kvconform merge DIR...``: the shards of a CI job's parallel steps as one run.

Each shard (``kvconform run --shard I/N``) writes its own report directory. The
merge reads every ``report.json``, rebuilds one :class:`RunReport` from them and
hands it to the same writers ``kvconform run`` uses, so the joined
``summary.md``, ``junit.xml``, ``report.html`` and ``report.json`` read as if one
machine had run the whole selection.

What a merge cannot rebuild is said, not faked: the trajectories (so the plots)
stay in each shard's own ``report.html``, and the coverage in each shard's
``report.json``. What would make the merged run falsely green is an error: a
shard of ``1..N`` that is missing, a shard given twice, or shards run against
different vLLM versions or checks (exit 2, with the reports still written when
there is anything to write).

The exit status follows ``kvconform run``'s precedence over everything the
shards found (bad input, then nonconformance, then "not exercised"); 5 only when
the whole selection matched nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvconform.errors import ExitStatus, Location, ScenarioError, UsageError
from kvconform.harness.runner import exit_status
from kvconform.model.kinds import Kind
from kvconform.model.results import ErrorKind, Failure, RunReport, ScenarioResult, Verdict
from kvconform.model.settings import SettingsRecord

__all__ = ["merge_reports", "read_report"]

_FAILURE_FIELDS = tuple(Failure.__dataclass_fields__)


def read_report(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / "report.json"
    if not path.is_file():
        raise UsageError(f"merge: {directory} has no report.json (did that shard run?)")
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"merge: {path} does not read as JSON: {exc}") from None
    if not str(data.get("schema", "")).startswith("kvconform-report/"):
        raise UsageError(f"merge: {path} is not a kvconform report (schema {data.get('schema')!r})")
    return data


def _result(entry: dict[str, Any]) -> ScenarioResult:
    failures = [
        Failure(**{k: v for k, v in failure.items() if k in _FAILURE_FIELDS})
        for failure in entry.get("failures", [])
    ]
    kind = entry.get("error_kind")
    return ScenarioResult(
        id=entry["id"],
        file=entry["file"],
        verdict=Verdict(entry["verdict"]),
        kind=entry.get("kind", Kind.TRAJECTORY),
        tags=tuple(entry.get("tags", ())),
        failures=failures,
        error=entry.get("error"),
        error_kind=ErrorKind(kind) if kind else None,
        expectation=entry.get("expectation"),
        duration=float(entry.get("duration_s", 0.0)),
        line=entry.get("line"),
        description=entry.get("description", ""),
        expectation_evidence=entry.get("expectation_evidence"),
        skipped_checks=dict(entry.get("skipped_checks", {})),
        settings=SettingsRecord.from_json(entry),
    )


def _rank(status: int) -> int:
    """Precedence of a shard's own status: bad input > nonconformance > not exercised."""
    order = [
        ExitStatus.NO_SELECTION,
        ExitStatus.CONFORM,
        ExitStatus.NOT_EXERCISED,
        ExitStatus.NONCONFORMANCE,
        ExitStatus.BAD_INPUT,
    ]
    return order.index(ExitStatus(status)) if status in order else len(order)


def merge_reports(directories: Sequence[str | Path], command: str = "") -> RunReport:
    """One report from the shards' report directories (see the module's docstring)."""
    if not directories:
        raise UsageError("merge: name at least one report directory")
    shards = [(str(d), read_report(d)) for d in directories]
    problems: list[str] = []
    for key, label in ((("vllm", "version"), "vLLM versions"), (("checks",), "checks")):
        seen: dict[str, list[str]] = {}
        for name, data in shards:
            value: Any = data
            for part in key:
                value = value.get(part) if isinstance(value, dict) else None
            seen.setdefault(json.dumps(value), []).append(name)
        if len(seen) > 1:
            problems.append(
                f"the shards ran with different {label}: "
                + "; ".join(f"{json.loads(v)} in {', '.join(names)}" for v, names in seen.items())
            )
    problems += _shard_coverage(shards)
    first = shards[0][1]
    vllm = first.get("vllm") or {}
    report = RunReport(
        results=[],
        input_errors=[],
        vllm_version=vllm.get("version"),
        vllm_source=vllm.get("source"),
        vllm_path=vllm.get("path"),
        vllm_release=vllm.get("release"),
        vllm_error=next((d["vllm"]["error"] for _, d in shards if d["vllm"].get("error")), None),
        torch_version=first.get("torch"),
        device=first.get("device"),
        started=min(float(d.get("started", 0.0)) for _, d in shards),
        # The shards ran side by side: the job took as long as the slowest.
        duration=max(float(d.get("duration_s", 0.0)) for _, d in shards),
        command=command,
        checks=tuple(first.get("checks", ())),
        expectations_file=first.get("expectations_file"),
        rerun_options=tuple(first.get("rerun_options", ())),
    )
    seen_ids: dict[str, str] = {}
    seen_errors: set[tuple[Any, ...]] = set()
    for name, data in shards:
        for entry in data.get("scenarios", []):
            if entry["id"] in seen_ids:
                problems.append(f"scenario {entry['id']} is in {seen_ids[entry['id']]} and {name}")
                continue
            seen_ids[entry["id"]] = name
            report.results.append(_result(entry))
        # Every shard loads every file, so each reports the same input errors.
        for err in data.get("input_errors", []):
            error_key = (err.get("file"), err.get("line"), err.get("field"), err.get("message"))
            if error_key not in seen_errors:
                seen_errors.add(error_key)
                where = Location(str(err.get("file")), err.get("line"), err.get("field"))
                report.input_errors.append(ScenarioError(where, str(err.get("message"))))
        for note in data.get("notes", []):
            if note not in report.notes and not note.startswith("nothing selected: shard"):
                report.notes.append(note)
    report.notes.append(
        f"merged from {len(shards)} report directories ({', '.join(n for n, _ in shards)}); "
        "plots and coverage are in each shard's own report.html and report.json"
    )
    statuses = [int(d.get("exit_status", 0)) for _, d in shards]
    status = exit_status(report.results, len(report.input_errors))
    worst = max(statuses, key=_rank)
    if _rank(worst) > _rank(status):
        status = ExitStatus(worst)
    if not report.results and not report.input_errors:
        status = (
            ExitStatus.NO_SELECTION
            if all(s == ExitStatus.NO_SELECTION for s in statuses)
            else status
        )
    for problem in problems:
        report.notes.insert(0, f"merge: {problem}")
    if problems:
        status = ExitStatus.BAD_INPUT
    report.exit_status = int(status)
    return report


def _shard_coverage(shards: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """A missing or repeated shard, by the ``shard`` ("I/N") each report records."""
    given = [(name, data.get("shard")) for name, data in shards]
    sharded = [(name, text) for name, text in given if text]
    if not sharded:
        return []
    if len(sharded) != len(given):
        unsharded = ", ".join(name for name, text in given if not text)
        return [f"{unsharded}: not a shard, merged with shards"]
    counts = {int(text.split("/")[1]) for _, text in sharded}
    if len(counts) > 1:
        return [f"the shards split the selection differently: {', '.join(t for _, t in sharded)}"]
    (count,) = counts
    indices = [int(text.split("/")[0]) for _, text in sharded]
    problems = []
    missing = sorted(set(range(1, count + 1)) - set(indices))
    if missing:
        problems.append(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{i}/{count}' for i in missing)} "
            "missing: their scenarios did not run"
        )
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        problems.append(f"shard(s) {', '.join(f'{i}/{count}' for i in repeated)} given twice")
    return problems
