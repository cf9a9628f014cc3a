"""The control plane's pieces without Ray: heartbeats folded per node, the run record's bounded
memory, liveness from activity, the metrics log, and the activity probe on a real thread."""

from __future__ import annotations

import dataclasses
import json
import threading
import tracemalloc

import pyarrow.fs as pafs
import pytest
import torch

import ray_resilience as rr
from ray_resilience._internal.attempt import AttemptOutcome
from ray_resilience._internal.constants import DEFAULT_ERROR_GRACE_S
from ray_resilience._internal.control.batch import (
    PARK_LIMIT_S,
    BatchOrder,
    ProgressBatch,
    ProgressFolder,
)
from ray_resilience._internal.control.metrics_log import MetricsLog, read_newest
from ray_resilience._internal.control.node_agent import MAX_BATCHES_PER_S, forward_interval_s
from ray_resilience._internal.rank.errors_capture import raised_in_distributed
from ray_resilience._internal.rank.liveness import ActivityProbe
from ray_resilience._internal.supervisor.checkpoints import restore_seconds
from ray_resilience._internal.supervisor.detection import FaultDetector
from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.recorders import RecoveryPhase
from ray_resilience._internal.supervisor.run_record import RECENT_REPORTS, RunRecord
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.callbacks import RecoveryDone
from ray_resilience.errors import HangError, WorkerError, format_ranks
from ray_resilience.policy.state import FaultCause
from ray_resilience.timeouts import LearnedTimeouts
from tests.support.dummy_group import FakeClock

pytestmark = pytest.mark.timeout(60)


def _report(rank: int, step: int) -> dict:
    return {"loss": 1.0 / step, "rank": rank, "step": step, "time": float(step)}


def test_a_node_batch_keeps_each_ranks_newest_beat_and_groups_reports_per_step():
    folder = ProgressFolder("node-a")
    for sent in (1.0, 2.0):
        for rank in (0, 1):
            folder.add(rank, 0, int(sent), sent, [_report(rank, int(sent))], [], sent,
                       [{"phase": "in_phase", "name": "validation", "t_start": 0.5}], activity=7)
    batch = folder.take()
    assert sorted((b.rank, b.step, b.phase, b.activity) for b in batch.beats) == [
        (0, 2, "validation", 7), (1, 2, "validation", 7)]
    assert {k: sorted(v[0]) for k, v in batch.steps.items()} == {(0, 1): [0, 1], (0, 2): [0, 1]}
    assert [m["step"] for m in batch.rank0] == [1, 2] and batch.num_reports == 4
    lines = [json.loads(x) for x in batch.log.decode().splitlines()]
    assert {(m["rank"], m["step"], m["attempt"]) for m in lines} == {
        (r, s, 0) for r in (0, 1) for s in (1, 2)}
    assert batch.intervals == {"step": (2, 1.0)}  # each rank's step 1 -> step 2
    assert not folder.take()  # the next batch starts empty


@pytest.mark.timeout(180)  # about 3 s on an idle core; tracemalloc slows it on a busy one
def test_the_run_record_stays_bounded_over_a_hundred_thousand_reports():
    world, steps = 100, 1_000
    record = RunRecord(world, clock=FakeClock())
    record.start_attempt(0)
    completed = []
    record.emit = lambda event: completed.append(event)

    def feed(first: int, last: int) -> None:
        folder = ProgressFolder("n")
        for step in range(first, last):  # a batch per 10 steps, as an agent's interval holds
            folder.add_reports(0, [_report(r, step) for r in range(world)])
            if step % 10 == 9:
                record.fold(folder.take())
        record.fold(folder.take())

    feed(1, 200)  # 19,900 reports: warm every structure up
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    feed(200, steps + 1)  # 80,100 more
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert record.num_reports == world * steps == 100_000
    assert record.global_step == steps and len(completed) == steps
    assert len(record.recent) == RECENT_REPORTS and record.recent[-1]["step"] == steps
    assert not record._pending
    assert grown < 512 * 1024, f"the record grew by {grown} bytes over 80,100 reports"


def test_activity_is_liveness_between_reports_and_its_absence_is_silence():
    status = RankStatus(0, progress_at=0.0, heartbeat_at=0.0)
    status.reset(0, 0.0)
    status.observe(0, 5, 1.0, now=1.0, activity=1)
    status.observe(0, 5, 1.0, now=50.0, activity=2)  # no report for 49 s, but it moved
    assert status.silent_for(60.0) == pytest.approx(10.0)
    status.observe(0, 5, 1.0, now=90.0, activity=2)  # heartbeats go on, the thread stopped
    assert status.silent_for(90.0) == pytest.approx(40.0) and status.heartbeat_at == 90.0


