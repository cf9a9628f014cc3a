"""Goodput accounting on synthetic timelines whose answers are known by construction."""

from __future__ import annotations

import json
import math
import pickle
import sys
import threading

import pyarrow.fs as pafs
import pytest

from ray_resilience._internal.run_folder import write_run_artifacts
from ray_resilience.goodput import RunTimeline, compute_goodput
from ray_resilience.goodput.intervals import percentile
from ray_resilience.result import Result
from tests.support.timelines import FID, rollback_run, steady_run


def test_no_faults_gives_full_goodput_minus_checkpoint_blocking():
    timeline, wall = steady_run(saves={25: 0.5, 50: 0.5, 75: 0.5})
    report = compute_goodput(timeline)
    assert wall == pytest.approx(101.5)
    assert report.steady_step_time_s == pytest.approx(1.0)
    assert report.steady_step_time_source == "before_first_fault"
    assert report.training_goodput == pytest.approx(1.0 - 1.5 / wall)
    assert report.aws_checkpoint_efficiency == pytest.approx(1.0 - 1.5 / wall)
    # Infra: every step-to-step interval at full size; only the first step (setup) is outside.
    assert report.infra_goodput == pytest.approx((wall - 1.0) / wall)
    assert report.faults == () and report.recovery_p50_s is None
    assert report.num_checkpoints_saved == 3 and report.num_checkpoints_committed == 3


def test_a_restore_from_a_replica_is_a_tier_of_its_own_and_an_unknown_tier_is_refused():
    (fault,) = compute_goodput(rollback_run(tier="replica")).faults
    assert fault.checkpoint_tier == "replica"
    with pytest.raises(ValueError, match="tier='disk' is invalid"):
        rollback_run(tier="disk")


def test_checkpoint_on_every_step_still_counts_blocking_as_lost():
    timeline, wall = steady_run(steps=20, saves=dict.fromkeys(range(1, 21), 0.25))
    report = compute_goodput(timeline)
    assert report.steady_step_time_s == pytest.approx(1.0)
    assert report.training_goodput == pytest.approx(20.0 / 25.0)
    assert report.checkpoint_blocking_s == pytest.approx(5.0)


def test_known_rollback_gives_known_loss():
    report = compute_goodput(rollback_run())
    assert report.wall_s == pytest.approx(114.0)
    assert report.training_goodput == pytest.approx(100.0 / 114.0)
    (fault,) = report.faults
    assert fault.fault_id == FID and fault.cause == "process_killed" and fault.rank == 1
    assert fault.detect_s == pytest.approx(0.5)
    assert (fault.teardown_s, fault.rendezvous_s, fault.checkpoint_load_s) == pytest.approx(
        (1.0, 1.5, 0.5))
    assert fault.checkpoint_tier == "memory"
    assert fault.first_step_s == pytest.approx(2.0)  # derived: 55 - end of checkpoint_load
    assert fault.recovery_s == pytest.approx(5.5)
    assert fault.steps_redone == 10 and report.steps_redone_total == 10
    assert fault.checkpoint_age_steps == 10 and fault.checkpoint_age_s == pytest.approx(8.5)
    # Infra: intervals 1->49 (48 s) and 41->100 (59 s); the recovery window is excluded.
    assert report.infra_goodput == pytest.approx(107.0 / 114.0)
    # AWS formula counts the redone steps as useful time.
    assert report.aws_training_goodput == pytest.approx(107.0 / 114.0)


