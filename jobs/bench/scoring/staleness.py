"""Checkpoint staleness: at each completed step, how old the newest durable checkpoint is.

Blocking says what a save costs the training thread; staleness says what a failure at that
moment would cost: the steps (and seconds of training) since the state the newest durable
checkpoint holds. A method that drops saves while one is in flight blocks less and goes staler.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .stats import percentile


def staleness(steps: Sequence[tuple[int, float]], commits: Sequence[tuple[int, float]],
              t_start: float, base_step: int = 0) -> list[tuple[int, float]]:
    """(age in steps, age in seconds) at each step; `steps` and `commits` are (step, time).

    The age counts from the state the checkpoint holds (its step, completed at that step's
    time); before any commit, from `base_step` at `t_start` (0: a restart from scratch; else
    the checkpoint in place when timing began).
    """
    step_time = dict(steps)
    done = sorted((t, s) for s, t in commits)
    done_times = [t for t, _ in done]
    newest_by_index, best = [], base_step
    for _, s in done:
        best = max(best, s)
        newest_by_index.append(best)
    ages = []
    for step, t in sorted(steps, key=lambda x: x[1]):
        index = bisect.bisect_right(done_times, t)
        held = newest_by_index[index - 1] if index else base_step
        ages.append((step - held, t - step_time.get(held, t_start)))
    return ages


def staleness_summary(ages: Sequence[tuple[int, float]]) -> dict[str, float | None]:
    steps = [a for a, _ in ages]
    seconds = [s for _, s in ages]
    return {"steps_median": percentile(steps, 50), "steps_p99": percentile(steps, 99),
            "steps_max": max(steps, default=None), "seconds_median": percentile(seconds, 50),
            "seconds_p99": percentile(seconds, 99)}