def test_an_agent_restart_excuses_its_ranks_silence():
    clock = FakeClock()
    record = RunRecord(2, clock=clock)
    record.start_attempt(0)
    clock.advance(8.0)
    record.excuse([1])
    statuses = record.rank_statuses()
    now = clock.monotonic()
    assert now - statuses[0].heartbeat_at == 8.0 and now - statuses[1].heartbeat_at == 0.0


def test_the_metrics_log_keeps_every_report_and_reads_back_the_newest(tmp_path):
    fs = pafs.LocalFileSystem()
    log = MetricsLog(fs, str(tmp_path / "run"))  # the run folder is created on first write
    folder = ProgressFolder("n")
    for step in range(1, 101):
        folder.add_reports(0, [_report(r, step) for r in range(3)])
        log.append(folder.take().log)
        if step % 10 == 0:
            log.flush()
    log.close()
    with open(log.path) as f:
        assert sum(1 for _ in f) == 300
    newest = read_newest(fs, log.path, 6)
    assert [(m["step"], m["rank"]) for m in newest] == [(99, 0), (99, 1), (99, 2),
                                                          (100, 0), (100, 1), (100, 2)]
    assert read_newest(fs, str(tmp_path / "absent.jsonl"), 5) == []


def test_the_probe_counts_a_thread_that_moves_and_not_one_that_is_blocked():
    reached_b, release_a, release_b = threading.Event(), threading.Event(), threading.Event()

    def training() -> None:
        release_a.wait()
        reached_b.set()
        release_b.wait()

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    probe = ActivityProbe()
    assert probe.sample() is None  # nothing watched yet
    probe.watch(thread.ident)
    first = probe.sample()
    assert probe.sample() == probe.sample() == first  # blocked on one line: no movement
    release_a.set()
    reached_b.wait(10)
    moved = probe.sample()
    assert moved == first + 1 and probe.sample() == moved
    release_b.set()
    thread.join(10)


def test_the_probe_counts_cpu_work_on_one_line_as_movement():
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set(): pass  # noqa: E701 - one line: only CPU time can show the work

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    probe = ActivityProbe()
    probe.watch(thread.ident)
    first = probe.sample()
    deadline = threading.Event()
    moved = first
    for _ in range(200):  # until the thread has had 5 ms of CPU; no timing asserted
        deadline.wait(0.01)
        moved = probe.sample()
        if moved > first:
            break
    stop.set()
    thread.join(10)
    assert moved > first


def test_cpu_work_at_one_stack_stops_counting_once_it_outlasts_the_cap():
    """A thread spinning on one line (a livelock, a CUDA spin-wait on a hung kernel) counts as
    moving for `busy_cap_s` only; then its silence runs, though it still burns CPU."""
    stop = [False]

    def spin() -> None:  # no call in the loop: every sample sees the same stack
        while not stop[0]: pass  # noqa: E701 - one line: only CPU time can show the work

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    probe = ActivityProbe(busy_cap_s=0.2)
    probe.watch(thread.ident)
    first = probe.sample()
    counts, pause = [], threading.Event()
    for _ in range(1000):  # up to ~10 s: until 50 samples in a row saw no movement
        pause.wait(0.01)
        counts.append(probe.sample())
        if len(counts) > 50 and counts[-1] == counts[-51] and counts[-1] > first:
            break
    still_spinning = thread.is_alive()
    stop[0] = True
    thread.join(10)
    assert counts[-1] > first  # it counted while within the cap
    assert counts[-1] == counts[-51] and still_spinning  # and not after, while still busy


def test_rank_lists_in_messages_are_ranges_so_thousands_of_ranks_stay_one_line():
    assert format_ranks([0]) == "[0]" and format_ranks([3, 1]) == "[1, 3]"
    assert format_ranks([*range(16, 4096), 7, 5, 6, 9, 10]) == "[5-7, 9, 10, 16-4095]"
    error = HangError(range(4096), 2, 13.0, "InJobConfig.heartbeat_timeout_s", 10.0)
    assert str(error).startswith("ranks [0-4095] made no progress for 13.0 s in attempt 2")


def test_agents_forward_less_often_past_the_supervisors_batch_budget():
    assert forward_interval_s(0.25, 16) == 0.25
    assert forward_interval_s(0.25, 512) == 512 / MAX_BATCHES_PER_S > 0.25


