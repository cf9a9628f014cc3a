"""The benchmark's scoring, checked by hand on synthetic timelines: the shared yardstick,
per-slot infra goodput, half-world steps, intervals from measured costs, staleness; and where
ours stamps its saves (the library side the yardstick relies on)."""

from __future__ import annotations

import os
import sys

import pytest

from ray_resilience._internal.supervisor.recorders import TimelineRecorder
from ray_resilience._internal.supervisor.run_record import RunRecord
from ray_resilience.callbacks import RunStarted
from ray_resilience.goodput import RunTimeline

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from scoring.intervals import save_costs, young_interval  # noqa: E402
from scoring.staleness import staleness, staleness_summary  # noqa: E402
from scoring.stats import summary  # noqa: E402
from scoring.yardstick import score_run, steady_step_s, useful_steps, yardstick  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _timeline(step_s: float, steps: int, *, t0: float = 0.0, startup: float = 2.0,
              world: int = 2) -> RunTimeline:
    timeline = RunTimeline()
    timeline.run_started(t0, world)
    for step in range(1, steps + 1):
        timeline.step_completed(step, t0 + startup + step * step_s, world)
    timeline.run_finished(t0 + startup + steps * step_s, steps)
    return timeline


def test_one_yardstick_charges_a_slower_step_the_in_run_figure_hides() -> None:
    fast, slow = _timeline(0.10, 100), _timeline(0.12, 100)
    stick = yardstick({"fast": steady_step_s(fast), "slow": steady_step_s(slow), "broken": None})
    assert stick == ("fast", pytest.approx(0.10))
    a, b = score_run(fast, stick[1]), score_run(slow, stick[1])
    assert a.training_goodput == pytest.approx(100 * 0.10 / 12.0)
    assert b.training_goodput == pytest.approx(100 * 0.10 / 14.0)
    # Against its own steady step the slow run even ranks first (start-up weighs less on it).
    assert b.in_run_goodput > a.in_run_goodput and b.training_goodput < a.training_goodput
    assert b.startup_s == pytest.approx(2.12) and b.wall_s == pytest.approx(14.0)
    assert b.goodput_after_startup == pytest.approx(99 * 0.10 / (14.0 - 2.12))


def test_infra_goodput_per_slot_charges_idle_spares() -> None:
    timeline = _timeline(0.1, 100)
    plain, spared = score_run(timeline, 0.1), score_run(timeline, 0.1, num_spares=1)
    full_world = 99 * 0.1  # step 1 to step 100: the start-up stretch is not training
    assert plain.infra_goodput_per_slot == pytest.approx(full_world / 12.0)
    assert spared.infra_goodput_per_slot == pytest.approx(full_world / 12.0 * 2 / 3)


def test_steps_trained_by_half_the_world_count_half() -> None:
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 5):
        timeline.step_completed(step, float(step), 2)
    for step in range(5, 9):  # a replica is down: the survivor trains alone
        timeline.step_completed(step, float(step), 1)
    timeline.step_completed(8, 9.0, 2)  # retrained with the full world: it counts fully
    timeline.run_finished(9.0, 8)
    assert useful_steps(timeline) == pytest.approx(4 + 3 * 0.5 + 1)


def test_recovery_is_grouped_by_fault_kind() -> None:
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 11):  # to the fault at 3.0 s
        timeline.step_completed(step, 2.0 + step * 0.1, 2)
    timeline.fault_detected("f1", t_fault=3.0, t_detect=3.1, step_at_fault=10, rank=1,
                            cause="process_killed", kind="sigkill")
    for step in range(9, 51):  # resumed from step 8, its first step at 4.0 s
        timeline.step_completed(step, 4.0 + (step - 9) * 0.1, 2)
    timeline.recovery_done("f1", 4.0, resumed_from_step=8)
    timeline.run_finished(8.1, 50)
    score = score_run(timeline, 0.1)
    assert score.recovery_s == {"sigkill": [pytest.approx(1.0)]}
    assert score.recovery_total_s == pytest.approx(1.0) and score.steps_redone == 2


