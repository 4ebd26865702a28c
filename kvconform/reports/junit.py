"""``junit.xml``: one ``<testcase>`` per scenario, for CI test tabs.

Written to the subset of the JUnit format that Buildkite's test analytics and
GitHub's JUnit readers (e.g. ``mikepenz/action-junit-report``) both accept: a
``<testsuites>`` root with one ``<testsuite>`` per scenario file, ``failure``
for nonconformance, ``error`` for scenarios that could not run, ``skipped`` for
known divergences (xfailed) and for scenarios the release does not offer what
they need for (unsupported, with the reason). Input errors become error test
cases of their file, one per error, each at its line. A failing testcase's
``line`` is that of the step its first failure happened at (a CI annotation then
points at the step, not at the scenario's first line); every suite carries the
vLLM version, source and the run's checks as ``<properties>``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from kvconform.errors import ScenarioError
from kvconform.model.results import RunReport, ScenarioResult, Verdict


def _suite_name(file: str) -> str:
    return file.removesuffix(".yaml").removesuffix(".yml").replace("/", ".")


def _testcase(suite: ET.Element, result: ScenarioResult, report: RunReport) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        classname=_suite_name(result.file),
        name=result.id,
        file=result.file,
        time=f"{result.duration:.6f}",
    )
    step_lines = [f.line for f in result.failures if f.line is not None]
    line = step_lines[0] if step_lines else result.line
    if line is not None:
        case.set("line", str(line))
    rerun = f"\n\nRerun: {report.rerun_command(result)}"
    if result.verdict is Verdict.FAILED:
        text = "\n".join(f"[{f.check}] {f.message}" for f in result.failures)
        failure = ET.SubElement(
            case, "failure", message=result.headline()[:500], type=result.failures[0].check
        )
        failure.text = text + rerun
    elif result.verdict is Verdict.ERROR:
        error = ET.SubElement(
            case,
            "error",
            message=(result.error or "")[:500],
            type=str(result.error_kind.value if result.error_kind else "error"),
        )
        error.text = (result.error or "") + rerun
    elif result.verdict is Verdict.XFAILED:
        ET.SubElement(case, "skipped", message=f"known divergence (xfail): {result.expectation}")
    elif result.verdict is Verdict.SKIPPED:
        ET.SubElement(case, "skipped", message=f"skipped: {result.skip_reason}")
    elif result.verdict is Verdict.UNSUPPORTED:
        skipped = ET.SubElement(
            case, "skipped", message=f"unsupported: {result.error or ''}"[:500], type="unsupported"
        )
        skipped.text = result.error or ""
    elif result.verdict is Verdict.XPASSED:
        out = ET.SubElement(case, "system-out")
        out.text = f"XPASS: listed as a known divergence ({result.expectation}) but conforms now"


def write_junit(report: RunReport, directory: Path) -> Path:
    by_file: dict[str, list[ScenarioResult]] = defaultdict(list)
    for result in report.results:
        by_file[result.file].append(result)
    root = ET.Element("testsuites", name="kvconform", time=f"{report.duration:.3f}")
    for file, results in sorted(by_file.items()):
        suite = ET.SubElement(root, "testsuite", name=_suite_name(file))
        _properties(suite, report)
        for result in results:
            _testcase(suite, result, report)
        _count(suite, results)
    errors_by_file: dict[str, list[ScenarioError]] = defaultdict(list)
    for err in report.input_errors:
        errors_by_file[err.where.file].append(err)
    for file, errors in sorted(errors_by_file.items()):
        suite = ET.SubElement(root, "testsuite", name=_suite_name(file))
        _properties(suite, report)
        for err in errors:
            line = err.where.line
            case = ET.SubElement(
                suite,
                "testcase",
                classname=_suite_name(file),
                name="load" if line is None else f"load (line {line})",
                file=file,
                time="0",
            )
            if line is not None:
                case.set("line", str(line))
            error = ET.SubElement(case, "error", message=str(err)[:500], type="input")
            error.text = str(err)
        suite.set("tests", str(len(errors)))
        suite.set("errors", str(len(errors)))
        suite.set("failures", "0")
        suite.set("skipped", "0")
        suite.set("time", "0")
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in root)))
    path = directory / "junit.xml"
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


def _properties(suite: ET.Element, report: RunReport) -> None:
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("vllm_version", report.vllm_version or "unavailable"),
        ("vllm_source", report.vllm_release or report.vllm_source or "-"),
        ("checks", ",".join(report.checks)),
    ):
        ET.SubElement(properties, "property", name=name, value=value)


def _count(suite: ET.Element, results: list[ScenarioResult]) -> None:
    suite.set("tests", str(len(results)))
    suite.set("failures", str(sum(r.verdict is Verdict.FAILED for r in results)))
    suite.set("errors", str(sum(r.verdict is Verdict.ERROR for r in results)))
    suite.set(
        "skipped",
        str(
            sum(
                r.verdict in (Verdict.XFAILED, Verdict.SKIPPED, Verdict.UNSUPPORTED)
                for r in results
            )
        ),
    )
    suite.set("time", f"{sum(r.duration for r in results):.6f}")