def test_a_lost_heartbeat_needs_one_first_a_starting_rank_waits_for_its_first_step():
    cfg = rr.ResilienceConfig(in_job=rr.InJobConfig(heartbeat_timeout_s=5.0),
                              step_timeout_s=30.0, first_step_timeout_s=60.0)
    clock = FakeClock()
    record = RunRecord(2, clock=clock)
    record.start_attempt(0)
    timeouts = LearnedTimeouts(step_s=cfg.step_timeout_s, first_step_s=60.0, phases_s={},
                               adaptive=None)
    detector = FaultDetector(None, cfg, timeouts, clock)
    clock.advance(20.0)
    record.heartbeat(0, 0, None, None, [], [], 0.0, [], 1)  # rank 1 still starting (no beat)
    assert detector.silence(record.rank_statuses(), 0) is None
    clock.advance(6.0)
    record.heartbeat(1, 0, None, None, [], [], 0.0, [], 1)
    fault = detector.silence(record.rank_statuses(), 0)
    assert fault is not None and fault.cause.value == "unresponsive" and fault.ranks == (0,)


class CountingTimeouts(LearnedTimeouts):
    """LearnedTimeouts that counts how often a limit is looked up."""

    def __init__(self) -> None:
        super().__init__(step_s=3.0, first_step_s=60.0, phases_s={}, adaptive=None)
        self.lookups = 0

    def limit(self, name: str) -> float:
        self.lookups += 1
        return super().limit(name)


def test_the_silence_scan_is_linear_in_ranks_one_limit_per_phase():
    """At thousands of ranks the scan runs every few monitor intervals; it looked the limit up
    per rank and asked, per rank, whether any rank was in a phase (quadratic: 0.7 s a scan at
    4,096 ranks). A hung rank among 4,096 is still found, with its setting."""
    cfg = rr.ResilienceConfig(in_job=rr.InJobConfig(heartbeat_timeout_s=10.0),
                              step_timeout_s=3.0, first_step_timeout_s=60.0)
    clock = FakeClock()
    record = RunRecord(4096, clock=clock)
    record.start_attempt(0)
    timeouts = CountingTimeouts()
    detector = FaultDetector(None, cfg, timeouts, clock)
    for step in (1, 2):
        clock.advance(1.0)
        for rank in range(4096):
            if rank != 77 or step == 1:
                record.ranks[rank].observe(0, step, float(step), clock.monotonic())
    clock.advance(2.5)  # rank 77 silent 3.5 s > 3 s; the others 2.5 s, within the 1 s grace
    fault = detector.silence(record.rank_statuses(), 0)
    assert timeouts.lookups == 1  # one phase ("step") in force
    assert fault is not None and fault.cause.value == "hang" and 77 in fault.ranks
    assert fault.error.setting == "ResilienceConfig.step_timeout_s"


def test_a_large_world_scans_for_silence_every_few_intervals_a_small_one_every_interval():
    cfg = rr.ResilienceConfig()
    clock = FakeClock()
    detector = FaultDetector(None, cfg, LearnedTimeouts(step_s=3.0, first_step_s=60.0,
                                                        phases_s={}, adaptive=None), clock)
    assert [detector.silence_due(2) for _ in range(3)] == [True] * 3  # the clock stands still
    clock.advance(1.0)
    assert detector.silence_due(4096)
    clock.advance(cfg.monitor_interval_s)
    assert not detector.silence_due(4096)
    clock.advance(0.25 - cfg.monitor_interval_s)
    assert detector.silence_due(4096)
    clock.advance(1.0)
    assert detector.silence_due(100_000) and not detector.silence_due(100_000)


def test_a_beat_that_waited_in_its_agent_is_dated_when_the_agent_got_it():
    """Agents of a large run forward every few seconds; a beat's age in the batch keeps that
    wait out of the rank's silence, and an older batch arriving late moves nothing back."""
    clock = FakeClock()
    record = RunRecord(2, clock=clock)
    record.start_attempt(0)
    folder = ProgressFolder("n1")
    folder.add(0, 0, 4, 1.0, [], [], 1.0, [], 7)
    clock.advance(10.0)
    batch = folder.take()
    (beat,) = batch.beats
    record.fold(dataclasses.replace(batch, beats=[dataclasses.replace(beat, age=3.0)]))
    status = record.rank_statuses()[0]
    assert status.step == 4
    assert record.heartbeat_age(0, clock.monotonic()) == pytest.approx(3.0)
    assert status.silent_for(clock.monotonic()) == pytest.approx(3.0)
    late = ProgressBatch("n1", beats=[dataclasses.replace(beat, age=8.0, sent_at=0.5)])
    record.fold(late)
    assert record.heartbeat_age(0, clock.monotonic()) == pytest.approx(3.0)