def test_steady_window_run_uses_every_fault_free_interval():
    """A machine that slows down after the fault: the whole-run median sees it, the
    before-first-fault median does not; the interval spanning the fault is never counted."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 11):  # 1 s steps before the fault
        timeline.step_completed(step, float(step), 2)
    timeline.fault_detected(FID, t_fault=10.5, t_detect=10.6, step_at_fault=11, rank=1,
                            cause="exception", kind="exception")
    t = 20.0  # recovered from step 10 at t=20 (a 10 s gap that must not count as a step)
    for step in range(11, 41):  # 2 s steps after it
        t += 2.0
        timeline.step_completed(step, t, 2)
    timeline.recovery_done(FID, 22.0, 10)
    timeline.run_finished(t, 40)
    early = compute_goodput(timeline)
    assert (early.steady_step_time_s, early.steady_step_time_source) == (1.0, "before_first_fault")
    whole = compute_goodput(timeline, steady_window="run")
    assert whole.steady_step_time_s == pytest.approx(2.0)  # 9 intervals of 1 s, 29 of 2 s
    assert whole.steady_step_time_source == "fault_free_intervals"
    assert whole.training_goodput == pytest.approx(40 * 2.0 / t)
    with pytest.raises(ValueError, match="steady_window"):
        compute_goodput(timeline, steady_window="after")


def test_reduced_world_size_lowers_infra_goodput_only_for_that_period():
    timeline = RunTimeline()
    timeline.run_started(0.0, 4)
    for step in range(1, 11):
        timeline.step_completed(step, float(step), 4)
    timeline.fault_detected("node", t_fault=10.5, t_detect=11.0, step_at_fault=11, rank=3,
                            cause="node_loss", kind="node_loss")
    for step in range(11, 31):  # shrunk to 3 ranks
        timeline.step_completed(step, 13.0 + step - 11, 3)
    timeline.recovery_done("node", 13.0, 10)
    for step in range(31, 51):  # grown back to 4
        timeline.step_completed(step, 33.0 + step - 31, 4)
    timeline.run_finished(52.0, 50)
    report = compute_goodput(timeline)
    assert report.full_world_training_s == pytest.approx(9.0 + 19.0)
    assert report.infra_goodput == pytest.approx(28.0 / 52.0)
    assert report.training_goodput == pytest.approx(50.0 / 52.0)
    assert report.faults[0].steps_redone == 1 and report.faults[0].checkpoint_age_steps is None


def test_steps_taken_after_the_fault_and_then_redone_count_as_redone():
    """A lost node's ranks step on until its processes are gone: steps 11-15 were done after the
    fault fired, thrown away with the node, and done again from the step-5 commit."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 16):
        timeline.step_completed(step, float(step), 2)
    timeline.fault_detected("node", t_fault=10.5, t_detect=16.0, step_at_fault=10, rank=1,
                            cause="node_loss", kind="node_loss")
    for step in range(6, 21):  # resumed from the step-5 commit
        timeline.step_completed(step, 20.0 + step - 6, 2)
    timeline.recovery_done("node", 20.0, 5)
    timeline.run_finished(35.0, 20)
    (fault,) = compute_goodput(timeline).faults
    assert (fault.step_at_fault, fault.step_reached, fault.resumed_from_step) == (10, 15, 5)
    assert fault.steps_redone == 10


def test_a_replica_that_trained_through_the_fault_redid_nothing():
    """torchft: the healthy replica's steps after the fault are kept, not redone."""
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 21):
        timeline.step_completed(step, float(step), 1 if 11 <= step <= 14 else 2)
    timeline.fault_detected("e", t_fault=10.5, t_detect=12.0, step_at_fault=10, rank=1,
                            cause="exception", kind="exception")
    timeline.recovery_done("e", 11.0, 10)  # its next step ended the stall
    timeline.run_finished(20.0, 20)
    (fault,) = compute_goodput(timeline).faults
    assert (fault.step_reached, fault.steps_redone) == (10, 0)


def test_recovery_window_is_not_training_even_without_rollback():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(1, 11):
        timeline.step_completed(step, float(step), 2)
    timeline.fault_detected("e", t_fault=10.2, t_detect=10.5, step_at_fault=11, rank=1,
                            cause="exception", kind="exception")
    for step in range(11, 21):  # resumed from checkpoint 10: step 11 is the first step after
        timeline.step_completed(step, 14.0 + step - 11, 2)
    timeline.recovery_done("e", 14.0, 10)
    timeline.run_finished(23.0, 20)
    report = compute_goodput(timeline)
    assert report.full_world_training_s == pytest.approx(9.0 + 9.0)
    assert report.aws_training_goodput == pytest.approx(18.0 / 23.0)
    assert report.faults[0].recovery_s == pytest.approx(3.8)


def test_percentile_math():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0], 0) == 1.0 and percentile([1.0, 2.0, 3.0], 100) == 3.0


def test_report_percentiles_over_faults():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    t, step = 0.0, 0
    for index, recovery in enumerate([2.0, 10.0, 4.0]):
        for _ in range(10):
            t, step = t + 1.0, step + 1
            timeline.step_completed(step, t, 2)
        fault_id = f"f{index}"
        timeline.fault_detected(fault_id, t_fault=t + 0.5, t_detect=t + 1.0, step_at_fault=step + 1,
                                rank=1, cause="exception", kind="exception")
        t, step = t + 0.5 + recovery, step + 1
        timeline.step_completed(step, t, 2)
        timeline.recovery_done(fault_id, t, step - 1)
    timeline.run_finished(t, step)
    report = compute_goodput(timeline)
    assert [f.recovery_s for f in report.faults] == pytest.approx([2.0, 10.0, 4.0])
    assert report.recovery_p50_s == pytest.approx(4.0)
    assert report.recovery_p99_s == pytest.approx(4.0 + 6.0 * 0.98)
    assert report.recovery_max_s == pytest.approx(10.0)
    assert all(f.steps_redone == 1 for f in report.faults)


