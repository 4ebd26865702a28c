"""``python -m kvconform.upstream``: ``make upstream-check`` (see :mod:`kvconform.upstream`).

::

    python -m kvconform.upstream [--finding N ...] [--release V ...] [--work DIR]
                                 [--no-whole-selection]

Exit status 0 when every step holds, 1 when one does not, 2 for bad input, 3 when
vLLM or its tests could not be had.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kvconform.errors import KvconformError
from kvconform.upstream.catalogue import CATALOGUE, load_catalogue
from kvconform.upstream.checking import check

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvconform.upstream", description=__doc__)
    parser.add_argument("--finding", type=int, action="append", help="only this finding")
    parser.add_argument(
        "--release", action="append", help="only the entries made on this vLLM release"
    )
    parser.add_argument("--work", type=Path, help="where the test trees and fixed trees go")
    parser.add_argument(
        "--no-whole-selection",
        action="store_true",
        help="skip the run of the whole green selection with every fix applied",
    )
    parser.add_argument("--catalogue", default=CATALOGUE, help="relative to the repository")
    args = parser.parse_args(argv)
    try:
        catalogue = load_catalogue(ROOT, args.catalogue)
        with tempfile.TemporaryDirectory(prefix="kvconform-upstream-") as tmp:
            work = args.work or Path(tmp)
            steps = check(
                catalogue,
                work,
                set(args.finding) if args.finding else None,
                only_releases=set(args.release) if args.release else None,
                whole_selection=not args.no_whole_selection,
                say=lambda line: print(line, flush=True),
            )
    except KvconformError as exc:
        print(f"kvconform.upstream: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    failed = [s for s in steps if not s.ok]
    print(f"upstream-check: {len(steps) - len(failed)} of {len(steps)} steps hold")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
