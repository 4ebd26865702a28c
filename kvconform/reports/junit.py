"""``junit.xml``: one ``<testcase>`` per scenario, for CI test tabs.

Written to the subset of the JUnit format that Buildkite's test analytics and
GitHub's JUnit readers (e.g. ``mikepenz/action-junit-report``) both accept: a
``<testsuites>`` root with one ``<testsuite>`` per scenario file, ``failure``
for nonconformance, ``error`` for scenarios that could not run, ``skipped`` for
known divergences (xfailed) and for scenarios the release does not offer what
they need for (unsupported, with the reason). Input errors become error test
cases of their file.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

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
    if result.line is not None:
        case.set("line", str(result.line))
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
        for result in results:
            _testcase(suite, result, report)
        _count(suite, results)
    errors_by_file: dict[str, list[str]] = defaultdict(list)
    for err in report.input_errors:
        errors_by_file[err.where.file].append(str(err))
    for file, messages in sorted(errors_by_file.items()):
        suite = ET.SubElement(root, "testsuite", name=_suite_name(file))
        case = ET.SubElement(
            suite, "testcase", classname=_suite_name(file), name="load", file=file, time="0"
        )
        error = ET.SubElement(case, "error", message=messages[0][:500], type="input")
        error.text = "\n".join(messages)
        suite.set("tests", "1")
        suite.set("errors", "1")
        suite.set("failures", "0")
        suite.set("skipped", "0")
        suite.set("time", "0")
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in root)))
    path = directory / "junit.xml"
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return path


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