def _agent_batch(source: str, seq: int, attempt: int, steps: range,
                 load: bool = False) -> ProgressBatch:
    folder = ProgressFolder("n1")
    for rank in (0, 1):
        events = [{"phase": "checkpoint_load", "rank": rank, "t_start": 1.0, "t_end": 1.5,
                   "tier": "local", "step": steps.start - 1}] if load else []
        folder.add(rank, attempt, steps[-1], 0.1, [_report(rank, s) for s in steps], [],
                   float(steps[-1]), events)
    return dataclasses.replace(folder.take(), source=source, seq=seq)


def _load_batch(seq: int, attempt: int, loads: dict[int, tuple[float, str, bool]],
                steps: range | None = None) -> ProgressBatch:
    """One agent batch: each rank's load (rank -> end time, tier, replica), then `steps`."""
    folder = ProgressFolder("n1")
    for rank, (t_end, tier, replica) in loads.items():
        events = [{"phase": "checkpoint_load", "rank": rank, "t_start": 1.0, "t_end": t_end,
                   "tier": tier, "replica": replica, "step": 9}]
        reports = [_report(rank, s) for s in steps] if steps else []
        folder.add(rank, attempt, steps[-1] if steps else None, 0.1, reports, [], t_end, events)
    return dataclasses.replace(folder.take(), source="a", seq=seq)


def _recovering_record(events: list) -> RunRecord:
    record = RunRecord(2, clock=FakeClock(), emit=events.append)
    record.start_attempt(0)
    record.fold(dataclasses.replace(_agent_batch("a", 1, 0, range(1, 11)), source="a", seq=1))
    record.expect_recovery(1, DetectedFault(cause=FaultCause.NODE_LOST, ranks=(1,), attempt=0,
                                            t_detect=0.0, step=11, fault_id="f1"), "respawn")
    record.start_attempt(1)
    return record


def test_a_recoverys_load_is_the_slowest_ranks_and_names_a_replica():
    """A lost node's rank reads its shard from another node's writer (a replica) while the
    survivor reads its own writer's memory at once: the recovery waited for the replica."""
    events: list = []
    record = _recovering_record(events)
    record.fold(_load_batch(2, 1, {0: (1.2, "memory", False)}))
    assert not [e for e in events if isinstance(e, RecoveryPhase)]  # rank 1 still loading
    record.fold(_load_batch(3, 1, {1: (4.0, "memory", True)}, steps=range(10, 11)))
    (load,) = [e for e in events if isinstance(e, RecoveryPhase)]
    assert (load.tier, load.t_start, load.t_end) == ("replica", 1.0, 4.0)
    assert restore_seconds(list(record.loads)) == {"memory": [pytest.approx(0.2)],
                                                   "replica": [pytest.approx(3.0)]}
    # DCP's load ends in a collective: both ranks end together, the survivor a hair later.
    events.clear()
    record = _recovering_record(events)
    record.fold(_load_batch(2, 1, {1: (4.0, "memory", True), 0: (4.001, "memory", False)}))
    (load,) = [e for e in events if isinstance(e, RecoveryPhase)]
    assert (load.tier, load.t_end) == ("replica", 4.001)


def test_a_recoverys_load_is_recorded_at_its_first_step_when_a_ranks_load_never_came():
    events: list = []
    record = _recovering_record(events)
    record.fold(_load_batch(2, 1, {0: (2.5, "storage", False)}))
    record.fold(dataclasses.replace(_agent_batch("a", 3, 1, range(10, 12)), source="a", seq=3))
    (load,) = [e for e in events if isinstance(e, RecoveryPhase)]
    (done,) = [e for e in events if isinstance(e, RecoveryDone)]
    assert load.tier == "storage" and load.t_end == 2.5
    assert events.index(load) < events.index(done)


def test_an_agents_batches_fold_in_the_order_it_sent_them_whatever_thread_runs_first():
    """The supervisor folds batches on several threads: the later batch of a recovery (its
    step 117) taking the lock before the earlier one (the load, steps 114-116) must not make
    the fault's record say it resumed from 116 with no load, as a tiers sitting once showed."""
    clock = FakeClock()
    events: list = []
    record = RunRecord(2, clock=clock, emit=events.append)
    record.start_attempt(0)
    record.fold(_agent_batch("a", 1, 0, range(1, 114)))
    fault = DetectedFault(cause=FaultCause.EXCEPTION, ranks=(1,), attempt=0, t_detect=0.0,
                          step=114, fault_id="f1")
    record.expect_recovery(1, fault, "in_process")
    record.start_attempt(1)
    earlier = _agent_batch("a", 2, 1, range(114, 117), load=True)
    later = _agent_batch("a", 3, 1, range(117, 118))
    record.fold(later)
    assert record.global_step == 113  # held back until the batch before it came
    record.fold(earlier)
    assert record.global_step == 117
    (done,) = [e for e in events if isinstance(e, RecoveryDone)]
    assert done.resumed_from_step == 113 and done.rollback_steps == 1
    (load,) = [e for e in events if isinstance(e, RecoveryPhase)]
    assert load.tier == "local" and events.index(load) < events.index(done)


