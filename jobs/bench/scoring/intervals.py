"""Checkpoint intervals from measured costs: the same rule for every tier of every mechanism.

Each tier's interval is Young's sqrt(2 x cost x MTBF), in steps, where the cost is what one save
of that tier costs the run end to end, measured in the mechanism's fault-free calibration run
against its own median step or, where that shows more, against the same mechanism's run without
saves (a background save slows every step around it, which the run's own median hides), and the
MTBF is the plan's (run length / number of faults, every fault counted for every mechanism). An
interval is at most a quarter of the run (a run always keeps some checkpoint).
"""

from __future__ import annotations

import math
import statistics

from ray_resilience.goodput import RunTimeline
from ray_resilience.goodput.intervals import sorted_steps


def young_interval(cost_s: float, step_s: float, max_steps: int, num_faults: int) -> int:
    """Young's optimal interval in steps, between 1 and a quarter of the run."""
    quarter = max(1, max_steps // 4)
    if num_faults == 0 or step_s <= 0:
        return quarter
    mtbf_steps = max_steps / num_faults
    return max(1, min(quarter, round(math.sqrt(2 * (cost_s / step_s) * mtbf_steps))))


def save_costs(timeline: RunTimeline, steady_s: float, baseline_s: float | None = None,
               ) -> tuple[float | None, float | None]:
    """(durable, local) cost per save in a fault-free calibration run.

    Durable: the wall time the run spent beyond `steady_s` (this run's median step, which holds
    any per-step local-tier copy and a share of any background work) per durable save, or, when
    more, beyond the mechanism's step without saves (`baseline_s`, the median step of its run
    that saves nothing) less the local saves' blocking in the same steps, where a background
    save's slowdown of every step it overlaps counts in full. Two runs differ by the machine's
    noise (at the tiny size more than a save costs), so the run's own figure is the floor.
    Local: the mean blocking of a local save (a synchronous copy costs what it blocks).
    """
    steps = sorted_steps(timeline)
    durable = [s for s in timeline.saves if s.tier in (None, "storage")]
    local = [s for s in timeline.saves if s.tier == "local"]
    local_cost = statistics.mean(s.blocking_s for s in local) if local else None
    saved_steps = {s.step for s in durable}
    if len(steps) < 3 or not saved_steps:
        return None, local_cost
    first, last = steps[1], steps[-1]  # the first step holds warm-up
    within = range(first.step, last.step)
    count = sum(1 for s in saved_steps if s in within)
    if not count:
        return None, local_cost
    wall, steps_in = last.t - first.t, last.step - first.step
    excess = wall - steps_in * steady_s
    if baseline_s is not None:  # at least what the run itself shows (runs differ by noise)
        excess = max(excess, wall - steps_in * baseline_s
                     - sum(s.blocking_s for s in local if s.step in within))
    return max(0.0, excess / count), local_cost
