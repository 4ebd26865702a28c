"""Plots for the HTML report: blocks held against step, per group, per request.

One figure per KV-cache group of a scenario, with one panel per request: the
floor as a dashed black line, the live ``KVCacheManager`` and the warmup
predictor (and the recorded warmup, where there is one) as lines, the gap
between a party and the floor shaded red wherever the party falls short, and
the offending values at steps where a check failed ringed in red (the same
cells the step table marks). Preemptions and finishes are vertical dotted lines.

matplotlib is optional (``pip install kvconform[report]``): without it the
report still has every table and message, and says the plots are missing.
It is used through its object API with the Agg canvas, so no GUI backend and
no global pyplot state are involved; its cache goes under kvconform's cache.
"""

from __future__ import annotations

import base64
import io
import os
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kvconform.model.observations import Observation, Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import ScenarioResult
from kvconform.paths import cache_dir

# Beyond this many requests a group's figure shows the ones with failures first.
MAX_PANELS = 4
DPI = 96
PALETTE_COLORS = 64
COLORS = {
    Party.LIVE: "#1f5fbf",
    Party.PREDICTED: "#e07b00",
    "predicted_max": "#e07b00",
    Party.WARMUP: "#2a9d4b",
    "floor": "#222222",
    "band": "#f08080",
    "fail": "#d62728",
}


@dataclass(frozen=True)
class GroupPlot:
    group: int
    title: str
    png_base64: str
    requests_hidden: tuple[str, ...]


def missing_reason() -> str | None:
    """Why plots cannot be drawn here, or None when they can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'kvconform[report]')"
    return None


def _new_figure(width: float, height: float) -> Any:
    """A figure on an Agg canvas: no GUI backend, no pyplot state."""
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir("matplotlib")))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def group_plots(result: ScenarioResult, only: Collection[int] | None = None) -> list[GroupPlot]:
    """One PNG (base64) per group of a scenario's trajectory (of the groups in ``only``)."""
    trajectory = result.trajectory
    if trajectory is None or not trajectory.observations:
        return []
    failing: dict[tuple[int, str], set[int]] = defaultdict(set)
    for failure in result.failures:
        if failure.group is not None and failure.request is not None and failure.step is not None:
            failing[(failure.group, failure.request)].add(failure.step)
    return [
        _group_plot(trajectory, group.index, failing)
        for group in trajectory.groups
        if only is None or group.index in only
    ]


def _group_plot(
    trajectory: Trajectory, group: int, failing: dict[tuple[int, str], set[int]]
) -> GroupPlot:
    rows: dict[str, list[Observation]] = defaultdict(list)
    for obs in trajectory.observations:
        if obs.group == group:
            rows[obs.request].append(obs)
    requests = sorted(rows, key=lambda r: (not failing.get((group, r)), list(rows).index(r)))
    shown, hidden = requests[:MAX_PANELS], requests[MAX_PANELS:]
    shown.sort(key=list(rows).index)
    info = trajectory.groups[group]
    figure = _new_figure(7.6, 0.6 + 1.9 * len(shown))
    axes = figure.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    last_step = max(o.step for o in trajectory.observations)
    for ax, request in zip(axes, shown, strict=True):
        _panel(ax, trajectory, rows[request], request, failing.get((group, request), set()))
        ax.set_xlim(-0.5, last_step + 0.5)
    axes[-1].set_xlabel("step")
    legend: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    figure.legend(
        list(legend.values()),
        list(legend),
        loc="upper center",
        ncol=len(legend),
        frameon=False,
        fontsize=8,
        bbox_to_anchor=(0.5, 1.0),
    )
    title = f"g{info.index} {info.label} (block_size {info.block_size})"
    # Fixed margins in inches: tight_layout would cost as much as the drawing.
    height = 0.6 + 1.9 * len(shown)
    figure.subplots_adjust(
        left=0.11, right=0.985, top=1 - 0.32 / height, bottom=0.45 / height, hspace=0.18
    )
    return GroupPlot(
        group,
        title,
        base64.b64encode(_png(figure)).decode("ascii"),
        tuple(hidden),
    )


