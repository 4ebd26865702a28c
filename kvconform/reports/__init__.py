"""Report writers: each turns a :class:`RunReport` into one file in the report directory.

A writer is any ``(RunReport, Path) -> Path`` callable; :data:`WRITERS` lists
the ones ``kvconform run`` uses, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvconform.model.results import RunReport
from kvconform.reports.html import write_html
from kvconform.reports.json_report import write_json
from kvconform.reports.junit import write_junit
from kvconform.reports.markdown import write_markdown

ReportWriter = Callable[[RunReport, Path], Path]
WRITERS: list[ReportWriter] = [write_json, write_junit, write_markdown, write_html]


def write_reports(report: RunReport, directory: str | Path) -> list[Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [writer(report, directory) for writer in WRITERS]
