"""Synthetic run timelines whose goodput is known by construction."""

from __future__ import annotations

from ray_resilience.goodput import RunTimeline

FID = "f1@step50/rank1/sigkill"


def steady_run(*, world_size: int = 2, steps: int = 100, step_s: float = 1.0,
               saves: dict[int, float] | None = None) -> tuple[RunTimeline, float]:
    """A fault-free run: each step takes step_s; a save after step k blocks for saves[k]."""
    saves = saves or {}
    timeline, t = RunTimeline(), 0.0
    timeline.run_started(0.0, world_size)
    for step in range(1, steps + 1):
        t += step_s
        timeline.step_completed(step, t, world_size)
        if step in saves:
            t += saves[step]
            timeline.checkpoint_saved(step, t, saves[step], tier="memory")
            timeline.checkpoint_committed(step, t + 0.25)
    timeline.run_finished(t, steps)
    return timeline, t


def rollback_run(tier: str = "memory") -> RunTimeline:
    """1 s steps; checkpoint 40 committed at 41; rank 1 killed at 49.5 during step 50;
    detected at 50; recovered from 40 (read from `tier`) with step 41 done at 55; step 100
    done at 114."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 50):
        timeline.step_completed(step, float(step), 2)
    timeline.checkpoint_committed(40, 41.0)
    timeline.fault_detected(FID, t_fault=49.5, t_detect=50.0, step_at_fault=50, rank=1,
                            cause="process_killed", kind="sigkill")
    timeline.recovery_phase(FID, "teardown", 50.0, 51.0)
    timeline.recovery_phase(FID, "rendezvous", 51.0, 52.5)
    timeline.recovery_phase(FID, "checkpoint_load", 52.5, 53.0, tier=tier)
    for step in range(41, 101):
        timeline.step_completed(step, 55.0 + (step - 41), 2)
    timeline.recovery_done(FID, 55.0, 40)
    timeline.run_finished(114.0, 100)
    return timeline