def test_back_to_full_world_waits_for_the_restarted_replica_where_a_survivor_trained_on() -> None:
    """torchft: the survivor's next step ends the recovery (0.5 s); the whole world trains
    again only when the restarted replica rejoins (step 9, 4.0 s after the fault). A fault
    after the last step has neither. For an FSDP run the two are the same step."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step, t, world in [(1, 1.0, 2), (2, 2.0, 2), (3, 2.5, 1), (4, 3.0, 1), (5, 3.5, 1),
                           (6, 4.0, 1), (7, 4.5, 1), (8, 5.0, 1), (9, 6.0, 2), (10, 7.0, 2)]:
        timeline.step_completed(step, t, world)
    timeline.fault_detected("f1", t_fault=2.0, t_detect=2.1, step_at_fault=2, rank=1,
                            cause="exception", kind="exception")
    timeline.recovery_done("f1", 2.5, resumed_from_step=2)
    timeline.fault_detected("f2", t_fault=8.0, t_detect=8.0, step_at_fault=10, rank=1,
                            cause="exception", kind="exception")
    timeline.run_finished(7.0, 10)
    score = score_run(timeline, 1.0)
    assert score.recovery_s == {"exception": [pytest.approx(0.5)]}
    assert score.full_world_back_s == {"exception": [pytest.approx(4.0)]}

    fsdp = _timeline(0.1, 50)
    fsdp.fault_detected("f1", t_fault=3.0, t_detect=3.1, step_at_fault=10, rank=1,
                        cause="process_killed", kind="sigkill")
    fsdp.recovery_done("f1", 4.0, resumed_from_step=8)  # a step lands exactly at 4.0 s
    assert score_run(fsdp, 0.1).full_world_back_s == score_run(fsdp, 0.1).recovery_s


def test_young_interval_from_cost_step_and_mtbf() -> None:
    # sqrt(2 x (0.2 s / 0.05 s) x (200 / 5)) = sqrt(320) = 17.9 -> 18 steps.
    assert young_interval(0.2, 0.05, 200, 5) == 18
    assert young_interval(0.0, 0.05, 200, 5) == 1  # free saves: every step
    assert young_interval(20.0, 0.05, 200, 5) == 50  # at most a quarter of the run
    assert young_interval(0.2, 0.05, 200, 0) == 50
    assert young_interval(0.008, 0.05, 200, 5) == 4  # a cheap local tier: every few steps


def test_save_costs_are_the_excess_wall_per_durable_save_and_the_local_blocking() -> None:
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    t = 1.0
    for step in range(1, 21):
        t += 0.1 + (0.5 if step in (6, 11, 16) else 0.0)  # the step after each save is slower
        timeline.step_completed(step, t, 2)
        timeline.checkpoint_saved(step, t, 0.01, tier="local")
        if step % 5 == 0:
            timeline.checkpoint_saved(step, t, 0.05, tier=None)
    durable, local = save_costs(timeline, steady_s=0.1)
    assert durable == pytest.approx(0.5) and local == pytest.approx(0.01)


def test_a_save_that_slows_every_step_is_charged_against_the_run_without_saves() -> None:
    """Background saves that slow every step by 20 ms hide in the run's own median step; the
    same mechanism's run without saves (steps of 0.1 s) shows them: 0.02 x 5 steps per save,
    plus the 0.3 s step after each save, less the local saves' blocking (charged to them)."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    t = 1.0
    for step in range(1, 21):
        t += 0.12 + (0.3 if step in (6, 11, 16) else 0.0)
        timeline.step_completed(step, t, 2)
        timeline.checkpoint_saved(step, t, 0.004, tier="local")
        if step % 5 == 0:
            timeline.checkpoint_saved(step, t, 0.05, tier=None)
    hidden, _ = save_costs(timeline, steady_s=0.12)
    assert hidden == pytest.approx(0.3)  # the per-step slowdown is missed
    durable, local = save_costs(timeline, steady_s=0.12, baseline_s=0.1)
    # steps 3..20 (18 steps, 3 saves): 18 x 0.02 + 3 x 0.3 - 18 x 0.004 of local blocking
    assert durable == pytest.approx((18 * 0.02 + 0.9 - 18 * 0.004) / 3)
    assert local == pytest.approx(0.004)
    # a run without saves that happened to step slower (noise) never lowers the run's own figure
    assert save_costs(timeline, steady_s=0.12, baseline_s=0.13)[0] == pytest.approx(0.3)


