"""The recovery benchmark's own logic, without running any mechanism (those take minutes).

A synthetic event log with known times goes through the same conversion the peers use, and the
goodput numbers that come out are checked by hand; the fault ledger's fire-once rule, the CLI and
the interval rules are checked directly.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs" / "bench"))

import bench_recovery
from peers.events import EventLog, FaultLedger, read_events, write_events
from peers.report import Row, print_table, speedups, table, write_results
from peers.spec import Workload
from peers.timeline import build_timeline, events_to_timeline
from peers.torchft_peer import QuorumChange
from peers.workload import fire_due_faults

from ray_resilience.goodput import RunTimeline, compute_goodput
from ray_resilience.testing import Fault, FaultPlan, InjectedFault


def _rank_events(t0: float) -> list[dict]:
    """One fault-free attempt (steps 1-10, 0.1 s each, save+commit at 5), a sigkill at 102.0
    before step 11, detection 0.5 s later, a new attempt that loads step 5 and runs 6-20."""
    ev: list[dict] = []
    for rank in (0, 1):
        ev += [{"ev": "start", "t": t0, "rank": rank, "pid": 1},
               {"ev": "pg_ready", "t": t0 + 0.5, "rank": rank},
               {"ev": "load", "t": t0 + 0.6, "t_start": t0 + 0.5, "rank": rank, "from_step": 0}]
        ev += [{"ev": "step", "t": t0 + 1.0 + 0.1 * (s - 1), "rank": rank, "step": s, "loss": 1.0}
               for s in range(1, 11)]
        ev.append({"ev": "save", "t": t0 + 1.4, "rank": rank, "step": 5, "blocking_s": 0.0})
        ev += [{"ev": "start", "t": t0 + 3.0 + 0.1 * rank, "rank": rank, "pid": 2},
               {"ev": "pg_ready", "t": t0 + 4.0 + 0.2 * rank, "rank": rank},
               {"ev": "load", "t": t0 + 4.4, "t_start": t0 + 4.2, "rank": rank, "from_step": 5}]
        ev += [{"ev": "step", "t": t0 + 4.5 + 0.1 * (s - 6), "rank": rank, "step": s, "loss": 1.0}
               for s in range(6, 21)]
        ev.append({"ev": "done", "t": t0 + 6.0, "rank": rank, "final_step": 20})
    ev.append({"ev": "commit", "t": t0 + 1.45, "step": 5, "source": "test"})
    return ev


FIRED = [{"id": "f1@step11/rank1/sigkill", "step": 11, "rank": 1, "kind": "sigkill",
          "t_fault": 102.0}]


def test_synthetic_log_gives_hand_computed_goodput() -> None:
    events = _rank_events(100.0) + [
        {"ev": "detect", "t": 102.5, "source": "launcher", "detail": "failed (exitcode: -9)"}]
    timeline, notes = events_to_timeline(events, FIRED, world_size=2, t_start=100.0)
    assert notes == []
    report = compute_goodput(timeline)
    assert report.wall_s == pytest.approx(6.0)
    assert report.final_step == 20
    assert report.steady_step_time_s == pytest.approx(0.1)
    assert report.training_goodput == pytest.approx(20 * 0.1 / 6.0)
    # Full-world intervals: steps 1->10 (0.9 s) and 6->20 (1.4 s); the recovery is excluded.
    assert report.infra_goodput == pytest.approx((0.9 + 1.4) / 6.0)
    (fault,) = report.faults
    assert fault.cause == "process_killed" and fault.kind == "sigkill"
    assert fault.detect_s == pytest.approx(0.5)
    assert fault.teardown_s == pytest.approx(0.5)
    assert fault.rendezvous_s == pytest.approx(1.2)  # first new start to the last pg_ready
    assert fault.checkpoint_load_s == pytest.approx(0.2)
    assert fault.checkpoint_tier == "storage"
    assert fault.recovery_s == pytest.approx(2.5)
    assert fault.resumed_from_step == 5 and fault.steps_redone == 6
    assert fault.checkpoint_age_steps == 6
    assert report.num_checkpoints_saved == 1 and report.num_checkpoints_committed == 1


def test_missing_detection_signal_is_a_note_not_a_made_up_split() -> None:
    timeline, notes = events_to_timeline(_rank_events(100.0), FIRED, world_size=2, t_start=100.0)
    (fault,) = compute_goodput(timeline).faults
    assert fault.detect_s == pytest.approx(1.0)  # fault to the first new process start
    assert fault.teardown_s is None
    assert len(notes) == 1 and "no detection signal" in notes[0]


def test_event_files_and_ledger_round_trip(tmp_path) -> None:
    run_dir = str(tmp_path)
    log = EventLog(run_dir, "rank0-pid1")
    log.step(0, 1, 2.5)
    write_events(run_dir, "rank1-pid2", [{"ev": "step", "t": 1.0, "rank": 1, "step": 1}])
    with open(log.path, "a", encoding="utf-8") as f:
        f.write('{"ev": "step", "t": 3')  # what a SIGKILL mid-write leaves
    events = read_events(run_dir)
    assert [e["rank"] for e in events] == [1, 0]  # sorted by time, cut line skipped
    ledger = FaultLedger(run_dir)
    (fault,) = FaultPlan.explicit([Fault(step=3, rank=1, kind="exception")])
    t_fault = ledger.record(fault)
    assert ledger.fired_ids() == {fault.id}
    assert ledger.records()[0]["t_fault"] == t_fault
    timeline, _ = build_timeline(run_dir, world_size=2, t_start=0.0)
    assert [s.step for s in timeline.steps] == [1] and list(timeline.faults) == [fault.id]


def test_a_fault_fires_once_even_when_its_step_is_trained_again(tmp_path) -> None:
    plan = FaultPlan.explicit([Fault(step=4, rank=1, kind="exception")])
    workload = Workload(max_steps=10, checkpoint_interval=2, data_dir=str(tmp_path),
                        run_dir=str(tmp_path), fault_plan=plan)
    ledger = FaultLedger(str(tmp_path))
    fire_due_faults(workload, ledger, rank=0, step=4)  # not this rank's fault
    with pytest.raises(InjectedFault):
        fire_due_faults(workload, ledger, rank=1, step=4)
    fire_due_faults(workload, ledger, rank=1, step=4)  # after the rollback: no second firing
    assert len(ledger.records()) == 1


def test_workload_json_round_trip_keeps_the_plan(tmp_path) -> None:
    plan = FaultPlan.generate(seed=42, fault_count=3, after_step=10, max_steps=60, world_size=2,
                              kinds=["exception", "sigkill"])
    workload = Workload(max_steps=60, data_dir="/d", run_dir=str(tmp_path), fault_plan=plan)
    assert Workload.read(workload.write()) == workload
    with pytest.raises(ValueError, match="never reached"):
        workload.with_(max_steps=20)


def test_cli_defaults_and_validation(tmp_path) -> None:
    quick = bench_recovery.parse_args(["--quick", "--mechanisms", "ray-train,torchrun",
                                       "--out", str(tmp_path)])
    assert (quick.max_steps, quick.fault_count) == (60, 3)
    assert quick.mechanisms == ["ray-train", "torchrun"]
    assert quick.checkpoint_interval == ["best", "quarter"]
    full = bench_recovery.parse_args([])
    assert (full.max_steps, full.fault_count, full.fault_seed, full.fault_after_step) == (
        200, 5, 42, 10)
    assert "ours-inprocess" in full.mechanisms and "nvrx-ft-launcher" in full.mechanisms
    assert full.reference_steps == 200  # the reference is as long as the faulty runs
    long = bench_recovery.parse_args(["--max_steps", "2000", "--reference_steps", "300"])
    assert (long.max_steps, long.reference_steps) == (2000, 300)
    for bad in (["--mechanisms", "slurm"], ["--checkpoint_interval", "often"],
                ["--max_steps", "100", "--reference_steps", "101"]):
        with pytest.raises(SystemExit):
            bench_recovery.parse_args(bad)


def test_interval_rules() -> None:
    # Young: sqrt(2 x (0.2 s / 0.05 s) x (200 / 5)) = sqrt(320) = 17.9 -> 18 steps.
    assert bench_recovery.young_interval(0.2, 0.05, 200, 5) == 18
    # No fault that rolls back to a checkpoint (all recovered from the local tier), or a very
    # expensive save: at most a quarter of the run, so storage always holds a recent step.
    assert bench_recovery.young_interval(0.2, 0.05, 200, 0) == 50
    assert bench_recovery.young_interval(20.0, 0.05, 200, 5) == 50
    # sqrt(2 x 6.25 x 200 / 1) = 50 = a quarter of 200: the two rules share one run.
    merged = bench_recovery.resolve_intervals(["best", "quarter", "7"], save_cost_s=0.3125,
                                              step_time_s=0.05, max_steps=200, fault_count=1)
    assert merged == {"best=quarter": 50, "given": 7}


def test_table_results_json_and_speedups_against_ray_train(tmp_path) -> None:
    events = _rank_events(100.0)
    report = compute_goodput(events_to_timeline(events, FIRED, world_size=2, t_start=100.0)[0])
    rows = [Row(mechanism="ray-train", label="best", checkpoint_interval=5, status="ok",
                report=report),
            Row(mechanism="torchrun", label="best", checkpoint_interval=5, status="ok",
                report=report, params_equal=True),
            Row(mechanism="ours-all", label="-", checkpoint_interval=None,
                status="unavailable", error="not available yet")]
    ratios = speedups(rows)
    assert ratios[("torchrun", "best")] == pytest.approx(1.0)
    assert ratios[("ours-all", "-")] is None
    assert table(rows, "t").row_count == 3
    out = io.StringIO()
    print_table(rows, "t", Console(file=out, width=200),
                {"torchrun": {"steady_step_time_s": 0.05, "save_cost_s": 0.1, "wall_s": 12.0}})
    assert "steady step 50 ms" in out.getvalue()
    assert "ours-all: unavailable: not available yet" in out.getvalue()
    with open(write_results(str(tmp_path), {"max_steps": 20}, rows, {}), encoding="utf-8") as f:
        data = json.load(f)
    assert [r["status"] for r in data["rows"]] == ["ok", "ok", "unavailable"]
    assert data["rows"][1]["recovery_p50_speedup_vs_ray_train"] == pytest.approx(1.0)
    assert data["rows"][1]["goodput"]["timeline"]["final_step"] == 20
    # --rescore: the recorded timelines are scored again (also with the in-run steady time).
    assert bench_recovery.main(["--rescore", str(tmp_path / "results.json")]) == 0
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        again = json.load(f)
    assert [r["status"] for r in again["rows"]] == ["ok", "ok", "unavailable"]
    assert again["rows"][1]["goodput"]["training_goodput"] == pytest.approx(
        data["rows"][1]["goodput"]["training_goodput"])
    assert again["rows"][1]["goodput_in_run_steady"]["steady_step_time_source"] == \
        "fault_free_intervals"
    assert again["rows"][2]["goodput_in_run_steady"] is None


def test_torchft_detection_is_the_first_quorum_change() -> None:
    detect = QuorumChange()
    lines = ["got lighthouse quorum ... quorum_id: 1, participants: [a, b]",
             "should_commit=true", "got lighthouse quorum ... quorum_id: 1, participants: [a, b]",
             "got lighthouse quorum ... quorum_id: 2, participants: [a]"]
    assert [bool(detect(line)) for line in lines] == [False, False, False, True]


def test_per_step_wall_skips_the_first_step_and_reads_sparse_samples():
    timeline = RunTimeline()
    timeline.run_started(0.0, 2)
    for step, t in ((1, 5.0), (2, 5.5), (4, 6.5), (10, 9.5)):  # start-up, then 0.5 s per step
        timeline.step_completed(step, t, 2)
    assert bench_recovery.per_step_wall_s(timeline) == pytest.approx(0.5)
    short = RunTimeline()
    short.run_started(0.0, 2)
    short.step_completed(1, 1.0, 2)
    assert bench_recovery.per_step_wall_s(short) is None
