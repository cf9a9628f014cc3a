"""The recovery benchmark's harness logic, without running any mechanism (those take minutes).

A synthetic event log with known times goes through the same conversion the peers use; the
fault point (the start of a step) and the steps-redone convention are checked by hand, as are
the fault trigger's fire-once rule, the ledger alignment of ours' timeline, the plans and the CLI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import bench_recovery  # noqa: E402 - after the path set-up above
from harness.events import EventLog, FaultLedger, read_events, write_events  # noqa: E402
from harness.spec import Workload  # noqa: E402
from harness.timeline import align_to_ledger, build_timeline, events_to_timeline  # noqa: E402
from harness.workload import FaultTrigger  # noqa: E402
from peers import MECHANISMS, make_peer  # noqa: E402
from peers.torchft_peer import QuorumChange  # noqa: E402
from sweep.plans import plan_for  # noqa: E402

from ray_resilience.goodput import RunTimeline, compute_goodput  # noqa: E402
from ray_resilience.testing import Fault, FaultKind, FaultPlan, InjectedFault  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class _StubPeer:
    """A mechanism as the sweep sees it (checkpoint tiers, spares, kinds), installed or not:
    the sweep's order, journal and scoring do not depend on the peers' software being here."""

    def __init__(self, name: str, **_options) -> None:
        self.name = name
        self.uses_durable = name != "torchft"
        self.local_tier = name in ("ours", "torchrun")
        self.num_spares, self.config = 0, f"{name} (stub)"
        self.supported_kinds = frozenset(FaultKind)

    def available(self) -> None:
        return None


def _rank_events(t0: float) -> list[dict]:
    """Steps 1-10 (0.1 s each, save+commit at 5); the fault fires at the start of step 11
    (t0 + 2.0); a new attempt loads step 5 and runs 6-20."""
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
               {"ev": "load", "t": t0 + 4.4, "t_start": t0 + 4.2, "rank": rank, "from_step": 5,
                "tier": "storage"}]
        ev += [{"ev": "step", "t": t0 + 4.5 + 0.1 * (s - 6), "rank": rank, "step": s, "loss": 1.0}
               for s in range(6, 21)]
        ev.append({"ev": "done", "t": t0 + 6.0, "rank": rank, "final_step": 20})
    ev.append({"ev": "commit", "t": t0 + 1.45, "step": 5, "source": "test"})
    return ev


FIRED = [{"id": "f1@step11/rank1/sigkill", "step": 11, "rank": 1, "kind": "sigkill",
          "t_fault": 102.0}]


def test_a_fault_at_the_start_of_step_11_redoes_the_steps_after_the_checkpoint() -> None:
    events = _rank_events(100.0) + [
        {"ev": "detect", "t": 102.5, "source": "launcher", "detail": "failed (exitcode: -9)"}]
    timeline, notes = events_to_timeline(events, FIRED, world_size=2, t_start=100.0)
    assert notes == []
    (fault,) = compute_goodput(timeline).faults
    # Steps 1..10 were complete when the fault fired before step 11's forward pass; the run
    # resumed from step 5: 10 - 5 = 5 steps redone (6..10), not 6.
    assert fault.step_at_fault == 10 and fault.resumed_from_step == 5 and fault.steps_redone == 5
    assert fault.cause == "process_killed" and fault.kind == "sigkill"
    assert fault.detect_s == pytest.approx(0.5)
    assert fault.teardown_s == pytest.approx(0.5)
    assert fault.rendezvous_s == pytest.approx(1.2)  # first new start to the last pg_ready
    assert fault.checkpoint_load_s == pytest.approx(0.2) and fault.checkpoint_tier == "storage"
    assert fault.recovery_s == pytest.approx(2.5)


def test_a_rank_that_loads_nothing_resumed_from_the_step_before_its_next() -> None:
    """torchft: the survivor keeps training; its first step after the fault ends recovery."""
    events = [e for e in _rank_events(100.0) if not (e["ev"] == "load" and e["t"] > 101.0)]
    timeline, _ = events_to_timeline(events, FIRED, world_size=2, t_start=100.0)
    (fault,) = compute_goodput(timeline).faults
    assert fault.resumed_from_step == 5  # its first step after the fault was 6
    assert fault.steps_redone == 5


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


def _workload(tmp_path, plan: FaultPlan) -> Workload:
    return Workload(max_steps=10, checkpoint_interval=2, data_dir=str(tmp_path),
                    run_dir=str(tmp_path), fault_plan=plan)


def test_a_fault_fires_once_even_when_its_step_is_trained_again(tmp_path) -> None:
    workload = _workload(tmp_path, FaultPlan.explicit([Fault(step=4, rank=1, kind="exception")]))
    FaultTrigger(workload, FaultLedger(str(tmp_path)), rank=0)(4)  # not this rank's fault
    trigger = FaultTrigger(workload, FaultLedger(str(tmp_path)), rank=1)
    trigger(3)
    with pytest.raises(InjectedFault):
        trigger(4)
    # A restarted rank reads the ledger: the rolled-back step 4 fires nothing.
    FaultTrigger(workload, FaultLedger(str(tmp_path)), rank=1)(4)
    assert len(FaultLedger(str(tmp_path)).records()) == 1


def test_a_replica_that_healed_past_its_fault_step_fires_it_at_its_next_step(tmp_path) -> None:
    workload = _workload(tmp_path, FaultPlan.explicit([Fault(step=4, rank=1, kind="exception")]))
    trigger = FaultTrigger(workload, FaultLedger(str(tmp_path)), rank=1)
    with pytest.raises(InjectedFault):
        trigger(7)  # torchft: it jumped from step 2 to 7 by healing from a peer
    assert FaultLedger(str(tmp_path)).records()[0]["step"] == 4


def test_workload_json_round_trip_and_validation(tmp_path) -> None:
    plan = plan_for("aws", 60, 2)
    workload = Workload(max_steps=60, data_dir="/d", run_dir=str(tmp_path), fault_plan=plan,
                        local_interval=3, nodes=2)
    assert Workload.read(workload.write()) == workload
    assert workload.is_save_step(15) and not workload.is_save_step(60)  # never after the last
    with pytest.raises(ValueError, match="never reached"):
        workload.with_(max_steps=20)
    with pytest.raises(ValueError, match="size="):
        workload.with_(size="huge")
    with pytest.raises(ValueError, match="local_interval"):
        workload.with_(local_interval=-1)


def test_ours_timeline_takes_the_ledger_faults_time_kind_and_step() -> None:
    timeline = RunTimeline()
    timeline.run_started(100.0, 2)
    for step in range(1, 8):
        timeline.step_completed(step, 100.0 + step, 2)
    # The supervisor saw the fault only when it detected it (no plan given to it).
    timeline.fault_detected("fault1-a0", t_fault=104.6, t_detect=104.6, step_at_fault=4,
                            rank=1, cause="actor_died", kind=None)
    timeline.recovery_done("fault1-a0", 106.0, resumed_from_step=4)
    timeline.fault_detected("fault2-a1", t_fault=106.5, t_detect=106.5, step_at_fault=6,
                            rank=0, cause="exception", kind=None)
    fired = [{"id": "f1@step5/rank1/sigkill", "step": 5, "rank": 1, "kind": "sigkill",
              "t_fault": 104.5}]
    aligned, notes = align_to_ledger(timeline, fired)
    first = aligned.faults["f1@step5/rank1/sigkill"]
    assert (first.t_fault, first.t_detect, first.step_at_fault) == (104.5, 104.6, 4)
    assert (first.kind, first.cause, first.resumed_from_step) == ("sigkill", "process_killed", 4)
    assert notes == ["unplanned fault detected (exception, fault2-a1)"]


def test_plans_reproduce_the_aws_schedule_and_scale() -> None:
    aws = plan_for("aws", 2000, 2)
    assert [(f.step, f.kind.value) for f in aws] == [
        (62, "exception"), (239, "sigkill"), (574, "sigkill"), (1320, "exception"),
        (1529, "exception")]
    assert all(f.rank == 1 for f in aws)
    assert len(plan_for("hang", 60, 2)) == 2
    assert {f.kind.value for f in plan_for("node_loss", 60, 2)} == {"node_loss"}
    with pytest.raises(ValueError, match="scenario"):
        plan_for("meteor", 60, 2)


def test_cli_defaults_and_validation(tmp_path) -> None:
    quick = bench_recovery.parse_args(["--quick", "--mechanisms", "ours,torchrun",
                                       "--out", str(tmp_path)])
    assert (quick.sizes, quick.reps, quick.mechanisms) == (("tiny",), 1, ("ours", "torchrun"))
    full = bench_recovery.parse_args([])
    assert full.sizes == ("tiny", "200mb", "1gb") and (full.reps, full.side_reps) == (3, 1)
    assert full.side_sizes == ("tiny",)
    assert set(full.scenarios) == {"aws", "hang", "node_loss"}
    assert full.deadline is None and not full.resume
    assert (full.ref_reps, quick.ref_reps) == (3, 1)
    assert not full.keep_freed_memory
    assert bench_recovery.parse_args(["--keep-freed-memory"]).keep_freed_memory
    later = bench_recovery.parse_args(["--stop-at", "23:59"])
    assert 0 < later.deadline - time.time() <= 24 * 3600
    for bad in (["--mechanisms", "slurm"], ["--sizes", "huge"], ["--reps", "-1"],
                ["--side-reps", "0"], ["--resume"],
                ["--stop-at", "8pm"]):
        with pytest.raises(SystemExit):
            bench_recovery.parse_args(bad)


def test_torchft_detection_is_the_first_quorum_change() -> None:
    detect = QuorumChange()
    lines = ["got lighthouse quorum ... quorum_id: 1, participants: [a, b]",
             "should_commit=true", "got lighthouse quorum ... quorum_id: 1, participants: [a, b]",
             "got lighthouse quorum ... quorum_id: 2, participants: [a]"]
    assert [bool(detect(line)) for line in lines] == [False, False, False, True]


def test_every_mechanism_says_how_it_is_configured_and_what_it_cannot_run() -> None:
    for name in MECHANISMS:
        peer = make_peer(name)
        assert peer.name == name and peer.config
        for kind, reason in getattr(peer, "unsupported_reasons", {}).items():
            assert kind not in peer.supported_kinds and reason
    assert "NCCL" in make_peer("nvrx-inprocess").available()


def test_simulated_nodes_get_rays_default_share_of_the_machines_memory_as_object_store():
    import psutil  # noqa: PLC0415
    from harness.cluster import DESCRIPTION, node_object_store_bytes  # noqa: PLC0415

    total = psutil.virtual_memory().total
    assert node_object_store_bytes(2) == int(total * 0.3 / 2)
    assert node_object_store_bytes(0) == node_object_store_bytes(1) > 150 * 2**20
    assert "object store" in DESCRIPTION


def test_a_simulated_clusters_worker_logs_are_kept_per_session_and_empty_ones_skipped(
        tmp_path) -> None:
    from harness.cluster import keep_worker_logs  # noqa: PLC0415

    for session, name, text in (("session_a", "worker-1.err", "supervisor: node lost"),
                                ("session_a", "worker-2.err", ""),
                                ("session_a", "worker-3.out", "stdout"),
                                ("session_b", "worker-1.err", "writer: committed")):
        folder = tmp_path / "tmp" / session / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    dest = tmp_path / "run" / "ray_logs"
    assert keep_worker_logs(str(tmp_path / "tmp"), str(dest)) == [
        "session_a-worker-1.err", "session_b-worker-1.err"]
    assert (dest / "session_b-worker-1.err").read_text() == "writer: committed"
    assert keep_worker_logs(str(tmp_path / "missing"), str(tmp_path / "none")) == []
    assert not (tmp_path / "none").exists()


def test_the_replica_variant_is_ours_with_one_memory_replica_and_runs_only_where_named(
        tmp_path) -> None:
    from peers import SWEPT, family  # noqa: PLC0415

    replica, ours = make_peer("ours-replica"), make_peer("ours")
    workload = Workload(max_steps=10, checkpoint_interval=2, local_interval=1,
                        local_root=str(tmp_path), data_dir=str(tmp_path), run_dir=str(tmp_path))
    assert replica._checkpoint_config(workload).memory_replicas == 1
    assert ours._checkpoint_config(workload).memory_replicas == 0
    assert replica._checkpoint_config(workload).interval_steps == 2
    assert "replica" in replica.config and "replica" not in ours.config
    assert replica.supported_kinds == ours.supported_kinds
    assert family("ours-replica") == "fsdp"
    assert "ours-replica" not in SWEPT and "ours" in SWEPT
    assert bench_recovery.parse_args(["--mechanisms", "ours,ours-replica"]).mechanisms == (
        "ours", "ours-replica")


def test_a_sweep_stopped_at_its_deadline_resumes_without_running_anything_twice(
        tmp_path, monkeypatch) -> None:
    from sweep import recovery  # noqa: PLC0415
    from sweep.journal import JournalMismatch, SweepPaused  # noqa: PLC0415

    ran: list[str] = []

    def execute(mechanism, workload, *, phase, rep, timeout_s):
        os.makedirs(workload.run_dir, exist_ok=True)
        ran.append(os.path.basename(workload.run_dir))
        return {"mechanism": mechanism, "phase": phase, "rep": rep, "status": "failed",
                "error": f"run {len(ran)}", "notes": [], "faults_planned": 0,
                "intervals": {"durable": workload.checkpoint_interval, "local": 0},
                "usage": {"cpu_s": float(len(ran))}, "run_dir": workload.run_dir,
                "timeline": None}

    monkeypatch.setattr(recovery.runs, "execute", execute)
    monkeypatch.setattr(recovery, "generate_shards", lambda *a, **k: None)
    monkeypatch.setattr(recovery, "make_peer", _StubPeer)

    def sweep(out: str, *, resume: bool = False, deadline: float | None = None,
              reps: int = 2) -> recovery.SizeSweep:
        cfg = recovery.SweepConfig(mechanisms=("ours", "torchrun"), scenarios=("aws",),
                                   reps=reps, side_reps=1, quick=True,
                                   work_dir=str(tmp_path / "work" / os.path.basename(out)),
                                   resume=resume, deadline=deadline)
        return recovery.SizeSweep(cfg, "tiny", log=lambda line: None)

    whole = sweep(str(tmp_path / "whole")).run()
    everything, ran[:] = list(ran), []
    # calibration and its run without saves, references, 2 repetitions
    assert len(everything) == len(set(everything)) == 2 * 2 + 2 + 2 * 2
    assert everything[:2] == ["001-ours-calibration-nosave", "002-ours-calibration"]

    out = str(tmp_path / "split")
    first = sweep(out, deadline=1e12)
    real_time = recovery.time.time
    monkeypatch.setattr(recovery.time, "time",
                        lambda: 2e12 if len(ran) >= 3 else real_time())
    with pytest.raises(SweepPaused):
        first.run()
    monkeypatch.setattr(recovery.time, "time", real_time)
    assert len(ran) == 3
    with pytest.raises(JournalMismatch, match="--resume"):
        sweep(out)  # a journal is there: starting over needs another --out
    with pytest.raises(JournalMismatch, match="reps is 3 but the journal"):
        sweep(out, resume=True, reps=3)
    journal = tmp_path / "work" / "split" / "tiny" / "journal.jsonl"
    with open(journal, "a", encoding="utf-8") as f:
        f.write('{"key": "004-torchrun-ref')  # killed while appending a run: it runs again
    resumed = sweep(out, resume=True)
    split = resumed.run()
    assert ran == everything, "a run was repeated, skipped or reordered"
    assert [r["error"] for r in split["scenarios"]["aws"]["runs"]] == \
        [r["error"] for r in whole["scenarios"]["aws"]["runs"]]
    assert split["calibration"] == whole["calibration"]
    sittings = resumed.sittings()["sittings"]
    assert [s["runs"] for s in sittings] == [3, len(everything) - 3]


def test_reference_repetitions_interleave_with_the_aws_ones_and_give_the_median(
        tmp_path, monkeypatch) -> None:
    from sweep import recovery  # noqa: PLC0415
    from sweep.journal import Journal  # noqa: PLC0415

    order: list[str] = []
    steady = iter([0.30, 0.10, 0.20, 0.11, 0.50, 0.12])  # per reference run, in run order

    def execute(mechanism, workload, *, phase, rep, timeout_s):
        os.makedirs(workload.run_dir, exist_ok=True)
        order.append(f"{phase}{rep}:{mechanism}")
        return {"mechanism": mechanism, "phase": phase, "rep": rep,
                "status": "ok" if phase == "reference" else "failed", "error": None,
                "notes": [], "faults_planned": 0, "intervals": {"durable": 0, "local": 0},
                "usage": {}, "run_dir": workload.run_dir,
                "timeline": {"steady": next(steady)} if phase == "reference" else None}

    monkeypatch.setattr(recovery.runs, "execute", execute)
    monkeypatch.setattr(recovery.runs, "timeline_of", lambda r: r["timeline"])
    monkeypatch.setattr(recovery, "steady_step_s", lambda t: t["steady"])
    monkeypatch.setattr(recovery.runs, "score", lambda record, *a: None)
    compared: dict[tuple, str | None] = {}
    monkeypatch.setattr(recovery.runs, "compare", lambda record, *, own, family: compared.update(
        {(record["phase"], record["rep"], record["mechanism"]): own and os.path.basename(own)}))
    monkeypatch.setattr(recovery, "generate_shards", lambda *a, **k: None)
    monkeypatch.setattr(recovery, "make_peer", _StubPeer)
    cfg = recovery.SweepConfig(mechanisms=("torchft", "torchrun"), scenarios=("aws",), reps=2,
                               ref_reps=3, side_reps=1, quick=True, work_dir=str(tmp_path / "w"))
    doc = recovery.SizeSweep(cfg, "tiny", log=lambda line: None).run()
    refs = [o for o in order if o.startswith("reference")]
    assert order.index("reference1:torchrun") > order.index("aws0:torchft"), "not interleaved"
    assert order.index("reference2:torchft") > order.index("aws1:torchrun")
    assert len(refs) == 6 and refs[:2] == ["reference0:torchft", "reference0:torchrun"]
    # torchft's references ran 1st, 4th, 5th: 0.30, 0.11, 0.50; torchrun's 0.10, 0.20, 0.12
    assert doc["references"]["torchft"]["steady_step_s"] == 0.30
    assert doc["references"]["torchrun"]["steady_step_s"] == 0.12
    assert doc["yardstick"] == {"mechanism": "torchrun", "step_s": 0.12}
    assert [r["steady_step_s"] for r in doc["references"]["torchft"]["repetitions"]] == [
        0.30, 0.11, 0.50]
    assert doc["ref_reps"] == 3
    assert compared[("reference", 0, "torchft")] is None  # the first: nothing to compare with
    assert compared[("reference", 2, "torchft")] == compared[("aws", 1, "torchft")] \
        == "003-torchft-reference"  # after torchrun's two calibration runs (torchft has none)
    # a journal from before reference repetitions existed resumes as one repetition
    old = tmp_path / "old.journal.jsonl"
    settings = cfg.settings(10)
    del settings["ref_reps"]
    old.write_text(json.dumps({"settings": settings}) + "\n")
    Journal(str(old), dataclasses.replace(cfg, ref_reps=1).settings(10), resume=True)


def test_a_durable_saves_cost_is_measured_against_the_same_mechanism_saving_nothing(
        tmp_path, monkeypatch) -> None:
    """Each saving mechanism first runs the calibration length without saves; its steady step is
    what the calibration run's saves are charged against (a background save slows every step,
    so the saving run's own median would hide that), and the interval says so."""
    from sweep import recovery  # noqa: PLC0415

    def execute(mechanism, workload, *, phase, rep, timeout_s):
        os.makedirs(workload.run_dir, exist_ok=True)
        saving = bool(workload.checkpoint_interval)
        return {"mechanism": mechanism, "phase": phase, "rep": rep, "status": "ok",
                "error": None, "notes": [], "faults_planned": 0, "usage": {},
                "intervals": {"durable": workload.checkpoint_interval, "local": 0},
                "run_dir": workload.run_dir, "timeline": {"steady": 0.12 if saving else 0.10}}

    charged: list[tuple] = []

    def save_costs(timeline, steady, baseline=None):
        charged.append((steady, baseline))
        return 0.5, None

    monkeypatch.setattr(recovery.runs, "execute", execute)
    monkeypatch.setattr(recovery.runs, "timeline_of", lambda r: r["timeline"])
    monkeypatch.setattr(recovery, "steady_step_s", lambda t: t["steady"])
    monkeypatch.setattr(recovery, "save_costs", save_costs)
    monkeypatch.setattr(recovery.runs, "score", lambda record, *a: None)
    monkeypatch.setattr(recovery.runs, "compare", lambda record, *, own, family: None)
    monkeypatch.setattr(recovery, "generate_shards", lambda *a, **k: None)
    monkeypatch.setattr(recovery, "make_peer", _StubPeer)
    cfg = recovery.SweepConfig(mechanisms=("torchrun",), scenarios=("aws",), reps=1,
                               side_reps=1, quick=True, work_dir=str(tmp_path / "w"))
    doc = recovery.SizeSweep(cfg, "tiny", log=lambda line: None).run()
    assert charged == [(0.12, 0.10)]
    cal = doc["calibration"]["torchrun"]
    assert (cal["no_save_step_s"], cal["steady_step_s"], cal["durable_cost_s"]) == (
        0.10, 0.12, 0.5)
    assert "against a run without saves" in doc["intervals"]["torchrun"]["rule"]
