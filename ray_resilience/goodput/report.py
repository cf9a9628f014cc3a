"""`compute_goodput`: a run's `RunTimeline` in, a `GoodputReport` out: training goodput, infra
goodput, recovery per fault, and the AWS/NVRx test case's own figures. One definition for every
mechanism, on one clock (docs/design.md, section 9).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_resilience.goodput import intervals as iv
from ray_resilience.goodput.table import format_table
from ray_resilience.goodput.timeline import FaultEvent, RunTimeline

__all__ = ["FaultRecovery", "GoodputReport", "RunTimeline", "compute_goodput"]

STEADY_WINDOWS = ("before_first_fault", "run")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRecovery:
    """What one fault cost. Times are seconds; None where the supervisor did not record it."""

    fault_id: str
    kind: str | None
    cause: str
    rank: int | None
    step_at_fault: int
    """The step the fault interrupted (the last step every rank had completed when it struck)."""
    t_fault_s: float
    """When it happened, seconds since run start."""
    detect_s: float
    teardown_s: float | None
    rendezvous_s: float | None
    checkpoint_load_s: float | None
    checkpoint_tier: str | None
    first_step_s: float | None
    """Recorded, else derived: first completed step minus the end of the last recorded phase."""
    recovery_s: float | None
    """Fault to the first completed step after it; None if training never resumed."""
    resumed_from_step: int | None
    step_reached: int
    """The last step completed before training resumed: `step_at_fault`, or later where ranks
    stepped on after the fault struck (a lost node's ranks until its processes are gone)."""
    steps_redone: int | None
    """`step_reached` minus `resumed_from_step`: work done before the restart and done again."""
    checkpoint_age_steps: int | None
    """Steps since the newest committed checkpoint at the fault; None if none was committed."""
    checkpoint_age_s: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoodputReport:
    """Goodput of one run (see the module docstring for every definition). Fractions in 0..1."""

    wall_s: float
    final_step: int
    start_step: int
    world_size: int
    steady_step_time_s: float | None
    steady_step_time_source: str
    """"given" (fault-free reference run), "before_first_fault", "fault_free_intervals", "none"."""
    training_goodput: float | None
    infra_goodput: float | None
    full_world_training_s: float
    checkpoint_blocking_s: float
    """Training-thread time in saves of every tier, local snapshots included."""
    num_checkpoints_saved: int
    """Saves of committed checkpoints (local snapshots not counted)."""
    num_checkpoints_committed: int
    faults: tuple[FaultRecovery, ...]
    recovery_p50_s: float | None
    recovery_p99_s: float | None
    recovery_max_s: float | None
    steps_redone_total: int
    aws_checkpoint_efficiency: float | None
    aws_training_goodput: float | None
    num_local_snapshots: int = 0
    """Steps written to the local tier (`CheckpointConfig.local_interval_steps`)."""
    local_snapshot_blocking_s: float = 0.0
    """The local snapshots' share of `checkpoint_blocking_s`."""
    timeline: RunTimeline | None = dataclasses.field(default=None, compare=False, repr=False)
    """The source timeline (for plotting); not part of `to_dict` unless asked."""

    def to_dict(self, *, include_timeline: bool = False) -> dict[str, Any]:
        """JSON-safe dict; `include_timeline` adds the raw events (enough to re-plot the run)."""
        names = [f.name for f in dataclasses.fields(self) if f.name != "timeline"]
        data = {name: getattr(self, name) for name in names}
        data["faults"] = [dataclasses.asdict(f) for f in self.faults]
        if include_timeline and self.timeline is not None:
            data["timeline"] = self.timeline.to_dict()
        return data

    def table(self) -> str:
        """Human-readable summary and per-fault table (plain text)."""
        return format_table(self)


def compute_goodput(
    timeline: RunTimeline, *, steady_step_time_s: float | None = None,
    steady_window: str = "before_first_fault",
) -> GoodputReport:
    """The report of a finished or running run. The steady step time is `steady_step_time_s`
    (a reference run's) or measured here per `steady_window`."""
    if timeline.t_start is None:
        raise ValueError("timeline has no run_started event; nothing to compute.")
    if steady_window not in STEADY_WINDOWS:
        raise ValueError(f"steady_window={steady_window!r} is invalid; "
                         f"use one of {STEADY_WINDOWS}.")
    timeline = timeline.snapshot()  # the supervisor may keep recording while this runs
    if steady_step_time_s is not None and not steady_step_time_s > 0:
        raise ValueError(
            f"steady_step_time_s={steady_step_time_s!r} is invalid; pass the fault-free step "
            "time in seconds (> 0), or None to measure it before the first fault."
        )
    t_end, final_step = iv.run_end(timeline)
    wall = t_end - timeline.t_start
    intervals = iv.step_intervals(timeline)
    fault_ts = iv.fault_times(timeline)
    steady, source = _steady(intervals, fault_ts, steady_step_time_s, steady_window)
    ordered = sorted(timeline.faults.values(), key=lambda f: f.t_fault)
    faults = tuple(_recovery(f, timeline) for f in ordered)
    recoveries = [f.recovery_s for f in faults if f.recovery_s is not None]
    full_world = iv.full_world_training_s(intervals, timeline.world_size)
    blocking = sum(s.blocking_s for s in timeline.saves)
    stepping = sum(max(0.0, i.duration_s - i.blocking_s) for i in intervals)
    useful_steps = final_step - timeline.start_step
    return GoodputReport(
        wall_s=wall, final_step=final_step, start_step=timeline.start_step,
        world_size=timeline.world_size, steady_step_time_s=steady, steady_step_time_source=source,
        training_goodput=None if steady is None else _share(useful_steps * steady, wall),
        infra_goodput=_share(full_world, wall), full_world_training_s=full_world,
        checkpoint_blocking_s=blocking,
        num_checkpoints_saved=sum(1 for s in timeline.saves if s.tier != "local"),
        num_checkpoints_committed=len(timeline.commits), faults=faults,
        recovery_p50_s=iv.percentile(recoveries, 50), recovery_p99_s=iv.percentile(recoveries, 99),
        recovery_max_s=max(recoveries, default=None),
        steps_redone_total=sum(f.steps_redone or 0 for f in faults),
        aws_checkpoint_efficiency=None if wall <= 0 else 1.0 - blocking / wall,
        aws_training_goodput=_share(stepping, wall),
        num_local_snapshots=sum(1 for s in timeline.saves if s.tier == "local"),
        local_snapshot_blocking_s=sum(s.blocking_s for s in timeline.saves if s.tier == "local"),
        timeline=timeline,
    )


def _steady(
    intervals: list[iv.StepInterval], fault_ts: list[float], given: float | None, window: str
) -> tuple[float | None, str]:
    if given is not None:
        return given, "given"
    first_fault = fault_ts[0] if fault_ts else None
    if window == "before_first_fault" and any(
            first_fault is None or i.end.t <= first_fault for i in intervals):
        return iv.steady_step_time(intervals, first_fault), "before_first_fault"
    if intervals:
        return iv.steady_step_time(intervals, None), "fault_free_intervals"
    return None, "none"


def _share(part: float, wall: float) -> float | None:
    return part / wall if wall > 0 else None


def _recovery(fault: FaultEvent, timeline: RunTimeline) -> FaultRecovery:
    """Per-fault costs: recorded phases where present, derived from the events otherwise."""
    durations: dict[str, float] = {}
    for p in fault.phases:
        durations[p.phase] = durations.get(p.phase, 0.0) + (p.t_end - p.t_start)
    tier = next((p.tier for p in reversed(fault.phases) if p.phase == "checkpoint_load"), None)
    t_first = fault.t_first_step
    if t_first is None:
        after = iv.first_step_after(iv.sorted_steps(timeline), fault.t_detect)
        t_first = after.t if after is not None else None
    first_step_s = durations.get("first_step")
    if first_step_s is None and t_first is not None:
        ends = [p.t_end for p in fault.phases if p.phase != "first_step"] or [fault.t_detect]
        first_step_s = max(0.0, t_first - max(ends))
    commit = iv.last_commit_at(timeline.commits, fault.t_fault)
    resumed = fault.resumed_from_step
    # Steps completed after the fault and before the first step of the recovered run belong to
    # the failed attempt (a lost node's ranks step on until its processes are gone). A rank
    # that trained on through the fault (torchft's healthy replica) resumed at its next step.
    reached = max([fault.step_at_fault] + [
        s.step for s in timeline.steps
        if fault.t_fault <= s.t and (t_first is None or s.t < t_first)])
    return FaultRecovery(
        fault_id=fault.fault_id, kind=fault.kind, cause=fault.cause, rank=fault.rank,
        step_at_fault=fault.step_at_fault, t_fault_s=fault.t_fault - (timeline.t_start or 0.0),
        detect_s=durations.get("detect", fault.t_detect - fault.t_fault),
        teardown_s=durations.get("teardown"), rendezvous_s=durations.get("rendezvous"),
        checkpoint_load_s=durations.get("checkpoint_load"), checkpoint_tier=tier,
        first_step_s=first_step_s,
        recovery_s=None if t_first is None else t_first - fault.t_fault,
        resumed_from_step=resumed, step_reached=reached,
        steps_redone=None if resumed is None else max(0, reached - resumed),
        checkpoint_age_steps=None if commit is None else fault.step_at_fault - commit.step,
        checkpoint_age_s=None if commit is None else fault.t_fault - commit.t,
    )