def test_a_batch_waits_for_a_missing_one_at_most_the_park_limit_and_a_drain_releases_all():
    order = BatchOrder()
    b = {seq: ProgressBatch("n1", num_reports=1, source="a", seq=seq) for seq in range(1, 6)}
    assert order.arrive(b[1], 0.0) == [b[1]]
    assert order.arrive(b[3], 0.1) == []  # 2 is missing
    assert order.arrive(b[4], 0.2) == []
    assert order.arrive(b[5], 0.1 + PARK_LIMIT_S) == [b[3], b[4], b[5]]  # given up on 2
    assert order.arrive(b[2], 5.0) == [b[2]]  # late: folded as it comes
    other = ProgressBatch("n2", num_reports=1, source="b", seq=2)
    assert order.arrive(other, 6.0) == [] and order.release() == [other]
    assert order.release() == []
    direct = ProgressBatch("direct", num_reports=1)
    assert order.arrive(direct, 7.0) == [direct]  # folded in place, never numbered


class _RunFutures:
    """Run futures that finish at given times (seconds after the first wait), and every wait's
    timeout."""

    def __init__(self, done_at: dict[str, float], outcomes: dict[str, AttemptOutcome]) -> None:
        self.done_at, self.outcomes, self.now, self.waits = done_at, outcomes, 0.0, []

    def wait(self, refs, timeout_s, *, num_returns=1):
        self.waits.append(timeout_s)
        due = sorted(self.done_at[r] for r in refs)
        self.now = max(self.now, min(due[num_returns - 1], self.now + timeout_s))
        return [r for r in refs if self.done_at[r] <= self.now]

    def outcome(self, ref, rank):
        return self.outcomes[ref]


def _failed(rank: int, failed_at: float, in_distributed: bool) -> AttemptOutcome:
    return AttemptOutcome(rank=rank, attempt=0, status="failed", failed_at=failed_at,
                          in_distributed=in_distributed, error=WorkerError(
                              ranks=[rank], attempt=0, exc_type="RuntimeError",
                              message="closed" if in_distributed else "bad batch",
                              traceback=""))


def test_an_error_from_the_users_code_is_reported_at_once_a_collectives_after_a_grace():
    """A rank's own exception is the cause: no wait. A failed collective may be a peer's
    failure seen from here: the supervisor waits a moment, and the peer's earlier error is the
    one reported."""
    cfg = rr.ResilienceConfig()
    timeouts = LearnedTimeouts(step_s=30.0, first_step_s=60.0, phases_s={}, adaptive=None)
    own = _RunFutures({"a": 0.01, "b": 0.03}, {"a": _failed(1, 10.0, False),
                                               "b": _failed(0, 10.02, True)})
    found = FaultDetector(own, cfg, timeouts, FakeClock()).collect({"a": 1, "b": 0}, 0)
    assert found.fault.ranks == (1,) and own.waits == [cfg.monitor_interval_s, 0]
    assert found.done == ("a",)  # the peer is interrupted by the repair, not waited for
    seen = _RunFutures({"a": 0.03, "b": 0.01}, {"a": _failed(1, 10.0, False),
                                                "b": _failed(0, 10.02, True)})
    found = FaultDetector(seen, cfg, timeouts, FakeClock()).collect({"a": 1, "b": 0}, 0)
    assert seen.waits == [cfg.monitor_interval_s, 0, DEFAULT_ERROR_GRACE_S]
    assert set(found.done) == {"a", "b"}
    assert found.fault.error.message == "bad batch" and found.fault.error.rank == 1


def test_an_exception_raised_in_torch_distributed_is_told_from_the_users_own():
    with pytest.raises(ValueError) as from_dist:  # no process group: raised in c10d's code
        torch.distributed.barrier()
    assert raised_in_distributed(from_dist.value)
    assert raised_in_distributed(torch.distributed.DistNetworkError("peer gone"))
    try:
        try:
            torch.distributed.barrier()
        except ValueError as exc:
            raise KeyError("wrapped by the user") from exc
    except KeyError as wrapped:
        assert raised_in_distributed(wrapped)
    with pytest.raises(ZeroDivisionError) as own:
        _ = 1 / 0
    assert not raised_in_distributed(own.value)
