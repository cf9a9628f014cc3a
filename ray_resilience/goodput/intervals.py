"""Pure helpers behind `compute_goodput`: step intervals, steady step time, percentiles.

A step interval is a pair of adjacent step events with a higher step and no fault in between; its
compute time excludes the checkpoint blocking inside it. Definitions: docs/design.md, section 9.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import statistics
from collections.abc import Sequence

from ray_resilience.goodput.timeline import CheckpointEvent, RunTimeline, StepEvent


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepInterval:
    """Two step events adjacent in time with no fault between them."""

    start: StepEvent
    end: StepEvent
    blocking_s: float

    @property
    def duration_s(self) -> float:
        return self.end.t - self.start.t

    @property
    def num_steps(self) -> int:
        return self.end.step - self.start.step

    @property
    def compute_s_per_step(self) -> float:
        return max(0.0, self.duration_s - self.blocking_s) / self.num_steps


def sorted_steps(timeline: RunTimeline) -> list[StepEvent]:
    """Step events in time order (progress may be reported in batches, out of order)."""
    return sorted(timeline.steps, key=lambda e: e.t)


def fault_times(timeline: RunTimeline) -> list[float]:
    """Fault times, ascending."""
    return sorted(f.t_fault for f in timeline.faults.values())


def step_intervals(timeline: RunTimeline) -> list[StepInterval]:
    """All step intervals of the run (see the module docstring), in time order."""
    steps, faults = sorted_steps(timeline), fault_times(timeline)
    saves = sorted(timeline.saves, key=lambda e: e.t)
    save_times = [s.t for s in saves]
    intervals = []
    for a, b in itertools.pairwise(steps):
        if b.step <= a.step or _any_between(faults, a.t, b.t):
            continue
        lo, hi = bisect.bisect_right(save_times, a.t), bisect.bisect_right(save_times, b.t)
        blocking = sum(s.blocking_s for s in saves[lo:hi])
        intervals.append(StepInterval(start=a, end=b, blocking_s=blocking))
    return intervals


def steady_step_time(
    intervals: Sequence[StepInterval], first_fault_t: float | None
) -> float | None:
    """Median compute seconds per step before the first fault (else over all intervals)."""
    before = [i for i in intervals if first_fault_t is None or i.end.t <= first_fault_t]
    chosen = before or list(intervals)
    if not chosen:
        return None
    return statistics.median(i.compute_s_per_step for i in chosen)


def full_world_training_s(intervals: Sequence[StepInterval], world_size: int) -> float:
    """Seconds in which all `world_size` ranks were training (see the module docstring)."""
    return sum(
        i.duration_s for i in intervals
        if i.start.world_size == world_size and i.end.world_size == world_size
    )


def first_step_after(steps: Sequence[StepEvent], t: float) -> StepEvent | None:
    """The first step event strictly after `t` (`steps` sorted by time)."""
    index = bisect.bisect_right([e.t for e in steps], t)
    return steps[index] if index < len(steps) else None


def last_commit_at(commits: Sequence[CheckpointEvent], t: float) -> CheckpointEvent | None:
    """The newest checkpoint committed at or before `t`."""
    done = [c for c in commits if c.t <= t]
    return max(done, key=lambda c: c.t) if done else None


def run_end(timeline: RunTimeline) -> tuple[float, int]:
    """(end time, final step): from `run_finished`, else the newest event (a run in progress)."""
    steps = sorted_steps(timeline)
    final_step = timeline.final_step
    if final_step is None:
        final_step = steps[-1].step if steps else timeline.start_step
    if timeline.t_end is not None:
        return timeline.t_end, final_step
    times = [e.t for e in [*timeline.steps, *timeline.saves, *timeline.commits]]
    times += [f.t_detect for f in timeline.faults.values()]
    return max([timeline.t_start or 0.0, *times]), final_step


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation as numpy's default: p50 of [1, 2, 3, 4]
    is 2.5."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _any_between(sorted_times: Sequence[float], lo: float, hi: float) -> bool:
    """Whether some time lies in [lo, hi)."""
    index = bisect.bisect_left(sorted_times, lo)
    return index < len(sorted_times) and sorted_times[index] < hi
