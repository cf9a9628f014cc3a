"""The benchmark's output: one table, `results.json`, and the comparison pictures.

One row per (mechanism, checkpoint interval). Every number comes from `compute_goodput` on the
run's timeline with the same mechanism's fault-free steady step time, so rows are comparable.
Rows that did not run say why (unavailable, skipped, failed) instead of showing numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ray_resilience.goodput import GoodputReport
from ray_resilience.goodput.plot import plot_comparison

BASELINE = "ray-train"


@dataclasses.dataclass(kw_only=True)
class Row:
    """One (mechanism, interval) result of the benchmark."""

    mechanism: str
    label: str
    """Which interval rule chose it: "best", "quarter", or "given"."""
    checkpoint_interval: int | None
    status: str
    error: str | None = None
    report: GoodputReport | None = None
    report_in_run: GoodputReport | None = None
    """The same run scored with the steady step time of its own fault-free intervals (robust
    when the machine's speed drifts between the reference run and this one)."""
    params_equal: bool | None = None
    """Final parameters bit-equal to the same mechanism's fault-free run (None: not compared)."""
    params_max_abs_diff: float | None = None
    faults_fired: int | None = None
    """Faults of the plan that actually fired (a run can end before a fault's step comes)."""
    faults_planned: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    run_dir: str = ""


def speedups(rows: Sequence[Row]) -> dict[tuple[str, str], float | None]:
    """Ray Train's recovery p50 divided by each row's: "x times faster". Rows are compared with
    Ray Train's row of the same interval label, else with its first row (e.g. torchft, which
    has no checkpoint interval)."""
    base = {r.label: r.report.recovery_p50_s for r in rows
            if r.mechanism == BASELINE and r.report is not None}
    out: dict[tuple[str, str], float | None] = {}
    for row in rows:
        mine = row.report.recovery_p50_s if row.report is not None else None
        theirs = base.get(row.label, next(iter(base.values()), None))
        out[(row.mechanism, row.label)] = theirs / mine if theirs and mine else None
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _params(row: Row) -> str:
    if row.params_equal is None:
        return "-"
    return "bit-equal" if row.params_equal else f"DIFFERS (max {row.params_max_abs_diff:.2e})"


def table(rows: Sequence[Row], title: str) -> Table:
    """The one table the benchmark prints."""
    out = Table(title=title, title_justify="left")
    for header in ("mechanism", "ckpt every", "status", "faults", "wall", "training goodput",
                   "(in-run steady)", "infra goodput",
                   "recovery p50", "recovery max", "steps redone", "p50 vs Ray Train",
                   "final params"):
        out.add_column(header, justify="left" if header == "mechanism" else "right")
    ratios = speedups(rows)
    for row in rows:
        every = ("-" if row.checkpoint_interval is None
                 else f"{row.checkpoint_interval} ({row.label})")
        if row.label == "no checkpoints":
            every = row.label
        report = row.report
        if row.status != "ok" or report is None:
            out.add_row(row.mechanism, every, f"[yellow]{row.status}[/] (see below)",
                        *["-"] * 9, _params(row))
            continue
        ratio = ratios.get((row.mechanism, row.label))
        out.add_row(
            row.mechanism, every, "ok", f"{row.faults_fired}/{row.faults_planned}",
            f"{report.wall_s:.0f} s", _pct(report.training_goodput),
            _pct(row.report_in_run.training_goodput if row.report_in_run else None),
            _pct(report.infra_goodput),
            _sec(report.recovery_p50_s), _sec(report.recovery_max_s),
            str(report.steps_redone_total), "-" if ratio is None else f"{ratio:.1f}x faster",
            _params(row))
    return out


def print_table(rows: Sequence[Row], title: str, console: Console | None = None,
                references: dict[str, dict[str, Any]] | None = None) -> None:
    """The table; each mechanism's fault-free reference (the steady step time its goodput is
    computed with, its save cost); one line per row that did not produce numbers, saying why."""
    console = console or Console(width=200)
    console.print(table(rows, title))
    for name, ref in (references or {}).items():
        blocks = ref.get("save_blocking_s", ref["save_cost_s"])
        console.print(f"  {name}: fault-free steady step {1000 * ref['steady_step_time_s']:.0f} ms,"
                      f" a save costs {1000 * ref['save_cost_s']:.0f} ms"
                      f" (blocks {1000 * blocks:.0f} ms),"
                      f" fault-free wall {ref['wall_s']:.1f} s", markup=False)
    for row in rows:
        if row.status != "ok" or row.report is None:
            console.print(f"  {row.mechanism}: {row.status}: {row.error}", markup=False)


def row_dict(row: Row, ratio: float | None) -> dict[str, Any]:
    data = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)
            if f.name not in ("report", "report_in_run")}
    data["recovery_p50_speedup_vs_ray_train"] = ratio
    data["goodput"] = None if row.report is None else row.report.to_dict(include_timeline=True)
    in_run = row.report_in_run
    data["goodput_in_run_steady"] = None if in_run is None else in_run.to_dict()
    return data


def write_results(out_dir: str, config: dict[str, Any], rows: Sequence[Row],
                  references: dict[str, dict[str, Any]]) -> str:
    """`results.json`: the configuration, the plan, each mechanism's fault-free reference
    (steady step time, save cost, chosen intervals) and every row with its full report."""
    ratios = speedups(rows)
    data = {"config": config, "references": references,
            "rows": [row_dict(r, ratios.get((r.mechanism, r.label))) for r in rows]}
    path = os.path.join(out_dir, "results.json")
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(f"{path}.tmp", path)
    return path


def write_plots(out_dir: str, rows: Sequence[Row]) -> list[str]:
    """One comparison PNG per interval label: step vs wall time, faults marked."""
    paths = []
    for label in dict.fromkeys(r.label for r in rows):
        runs = {f"{r.mechanism} (ckpt every {r.checkpoint_interval})": r.report
                for r in rows if r.label == label and r.report is not None}
        if runs:
            path = os.path.join(out_dir, f"comparison_{label.replace(' ', '_')}.png")
            plot_comparison(runs, path, title=f"recovery benchmark, checkpoint interval: {label}")
            paths.append(path)
    return paths
