"""``python -m kvconform.peer``: prepare, baseline, map, cover and judge from a shell.

::

    python -m kvconform.peer prepare [--version V]       # fetch tests, plugins, models
    python -m kvconform.peer baseline [--refresh]        # run the selection once (~10 min)
    python -m kvconform.peer coverage --report-dir DIR   # reach map + coverage (~15 min)
    python -m kvconform.peer reaching vllm/v1/core/block_pool.py BlockPool.get_num_free_blocks
    python -m kvconform.peer run [--vllm-src TREE] [--function FILE::QUALNAME ...]

``--reference TREE`` names an unmodified ``--vllm-src``-style tree to baseline
against instead of the installed vLLM. Exit status of ``run``: 0 survived,
1 killed, 3 broken, 4 timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvconform.errors import KvconformError
from kvconform.peer.suite import prepare
from kvconform.peer.verdict import Verdict

_STATUS = {Verdict.SURVIVED: 0, Verdict.KILLED: 1, Verdict.BROKEN: 3, Verdict.TIMEOUT: 4}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvconform.peer", description=__doc__)
    parser.add_argument(
        "--version", help="the vLLM release whose tests to use (default: installed)"
    )
    parser.add_argument("--reference", type=Path, help="an unmodified tree holding vllm/")
    parser.add_argument(
        "--workers", type=int, default=1, help="pytest-xdist processes for baseline and coverage"
    )
    parser.add_argument(
        "--global-cleanup",
        action="store_true",
        help="keep vLLM's teardown after every test (about 10x slower on a CPU)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare")
    commands.add_parser("baseline").add_argument("--refresh", action="store_true")
    cover = commands.add_parser("coverage")
    cover.add_argument("--report-dir", type=Path, required=True)
    reaching = commands.add_parser("reaching")
    reaching.add_argument("file")
    reaching.add_argument("function")
    run = commands.add_parser("run")
    run.add_argument("--vllm-src", type=Path)
    run.add_argument("--function", action="append", default=[], metavar="FILE::QUALNAME")
    run.add_argument("--timeout", type=float, default=600.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        suite = prepare(
            args.version, args.reference, workers=args.workers, global_cleanup=args.global_cleanup
        )
        if args.command == "prepare":
            print(
                f"vLLM {suite.version}: {len(suite.selection())} selected paths under {suite.suite}"
            )
        elif args.command == "baseline":
            made = suite.baseline(refresh=args.refresh)
            print(
                json.dumps(
                    {"files": made.files, "counts": made.counts, "seconds": made.seconds}, indent=1
                )
            )
        elif args.command == "coverage":
            summary = suite.coverage(args.report_dir)
            print(json.dumps(summary.total.to_json()))
        elif args.command == "reaching":
            print("\n".join(suite.tests_reaching(args.file, args.function)))
        else:
            functions = {tuple(f.split("::", 1)) for f in args.function}
            outcome = suite.run(args.vllm_src, {(a, b) for a, b in functions} or None, args.timeout)
            print(outcome)
            return _STATUS[outcome.verdict]
    except KvconformError as exc:
        print(f"kvconform.peer: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
