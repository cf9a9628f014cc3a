"""One yardstick for every mechanism: the fastest fault-free steady step of any mechanism in the
same invocation.

- steady step of a fault-free run: the median wall time per step over its step intervals
  (consecutive step events at full world size, no fault between). Nothing is subtracted: a
  per-step cost a mechanism pays (Ray actor hosting, background threads, a local-tier copy) is
  part of its step.
- training goodput = useful steps x yardstick / wall. A mechanism whose every step is slower
  loses goodput for it, as do start-up, checkpoints, detection, recovery and redone steps. A
  step trained by part of the world (torchft's survivors while a replica is down) did that
  part of the work: it counts as world/world size of a step.
- goodput after start-up: the same from the first completed step to the end.
- infra goodput per slot: full-world training time / wall x world size / allocated slots
  (world size plus idle spares).
- time to N steps = wall (launch to the last step); start-up = launch to the first step.
- recovery = fault to the next completed step; back to full world = fault to the first step
  the whole world trained, at or after that one. They differ only where part of the world
  trains on through a fault (torchft's survivors: their next step ends the recovery, the
  restarted replica's first step with them the way back).
- the in-run figure (each run measured against its own fault-free intervals) is a diagnostic.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping

from ray_resilience.goodput import RunTimeline, compute_goodput
from ray_resilience.goodput.intervals import full_world_training_s, sorted_steps, step_intervals


def steady_step_s(timeline: RunTimeline) -> float | None:
    """Median wall seconds per step over full-world fault-free step intervals."""
    per_step = [i.duration_s / i.num_steps for i in step_intervals(timeline)
                if i.start.world_size == i.end.world_size == timeline.world_size]
    return statistics.median(per_step) if per_step else None


def yardstick(steady_by_mechanism: Mapping[str, float | None]) -> tuple[str, float] | None:
    """(mechanism, seconds) of the fastest fault-free steady step."""
    known = {m: s for m, s in steady_by_mechanism.items() if s}
    if not known:
        return None
    best = min(known, key=lambda m: (known[m], m))
    return best, known[best]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunScore:
    """One run scored with the shared yardstick. Fractions in 0..1, times in seconds."""

    wall_s: float
    final_step: int
    useful_steps: float
    startup_s: float | None
    training_goodput: float | None
    goodput_after_startup: float | None
    infra_goodput_per_slot: float | None
    in_run_goodput: float | None
    """Diagnostic: against the run's own fault-free intervals, not the yardstick."""
    steady_step_s: float | None
    recovery_s: dict[str, list[float]]
    """Fault kind -> recovery times (fault to the first completed step after it)."""
    recovery_total_s: float
    full_world_back_s: dict[str, list[float]]
    """Fault kind -> fault to the first full-world step at or after its recovery's step."""
    steps_redone: int
    faults: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def useful_steps(timeline: RunTimeline) -> float:
    """Steps of work the run kept: each step up to the final one, at the world size of its last
    completion, as a fraction of the full world."""
    last_world: dict[int, int] = {}
    for event in sorted_steps(timeline):
        last_world[event.step] = event.world_size
    final = timeline.final_step if timeline.final_step is not None else max(last_world, default=0)
    world = timeline.world_size or 1
    return sum(min(w, world) / world for s, w in last_world.items()
               if timeline.start_step < s <= final)


def score_run(timeline: RunTimeline, yardstick_s: float | None, *, num_spares: int = 0) -> RunScore:
    report = compute_goodput(timeline)
    steps = sorted_steps(timeline)
    t_start = timeline.t_start or 0.0
    useful = useful_steps(timeline)
    startup = steps[0].t - t_start if steps else None
    after = (report.wall_s - startup) if startup is not None else None
    world = timeline.world_size
    full = full_world_training_s(step_intervals(timeline), world)
    recovery: dict[str, list[float]] = {}
    back: dict[str, list[float]] = {}
    for fault in report.faults:
        if fault.recovery_s is None:
            continue
        kind = fault.kind or fault.cause
        recovery.setdefault(kind, []).append(fault.recovery_s)
        t_fault = timeline.faults[fault.fault_id].t_fault
        t_first = t_fault + fault.recovery_s - 1e-6  # the recovery's step itself counts
        whole = next((e for e in steps
                      if e.t >= t_first and e.world_size >= timeline.world_size), None)
        if whole is not None:
            back.setdefault(kind, []).append(whole.t - t_fault)
    in_run = compute_goodput(timeline, steady_window="run").training_goodput
    return RunScore(
        wall_s=report.wall_s, final_step=report.final_step, useful_steps=useful, startup_s=startup,
        training_goodput=_share(useful * yardstick_s, report.wall_s) if yardstick_s else None,
        goodput_after_startup=(_share((useful - 1) * yardstick_s, after)
                               if yardstick_s and after else None),
        infra_goodput_per_slot=_share(full * world, report.wall_s * (world + num_spares)),
        in_run_goodput=in_run, steady_step_s=steady_step_s(timeline), recovery_s=recovery,
        recovery_total_s=sum(sum(v) for v in recovery.values()), full_world_back_s=back,
        steps_redone=report.steps_redone_total, faults=len(report.faults))


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None