def test_sparse_progress_and_given_reference_step_time():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step in range(5, 101, 5):  # progress sampled every 5 steps, 0.5 s per step
        timeline.step_completed(step, 2.0 + step * 0.5, 2)
    timeline.run_finished(52.0, 100)
    measured = compute_goodput(timeline)
    assert measured.steady_step_time_s == pytest.approx(0.5)
    assert measured.training_goodput == pytest.approx(50.0 / 52.0)
    given = compute_goodput(timeline, steady_step_time_s=0.4)
    assert given.steady_step_time_source == "given"
    assert given.training_goodput == pytest.approx(40.0 / 52.0)
    with pytest.raises(ValueError, match="steady_step_time_s"):
        compute_goodput(timeline, steady_step_time_s=0.0)


def test_unfinished_run_and_missing_recovery_are_reported_honestly():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    timeline.step_completed(1, 1.0, 2)
    timeline.fault_detected("h", t_fault=1.5, t_detect=31.5, step_at_fault=2, rank=1,
                            cause="hang", kind="hang")
    report = compute_goodput(timeline)
    assert report.wall_s == pytest.approx(31.5) and report.final_step == 1
    assert report.steady_step_time_source == "none" and report.training_goodput is None
    assert report.faults[0].recovery_s is None and report.faults[0].detect_s == pytest.approx(30)
    assert "n/a" in report.table()


@pytest.mark.parametrize(("call", "error"), [
    (lambda tl: tl.recovery_phase("nope", "teardown", 1.0, 2.0), "fault_id='nope'"),
    (lambda tl: tl.recovery_phase("f", "cleanup", 1.0, 2.0), "phase='cleanup'"),
    (lambda tl: tl.recovery_phase("f", "teardown", 2.0, 1.0), "t_end"),
    (lambda tl: tl.checkpoint_saved(5, 1.0, 0.1, tier="disk"), "tier='disk'"),
    (lambda tl: tl.checkpoint_saved(5, 1.0, -0.1), "blocking_s"),
    (lambda tl: tl.step_completed(5, math.nan, 2), "t=nan"),
    (lambda tl: tl.fault_detected("f", t_fault=1.0, t_detect=2.0, step_at_fault=3, rank=1,
                                  cause="exception", kind="exception"), "already recorded"),
    (lambda tl: tl.fault_detected("g", t_fault=2.0, t_detect=1.0, step_at_fault=3, rank=1,
                                  cause="exception", kind="exception"), "t_detect"),
])
def test_recorder_rejects_bad_events(call, error):
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    timeline.fault_detected("f", t_fault=1.0, t_detect=2.0, step_at_fault=3, rank=1,
                            cause="exception", kind="exception")
    with pytest.raises(ValueError, match=error):
        call(timeline)


def test_events_before_run_started_are_refused():
    with pytest.raises(RuntimeError, match="run_started"):
        RunTimeline().step_completed(1, 1.0, 2)
    with pytest.raises(ValueError, match="run_started"):
        compute_goodput(RunTimeline())


def test_timeline_round_trip_gives_the_same_report():
    timeline = rollback_run()
    again = RunTimeline.from_dict(json.loads(json.dumps(timeline.to_dict())))
    assert compute_goodput(again) == compute_goodput(timeline)


def test_report_pickles_with_its_timeline_and_ignores_later_events():
    timeline = rollback_run()
    report = compute_goodput(timeline)
    timeline.step_completed(101, 115.0, 2)  # recorded after the report was computed
    again = pickle.loads(pickle.dumps(report))
    assert again == report and again.timeline is not None
    assert len(again.timeline.steps) == 109 and len(timeline.steps) == 110
    again.timeline.step_completed(102, 116.0, 2)  # the unpickled lock works


def test_concurrent_recording_while_computing():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)

    def record(offset: int) -> None:
        for i in range(500):
            timeline.step_completed(offset + i, float(offset + i), 2)
            timeline.fault_detected(f"x{offset}-{i}", t_fault=1e6, t_detect=1e6,
                                    step_at_fault=1, rank=1, cause="exception", kind=None)

    threads = [threading.Thread(target=record, args=(k * 1000,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so unguarded iteration would break
    try:
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            compute_goodput(timeline)
    finally:
        sys.setswitchinterval(interval)
        for thread in threads:
            thread.join()
    assert len(compute_goodput(timeline).faults) == 2000 and len(timeline.steps) == 2000


def test_run_artifacts_hold_the_report_table_and_timeline(tmp_path):

    report = compute_goodput(rollback_run())
    result = Result(metrics={"final_step": 100}, metrics_history=[], path=str(tmp_path), error=None,
                    state="finished", attempts=2, faults=[], return_values=[], worker_pids=[],
                    wall_s=114.0, goodput=report)
    write_run_artifacts(pafs.LocalFileSystem(), str(tmp_path), result)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["metrics"] == {"final_step": 100}
    assert data["goodput"]["training_goodput"] == pytest.approx(100.0 / 114.0)
    assert data["goodput"]["faults"][0]["fault_id"] == FID
    assert len(data["goodput"]["timeline"]["steps"]) == 109
    text = (tmp_path / "goodput.txt").read_text()
    assert "training goodput" in text and FID in text and "87.7%" in text
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
