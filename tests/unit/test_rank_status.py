"""What the supervisor knows of each rank: heartbeats, phases, steps reached."""

from __future__ import annotations

import pytest

from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.recorders import TimelineRecorder
from ray_resilience._internal.supervisor.run_record import RunRecord
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.callbacks import RunStarted
from ray_resilience.policy import FaultCause, NoProgressLimit
from tests.support.recovery_states import fault, state

pytestmark = pytest.mark.timeout(30)


def test_rank_status_ignores_heartbeats_handled_out_of_order():
    status = RankStatus(rank=1)
    status.observe(0, 4, 100.0)
    status.set_phase("validation", sent_at=10.5)
    status.set_phase(None, sent_at=10.25)  # sent before the rank entered the phase
    assert status.phase == "validation"
    progress_at = status.progress_at
    status.observe(0, 3, 99.0)  # a late heartbeat from before step 4
    assert status.step == 4 and status.progress_at == progress_at
    status.set_phase(None, sent_at=20.0)  # the phase ended
    assert status.phase is None


def test_leaving_a_long_phase_restarts_the_silence_clock():
    status = RankStatus(rank=0)
    status.observe(0, 4, 100.0)
    status.set_phase("validation", sent_at=1.0)
    status.progress_at -= 30.0  # step 4 was 30 s ago: the rank has been validating since
    status.phase_seen_at -= 29.0
    status.set_phase(None, sent_at=2.0)  # validation over, step 5 not reported yet
    assert status.silent_for(status.phase_seen_at + 0.1) < 1.0


def test_progress_counts_a_step_one_rank_reported_before_its_peers_reports_arrive():
    """A rank reports step s and raises; its peer's report of s is still in flight when the
    fault is decided on. The attempt did progress: a restart storm must not be declared."""
    record = RunRecord(world_size=2)
    for attempt in range(4):
        report = {"rank": attempt % 2, "step": attempt + 1, "time": float(attempt)}
        record.add_reports(attempt, [report])
    assert record.global_step is None  # no step completed on every rank yet
    progress = tuple(record.reached_by_attempt.get(a) for a in range(4))
    assert progress == (1, 2, 3, 4)
    faults = tuple(fault("exception", a % 2, attempt=a) for a in range(4))
    assert NoProgressLimit(3)(state(*faults, progress=progress)) == []
    assert NoProgressLimit(3)(state(*faults, progress=(1, 1, 1, 1))) != []
    # The failing rank's outcome carries its newest step even if the heartbeat with it is late.
    record.note_reached(4, 5)
    record.note_reached(4, None)
    assert record.reached_by_attempt[4] == 5


def test_steps_the_lost_rank_did_not_report_count_once_its_peers_reported_them():
    """Rank 1 is SIGKILLed with its reports of steps 8-9 still unsent; rank 0 reported them.
    The recovery's first step must be its own (step 9 here), not the next fault's."""
    recorder = TimelineRecorder()  # fed synchronously here; the supervisor queues the events
    record = RunRecord(world_size=2, emit=lambda event: getattr(recorder, event.hook)(event))
    recorder.on_run_start(RunStarted(run_name="r", world_size=2, start_step=0, t=0.0))
    for step in range(1, 8):
        record.add_reports(0, [{"rank": r, "step": step, "time": float(step)} for r in (0, 1)])
    late = [{"rank": 0, "step": 8, "time": 8.0}, {"rank": 0, "step": 9, "time": 9.0}]
    record.add_reports(0, late)
    assert record.global_step == 7
    recorder.timeline.fault_detected("f1", t_fault=9.5, t_detect=9.6, step_at_fault=7, rank=1,
                                   cause="actor_died", kind="sigkill")
    assert record.close_attempt(0, lost=set()) == []  # nobody lost: nothing to infer
    record.add_reports(1, [{"rank": 0, "step": 1, "time": 1.0}])
    assert record.close_attempt(1, lost={0, 1}) == []  # nobody left who could have reported
    record.add_reports(0, late)
    assert record.close_attempt(0, lost={1}) == [8, 9]
    assert record.global_step == 9 and record.close_attempt(0, lost={1}) == []
    recorder.timeline.step_at_fault_is("f1", 9)
    lost = DetectedFault(cause=FaultCause.ACTOR_DIED, ranks=(1,), attempt=0, t_detect=9.6,
                         t_fault=9.5, step=9, fault_id="f1")
    record.expect_recovery(2, lost, "respawn")
    record.add_reports(2, [{"rank": r, "step": 10, "time": 12.0} for r in (0, 1)])
    fault = recorder.timeline.faults["f1"]
    assert fault.step_at_fault == 9 and fault.t_first_step == 12.0 and fault.resumed_from_step == 9


def test_a_late_batch_of_older_reports_does_not_replace_the_newest_metrics():
    """The last step's report travels with the attempt's outcome; a node agent's batch drained
    at teardown can bring older ones after it. `Result.metrics` stays the newest step (once seen
    in CI as step 11 of 12)."""
    record = RunRecord(world_size=1)
    record.add_reports(0, [{"rank": 0, "step": 12, "time": 12.0, "loss": 0.5}])
    record.add_reports(0, [{"rank": 0, "step": 10, "time": 10.0},
                           {"rank": 0, "step": 11, "time": 11.0}])
    assert record.last_metrics()["step"] == 12 and record.last_metrics()["loss"] == 0.5
    assert [r["step"] for r in record.recent_history()] == [10, 11, 12]
    record.add_reports(1, [{"rank": 0, "step": 5, "time": 20.0}])  # a restarted attempt
    assert (record.last_metrics()["attempt"], record.last_metrics()["step"]) == (1, 5)