def _png(figure: Any) -> bytes:
    """The figure as a palette PNG: a plot has a few colours, and 64 keep its antialiased
    lines while the file shrinks to about a third (report.html's size budget)."""
    from PIL import Image  # matplotlib's own dependency

    raw = io.BytesIO()
    figure.savefig(raw, format="png", dpi=DPI)
    raw.seek(0)
    with Image.open(raw) as image:
        paletted = image.convert("RGB").quantize(colors=PALETTE_COLORS)
    out = io.BytesIO()
    paletted.save(out, format="png", optimize=True)
    return out.getvalue()


def _panel(
    ax: Any, trajectory: Trajectory, rows: list[Observation], request: str, bad: set[int]
) -> None:
    steps = [o.step for o in rows]
    floor = [o.floor for o in rows]
    # Drawn above the parties' lines: where a party sits exactly on the floor the
    # dashes stay visible on top of it.
    ax.plot(steps, floor, "--", color=COLORS["floor"], linewidth=1.2, label="floor", zorder=4)
    series = [(Party.LIVE, "live KVCacheManager", "o")]
    if Party.PREDICTED in trajectory.parties:
        series.append((Party.PREDICTED, "predictor (this step)", "x"))
    if any(o.warmup is not None for o in rows):
        series.append((Party.WARMUP, "recorded warmup", "s"))
    short_label = "short of the floor"
    for attr, label, marker in series:
        values = [getattr(o, attr) for o in rows]
        if all(v is None for v in values):
            continue
        ys = [float("nan") if v is None else float(v) for v in values]
        ax.plot(
            steps,
            ys,
            "-",
            marker=marker,
            markersize=3.5,
            linewidth=1.3,
            color=COLORS[attr],
            label=label,
        )
        short = [
            (o.step, v, o.floor)
            for o, v in zip(rows, values, strict=True)
            if v is not None and v < o.floor
        ]
        if short:
            # A bar from the party's count up to the floor: the missing blocks.
            ax.bar(
                [x for x, _, _ in short],
                [f - v for _, v, f in short],
                bottom=[v for _, v, _ in short],
                width=0.5,
                color=COLORS["band"],
                alpha=0.85,
                linewidth=0,
                zorder=1,
                label=short_label,
            )
            short_label = "_nolegend_"
    maxima = [o.predicted_max for o in rows]
    if any(m is not None and m != o.predicted for m, o in zip(maxima, rows, strict=True)):
        ax.plot(
            steps,
            [float("nan") if m is None else m for m in maxima],
            ":",
            color=COLORS["predicted_max"],
            linewidth=1.2,
            label="predictor (running max)",
        )
    for event in trajectory.events:
        if event.request == request:
            ax.axvline(event.step, color="#888888", linestyle=":", linewidth=1)
            ax.annotate(
                event.kind,
                (event.step, 0),
                xytext=(2, 2),
                textcoords="offset points",
                fontsize=7,
                color="#555555",
            )
    # Ring the offending values at the steps where a check failed: a party below
    # the floor, or the live count where it differs from the predictor.
    ring_x: list[int] = []
    ring_y: list[int] = []
    for obs in rows:
        if obs.step not in bad:
            continue
        for attr, _, _ in series:
            value = getattr(obs, attr)
            if value is not None and value < obs.floor:
                ring_x.append(obs.step)
                ring_y.append(value)
        if obs.predicted_max is not None and obs.live is not None and obs.live != obs.predicted_max:
            ring_x.append(obs.step)
            ring_y.append(obs.live)
        if not ring_x or ring_x[-1] != obs.step:
            ring_x.append(obs.step)
            ring_y.append(obs.live if obs.live is not None else obs.floor)
    if ring_x:
        ax.scatter(
            ring_x,
            ring_y,
            s=90,
            facecolors="none",
            edgecolors=COLORS["fail"],
            linewidths=1.6,
            zorder=5,
            label="check failed here",
        )
    ax.set_ylabel(f"request {request}\nblocks", fontsize=8)
    tallest = max(
        [o.floor for o in rows]
        + [
            v
            for o in rows
            for v in (o.live, o.predicted, o.predicted_max, o.warmup)
            if v is not None
        ]
    )
    ax.set_ylim(0, tallest * 1.15 + 0.5)
    ax.tick_params(labelsize=7)
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.xaxis.get_major_locator().set_params(integer=True)
