"""vLLM's defaults per release, as vLLM's config says them: the table of docs/vllm-defaults.md.

A scenario that leaves a setting out runs vLLM's default for the release under test
(:mod:`kvconform.model.settings`). Which default that is belongs to vLLM, not to
kvconform's docs: each row of the table is generated from the loaded release's config
classes (:meth:`kvconform.oracles.vllm.Vllm.default_settings`), one release per process
(``--vllm-release``: a tree cached under ``~/.cache/kvconform``), and
``tests/test_vllm_defaults.py`` regenerates the installed release's row and holds it
to the committed one.

    python -m kvconform.harness.defaults                    # the installed vLLM's row
    python -m kvconform.harness.defaults --write 0.28.0 0.29.0 ...   # rewrite the table
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvconform.model.settings import SETTINGS

# In a checkout (the table is the repository's, not an installed package's).
TABLE_FILE = Path(__file__).resolve().parents[2] / "docs" / "vllm-defaults.md"
BEGIN, END = "<!-- defaults table: begin -->", "<!-- defaults table: end -->"


def shown(value: Any) -> str:
    """A default as a scenario would write it (``null`` for None)."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def header() -> list[str]:
    names = list(SETTINGS)
    return [
        "| release | " + " | ".join(f"`{name}`" for name in names) + " |",
        "|---|" + "---|" * len(names),
    ]


def row(release: str, defaults: Mapping[str, Any]) -> str:
    """One release's row; a setting the release does not have is ``—``."""
    cells = [shown(defaults[name]) if name in defaults else "—" for name in SETTINGS]
    return f"| {release} | " + " | ".join(cells) + " |"


def committed_rows(text: str) -> dict[str, str]:
    """The table's rows in ``text`` (docs/vllm-defaults.md), by release."""
    inside = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    rows = {}
    for line in inside.splitlines():
        match = re.match(r"\| (\d+\.\d+\.\d+\S*) \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def loaded_row(src: str | None = None, release: str | None = None) -> tuple[str, str]:
    """(release, row) of the vLLM a run would load: the installed one, a tree or a release."""
    from kvconform.harness.session import load_vllm

    vllm = load_vllm(src, release)
    return vllm.version, row(vllm.version, vllm.default_settings())


def rewrite(releases: Sequence[str], path: Path = TABLE_FILE) -> None:
    """The table in ``path`` with a row per release, each from its own process."""
    rows = []
    for release in releases:
        done = subprocess.run(
            [sys.executable, "-m", "kvconform.harness.defaults", "--vllm-release", release,
             "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(done.stdout.strip().splitlines()[-1])["row"])
    text = path.read_text(encoding="utf-8")
    table = "\n".join([BEGIN, *header(), *rows, END])
    start, end = text.index(BEGIN), text.index(END) + len(END)
    path.write_text(text[:start] + table + text[end:], encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvconform.harness.defaults")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--vllm-src", metavar="DIR")
    group.add_argument("--vllm-release", metavar="VER")
    group.add_argument("--write", nargs="+", metavar="VER", help=f"rewrite {TABLE_FILE.name}")
    parser.add_argument("--json", action="store_true", help="the row as JSON (for --write)")
    args = parser.parse_args(argv)
    if args.write:
        rewrite(args.write)
        print(f"wrote {TABLE_FILE}")
        return 0
    release, line = loaded_row(args.vllm_src, args.vllm_release)
    print(json.dumps({"release": release, "row": line}) if args.json else line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
