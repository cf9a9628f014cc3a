"""PNG pictures of runs: one run's timeline, and several mechanisms side by side. Drawn on the
Agg canvas without pyplot, so headless, thread-safe, and the user's matplotlib state is
untouched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ray_resilience.goodput.report import compute_goodput
from ray_resilience.goodput.table import pct, secs
from ray_resilience.goodput.timeline import RECOVERY_PHASES, RunTimeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from ray_resilience.goodput.report import GoodputReport

TimelineLike = Union[RunTimeline, "GoodputReport"]

_PHASE_COLORS = dict(
    zip(RECOVERY_PHASES, ("#f4a261", "#e76f51", "#9b5de5", "#2a9d8f", "#8ab17d"), strict=True))
_FAULT_COLOR = "#d62828"
_COMMIT_COLOR = "#1d3557"


def plot_timeline(timeline_or_report: TimelineLike, path: str, *, title: str | None = None) -> str:
    """Step vs wall time for one run (faults, recovery phases, commits); writes a PNG to `path`."""
    timeline, report = _split(timeline_or_report)
    figure = Figure(figsize=(11, 5.5), dpi=110)
    ax = figure.add_subplot()
    t0 = timeline.t_start or 0.0
    xs, ys = _curve(timeline)
    ax.plot(xs, ys, color="#264653", linewidth=1.4, label="completed step")
    _shade_recoveries(ax, timeline, t0)
    _mark_faults(ax, timeline, t0, color=_FAULT_COLOR, labels=True)
    commits = [(c.t - t0, c.step) for c in timeline.commits]
    if commits:
        ax.scatter(*zip(*commits, strict=True), marker="|", s=140, color=_COMMIT_COLOR, zorder=3)
    handles = [Line2D([], [], color="#264653", label="completed step"),
               Line2D([], [], color=_FAULT_COLOR, linestyle="--", label="fault"),
               Line2D([], [], color=_COMMIT_COLOR, marker="|", linestyle="", markersize=12,
                      label="checkpoint committed")]
    handles += [Patch(color=c, alpha=0.35, label=p) for p, c in _PHASE_COLORS.items()]
    ax.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.9)
    ax.set_title(title or _summary(report), fontsize=10)
    _finish(ax)
    return _save(figure, path)


def plot_comparison(
    runs: Mapping[str, TimelineLike], path: str, *, title: str | None = None
) -> str:
    """Step vs wall time of several mechanisms overlaid, each with its faults in its own colour."""
    if not runs:
        raise ValueError("runs={} is empty; pass {mechanism_name: timeline or report}.")
    figure = Figure(figsize=(11, 5.5), dpi=110)
    ax = figure.add_subplot()
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (name, item) in enumerate(runs.items()):
        timeline, report = _split(item)
        color = colors[index % len(colors)]
        xs, ys = _curve(timeline)
        label = name if report is None else f"{name}: {_summary(report)}"
        ax.plot(xs, ys, color=color, linewidth=1.4, label=label)
        _mark_faults(ax, timeline, timeline.t_start or 0.0, color=color, labels=False)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    ax.set_title(title or "completed step vs wall time (dashed: faults)", fontsize=10)
    _finish(ax)
    return _save(figure, path)


def _split(item: TimelineLike) -> tuple[RunTimeline, GoodputReport | None]:
    if isinstance(item, RunTimeline):
        return item, compute_goodput(item) if item.t_start is not None else None
    if item.timeline is None:
        raise ValueError("the GoodputReport has no timeline; pass the RunTimeline instead.")
    return item.timeline, item


def _curve(timeline: RunTimeline) -> tuple[list[float], list[float]]:
    """(seconds since start, step) from (0, start_step), with a gap (NaN) at each fault."""
    t0 = timeline.t_start or 0.0
    fault_ts = sorted(f.t_fault for f in timeline.faults.values())
    xs, ys = [0.0], [float(timeline.start_step)]
    for event in sorted(timeline.steps, key=lambda e: e.t):
        if fault_ts and fault_ts[0] <= event.t:
            while fault_ts and fault_ts[0] <= event.t:
                fault_ts.pop(0)
            xs.append(math.nan)
            ys.append(math.nan)
        xs.append(event.t - t0)
        ys.append(float(event.step))
    return xs, ys


def _shade_recoveries(ax: Axes, timeline: RunTimeline, t0: float) -> None:
    for fault in timeline.faults.values():
        for phase in fault.phases:
            ax.axvspan(phase.t_start - t0, phase.t_end - t0, color=_PHASE_COLORS[phase.phase],
                       alpha=0.35, linewidth=0)


def _mark_faults(ax: Axes, timeline: RunTimeline, t0: float, *, color: str, labels: bool) -> None:
    for fault in timeline.faults.values():
        x = fault.t_fault - t0
        ax.axvline(x, color=color, linestyle="--", linewidth=1.0, alpha=0.8)
        if labels:
            ax.annotate(f"{fault.cause} (rank {fault.rank}, step {fault.step_at_fault})",
                        (x, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                        va="bottom", ha="right", fontsize=7, color=color)


def _summary(report: GoodputReport | None) -> str:
    if report is None:
        return "run timeline"

    return (f"training goodput {pct(report.training_goodput)}, infra goodput "
            f"{pct(report.infra_goodput)}, recovery p50 {secs(report.recovery_p50_s)}, "
            f"{report.steps_redone_total} steps redone")


def _finish(ax: Axes) -> None:
    ax.set_xlabel("wall time since run start (s)")
    ax.set_ylabel("completed step")
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)


def _save(figure: Figure, path: str) -> str:
    figure.tight_layout()
    FigureCanvasAgg(figure).print_png(path)
    return path