def test_staleness_is_the_age_of_the_newest_durable_checkpoint_at_each_step() -> None:
    steps = [(s, 10.0 + s) for s in range(1, 9)]
    commits = [(2, 13.5), (4, 16.2), (3, 16.3)]  # step 3 committed after 4: 4 stays newest
    ages = staleness(steps, commits, t_start=10.0)
    assert ages == [(1, 1.0), (2, 2.0), (3, 3.0), (2, 2.0), (3, 3.0), (4, 4.0), (3, 3.0),
                    (4, 4.0)]
    assert staleness_summary(ages)["steps_max"] == 4
    # timing began with step 2's checkpoint in place (warm-up saves): ages count from it
    later = [(s, 10.0 + s) for s in range(3, 6)]
    assert staleness(later, [(4, 14.5)], t_start=12.0, base_step=2) == [
        (1, 1.0), (2, 2.0), (1, 1.0)]
    assert summary([0.5, None, 0.7, 0.6]) == {"median": 0.6, "min": 0.5, "max": 0.7, "n": 3}


def test_ours_local_saves_land_in_the_step_interval_they_happened_in() -> None:
    """Each rank sends its save's own time; the supervisor stamps the timeline with the
    latest rank's, not with the time the heartbeat carrying it was sent."""
    recorder = TimelineRecorder()  # fed synchronously here; the supervisor queues the events
    record = RunRecord(world_size=2, emit=lambda event: getattr(recorder, event.hook)(event))
    recorder.on_run_start(RunStarted(run_name="r", world_size=2, start_step=0, t=100.0))
    record.add_saves(0, [(5, 0.002, "local", 100.51)], t=100.75)
    record.add_saves(0, [(5, 0.003, "local", 100.52), (5, 0.01, None, 100.52)], t=100.8)
    record.add_saves(0, [(5, 0.02, None, 100.53)], t=100.9)
    stamped = [(s.step, s.t, s.blocking_s, s.tier) for s in recorder.timeline.saves]
    assert stamped == [(5, 100.52, 0.003, "local"), (5, 100.53, 0.02, None)]
    record.add_saves(1, [(6, 0.004), (6, 0.005)], t=101.0)  # an old sender without times
    assert recorder.timeline.saves[-1].t == 101.0


def test_a_checkpoint_repetition_charges_each_save_the_machine_cpu_above_its_baseline() -> None:
    from ckpt.summary import pool, score_rep  # noqa: PLC0415 - the bench's own package

    def rank(machine_cpu_s: float) -> dict:
        return {"blocking_s": [0.01, 0.02], "wall_s": 12.0, "requested": 2, "held_bytes": 0,
                "coalesced": 0, "skipped": 0, "t_start": 100.0,
                "step_times": [(3, 101.0), (4, 102.0), (5, 103.0), (6, 104.0)],
                "commits": [], "usage": {"machine_cpu_s": machine_cpu_s}}

    result = {"ranks": [rank(30.0), rank(30.0)], "committed": 4, "commits": [(4, 102.5)],
              "writer_bytes": 2_000_000, "rank_staging_bytes": 1_000_000}
    scored = score_rep(result, "ours_block", {"wall_s": 10.0, "machine_cpu_s": 24.0},
                       warm_up_saves=2)
    assert scored["cpu_per_save_s"] == pytest.approx(3.0)  # (30 - 24) CPU-s over 2 saves
    assert scored["persisted"] == 2  # the two warm-up commits are not the timed saves'
    assert scored["held_mb"] == pytest.approx(3.0)  # the writers' and the ranks' memory
    assert scored["throughput_efficiency"] == pytest.approx(10.0 / 12.0)
    # ages count from the warm-up checkpoint (step 2) until step 4's commit
    assert [a for a, _ in scored["ages"]] == [1, 2, 1, 2]
    # a failed baseline, or a result from before the machine was measured: no figure
    assert score_rep(result, "ours_block", None, warm_up_saves=2)["cpu_per_save_s"] is None
    assert pool([scored])["cpu_per_save_s"]["median"] == pytest.approx(3.0)
