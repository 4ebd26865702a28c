"""Where benchmark results go: ``build/bench.json`` and a row in ``docs/benchmarks.md``.

``docs/benchmarks.md`` is shared: other sections may be written by hand (profiles,
before/after notes). This module only ever touches the table under
``## Results``: it appends one dated row after the table's last row, creating
the file or the section when missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvconform.bench.figures import Figure

RESULTS_HEADING = "## Results"

COLUMNS = (
    ("date", "date"),
    ("commit", "commit"),
    ("machine", "cores / load"),
    ("vllm", "vLLM"),
    ("step_overhead_ratio", "step overhead (<= 1.3)"),
    ("import_seconds", "import s"),
    ("suite_seconds", "suite s (<= import + 10)"),
    ("xdist_speedup", "xdist -n 2 vs -n 1 (>= 1)"),
    ("fuzz_examples_per_second", "fuzz ex/s (>= 50)"),
    ("explore_workloads_per_second", "explore wl/CPU s (>= 10)"),
    ("explore_step_ratio", "explore/bare (<= 2)"),
    ("scaling", "scaling spread (<= 1.25)"),
    ("mutation_campaign", "mutation campaign s (<= 1800)"),
)

INTRO = """# Benchmarks

`make bench` (`python -m kvconform.bench`) measures what kvconform adds to the
cost of the vLLM allocator it drives, and writes every figure, with its
details, to `build/bench.json`; each run appends one row to the table below.
What the figures mean, how they are measured and what bounds them is
explained after the table.

"""

TABLE_INTRO = """One row per `make bench` run, newest last. Ratios are measured side by side
in one process (interleaved rounds, median of per-round ratios) and are the
figures to compare; absolute seconds depend on the machine's load at the time
(the load average is in the row) and are noisy. A target met is marked `ok`, a
target missed `MISSED`; `n/a` means the figure was skipped or could not be
measured (the reason is in `build/bench.json`).

"""


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def _cell(figure: Figure | None, digits: int = 2) -> str:
    if not figure or not figure.get("available"):
        return "n/a"
    value = figure["value"]
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    if figure.get("meets_target") is True:
        text += " ok"
    elif figure.get("meets_target") is False:
        text += " MISSED"
    return text


def row(results: dict[str, Any]) -> str:
    machine = results.get("machine", {})
    load = machine.get("load_average") or ["?"]
    cells = {
        "date": results.get("date", "?")[:16].replace("T", " "),
        "commit": str(machine.get("commit") or "?"),
        "machine": f"{machine.get('usable_cores', '?')} / {load[0]}",
        "vllm": str(machine.get("vllm", "?")),
        "step_overhead_ratio": _cell(results.get("step_overhead_ratio")),
        "import_seconds": _cell(results.get("import_seconds"), 1),
        "suite_seconds": _cell(results.get("suite_seconds"), 1),
        "xdist_speedup": _cell(results.get("xdist_speedup")),
        "fuzz_examples_per_second": _cell(results.get("fuzz_examples_per_second"), 0),
        "explore_workloads_per_second": _cell(results.get("explore_workloads_per_second"), 0),
        "explore_step_ratio": _cell(results.get("explore_step_ratio")),
        "scaling": _cell(results.get("scaling")),
        "mutation_campaign": _cell(results.get("mutation_campaign"), 0),
    }
    return "| " + " | ".join(cells[key] for key, _ in COLUMNS) + " |"


def _header() -> list[str]:
    return [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]


def append_row(doc: Path, results: dict[str, Any]) -> None:
    """Append the run's row to the ``## Results`` table of ``doc`` (created if missing)."""
    new_row = row(results)
    if not doc.exists():
        doc.parent.mkdir(parents=True, exist_ok=True)
        text = INTRO + RESULTS_HEADING + "\n\n" + TABLE_INTRO + "\n".join(_header()) + "\n"
        doc.write_text(text + new_row + "\n", encoding="utf-8")
        return
    lines = doc.read_text(encoding="utf-8").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == RESULTS_HEADING)
    except StopIteration:
        lines += [
            "",
            RESULTS_HEADING,
            "",
            *TABLE_INTRO.strip().splitlines(),
            "",
            *_header(),
            new_row,
        ]
        doc.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    section_end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
    )
    table = [i for i in range(start + 1, section_end) if lines[i].lstrip().startswith("|")]
    if table and len(table) >= 2 and lines[table[0]] != _header()[0]:
        # A column was added since the table began: the header grows, older rows keep
        # their cells (Markdown shows the missing ones empty).
        lines[table[0] : table[0] + 2] = _header()
    if table:
        lines.insert(table[-1] + 1, new_row)
    else:
        lines[section_end:section_end] = ["", *_header(), new_row, ""]
    doc.write_text("\n".join(lines) + "\n", encoding="utf-8")
