"""The nightly's summary: what ran against which vLLM, each part's status, and what to bisect.

    python tools/nightly_summary.py REPORT_DIR [--part NAME=STATUS ...] [--wall S]
                                    [--scenarios PATH ...] [--vllm-src DIR] [--good COMMIT]
                                    [--bad COMMIT]

Reads REPORT_DIR/report.json (a corpus run's, or ``kvconform merge``'s) and writes
REPORT_DIR/nightly.txt (also printed): the vLLM, torch and device, the verdict counts, each
part's exit status and the wall time. When the corpus did not conform (exit 1) it adds the
``kvconform bisect --repo`` command that bisects what this nightly judged (its scenarios,
checks and expectation options; ``kvconform.bisect.summary.nightly_bisect_command``),
between ``--good`` (the last green nightly's vLLM commit; default ``NIGHTLY_GOOD``) and
the commit under test
(``--bad``, which a CI job knows; else the HEAD of ``--vllm-src`` when it is a git
checkout; else the commit its vLLM version names),
and appends the same to REPORT_DIR/summary.md, which the CI recipes show on the build page.
Needs kvconform only (no vLLM): the CI's merge step runs it in the light install.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvconform.bisect.summary import nightly_bisect_command  # noqa: E402


def checkout_head(src: str | None) -> str | None:
    if not src:
        return None
    done = subprocess.run(
        ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def summary_lines(report: dict, args: argparse.Namespace) -> list[str]:
    vllm = report.get("vllm") or {}
    counts = ", ".join(f"{v} {k}" for k, v in (report.get("counts") or {}).items() if v)
    lines = [
        f"vLLM {vllm.get('version')} ({vllm.get('source')}), torch {report.get('torch')}, "
        f"device {report.get('device')}, python {report.get('python')}",
        f"scenarios: {counts or 'none'}; exit {report.get('exit_status')}",
    ]
    parts = "; ".join(f"{name} exit {status}" for name, status in args.part)
    if parts or args.wall is not None:
        lines.append(parts + (f"; wall {args.wall} s" if args.wall is not None else ""))
    if report.get("exit_status") == 1:
        command = nightly_bisect_command(
            report,
            args.scenarios,
            repo=args.vllm_src,
            good=args.good,
            bad=args.bad or checkout_head(args.vllm_src),
        )
        lines += [
            "bisect what this nightly judged (--good: the last green nightly's vLLM commit, "
            "--bad: this one's; VLLM_CHECKOUT: a vLLM clone; docs/bisect.md):",
            f"  {command}",
        ]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--part", action="append", default=[], metavar="NAME=STATUS",
                        type=lambda text: tuple(text.split("=", 1)))  # fmt: skip
    parser.add_argument("--wall", type=int)
    # The defaults are the nightly's environment (tools/nightly.sh, the CI recipes).
    scenarios = os.environ.get("KVCONFORM_SCENARIOS", "").split() or ["scenarios"]
    parser.add_argument("--scenarios", nargs="+", default=scenarios, metavar="PATH")
    parser.add_argument("--vllm-src", metavar="DIR")
    parser.add_argument("--good", metavar="COMMIT", default=os.environ.get("NIGHTLY_GOOD") or None)
    parser.add_argument("--bad", metavar="COMMIT")
    args = parser.parse_args(argv)
    report_file = args.report_dir / "report.json"
    if report_file.is_file():
        report = json.loads(report_file.read_text(encoding="utf-8"))
    else:
        report = {"counts": {}, "exit_status": None}  # the corpus was not among the parts
    lines = summary_lines(report, args)
    text = "\n".join(lines) + "\n"
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "nightly.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    summary = args.report_dir / "summary.md"
    bisect = [line for line in lines if line.startswith("  kvconform bisect ")]
    if bisect and summary.is_file():
        with summary.open("a", encoding="utf-8") as out:
            out.write(
                "\n## Bisect what this nightly judged\n\n"
                "`--good`: the last green nightly's vLLM commit; `--bad`: this one's; "
                "`VLLM_CHECKOUT`: a clone of vLLM.\n\n"
                f"```\n{bisect[0].strip()}\n```\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
