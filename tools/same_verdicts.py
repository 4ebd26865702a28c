"""Compare the verdicts of two runs, scenario id by scenario id.

    python tools/same_verdicts.py OLD/report.json NEW/report.json

Exits 0 when every scenario id has the same verdict in both reports (and both ran
the same ids), 1 otherwise, listing the differences. Used to show that a change
of the harness's structure leaves the corpus's verdicts as they were.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def verdicts(report: Path) -> dict[str, str]:
    data = json.loads(report.read_text())
    return {s["id"]: s["verdict"] for s in data["scenarios"]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    old, new = (verdicts(Path(a)) for a in argv)
    differ = sorted(
        (sid, old.get(sid, "-"), new.get(sid, "-"))
        for sid in old.keys() | new.keys()
        if old.get(sid) != new.get(sid)
    )
    for sid, before, after in differ:
        print(f"{sid}: {before} -> {after}")
    print(f"{len(old)} and {len(new)} scenarios; {len(differ)} verdicts differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
