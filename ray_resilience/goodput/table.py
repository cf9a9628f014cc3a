"""Plain-text rendering of a GoodputReport (goodput.txt, logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray_resilience.goodput.report import FaultRecovery, GoodputReport

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("fault", "fault_id"), ("cause", "cause"), ("step", "step_at_fault"),
    ("at s", "t_fault_s"), ("detect", "detect_s"), ("teardown", "teardown_s"),
    ("rdzv", "rendezvous_s"), ("load", "checkpoint_load_s"), ("tier", "checkpoint_tier"),
    ("1st step", "first_step_s"), ("recovery", "recovery_s"), ("reached", "step_reached"),
    ("resumed", "resumed_from_step"),
    ("redone", "steps_redone"), ("ckpt age", "checkpoint_age_steps"),
)


def pct(value: float | None) -> str:
    """A fraction as a percentage, "n/a" when unknown."""
    return "n/a" if value is None else f"{100.0 * value:.1f}%"


def secs(value: float | None) -> str:
    """Seconds with a unit, "n/a" when unknown."""
    return "n/a" if value is None else f"{value:.2f}s"


def format_table(report: GoodputReport) -> str:
    """The summary lines, then one row per fault."""
    steady = secs(report.steady_step_time_s)
    lines = [
        f"run: {report.wall_s:.1f}s wall, steps {report.start_step}->{report.final_step}, "
        f"world size {report.world_size}",
        f"training goodput  {pct(report.training_goodput):>7}   "
        f"(steps x steady step time {steady} [{report.steady_step_time_source}] / wall)",
        f"infra goodput     {pct(report.infra_goodput):>7}   "
        f"(full world size training {report.full_world_training_s:.1f}s / wall)",
        f"checkpoints       {report.num_checkpoints_saved} saved, "
        f"{report.num_checkpoints_committed} committed, "
        f"{report.num_local_snapshots} local snapshots; "
        f"{report.checkpoint_blocking_s:.2f}s blocking training "
        f"({report.local_snapshot_blocking_s:.2f}s of it local)",
        f"recovery          p50 {secs(report.recovery_p50_s)}  p99 {secs(report.recovery_p99_s)}"
        f"  max {secs(report.recovery_max_s)}  over {len(report.faults)} faults; "
        f"{report.steps_redone_total} steps redone",
        f"AWS/NVRx formulas checkpoint efficiency {pct(report.aws_checkpoint_efficiency)}, "
        f"training goodput {pct(report.aws_training_goodput)} "
        "(redone steps count as useful; not comparable across mechanisms)",
    ]
    if report.faults:
        lines += ["", *_fault_rows(report.faults)]
    return "\n".join(lines) + "\n"


def _fault_rows(faults: tuple[FaultRecovery, ...]) -> list[str]:
    rows = [[title for title, _ in _COLUMNS]]
    for fault in faults:
        rows.append([_cell(getattr(fault, attr)) for _, attr in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
