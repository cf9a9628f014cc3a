"""The recovery parts and the failure policy on frozen states, without Ray or actors."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys

import pytest

import ray_resilience as rr
from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.recorders import TimelineRecorder
from ray_resilience._internal.supervisor.run_record import RunRecord
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.callbacks import RunStarted
from ray_resilience.errors import RestartLimitError
from ray_resilience.policy import (
    Action,
    Compose,
    DefaultRecoveryPolicy,
    FaultCause,
    FaultCounter,
    FaultRecord,
    MaxAttempts,
    NodeExclusion,
    NoProgressLimit,
    RecoveryState,
)

pytestmark = pytest.mark.timeout(30)


def fault(cause: str, *ranks: int, attempt: int = 0,
          respawned: tuple[int, ...] = ()) -> FaultRecord:
    return FaultRecord(cause=cause, ranks=ranks, attempt=attempt, step=None, respawned=respawned)


def state(*faults: FaultRecord, progress: tuple = (), world_size: int = 2) -> RecoveryState:
    return RecoveryState(attempt=len(faults), world_size=world_size, faults=faults,
                         progress_by_attempt=progress
                         or tuple(range(10, 10 * (len(faults) + 1), 10)))


def decide(current: RecoveryState, cfg: rr.ResilienceConfig, num_respawns: int):
    """The default policy's decision on the last fault of `current`."""
    policy = DefaultRecoveryPolicy(cfg.in_process, cfg.in_job)
    return policy.decide(current.current, dataclasses.replace(current, num_respawns=num_respawns))


def test_fault_counter_sends_a_rank_past_its_limit_to_a_new_process():
    faults = [fault("exception", 1) for _ in range(4)]
    assert FaultCounter(max_faults_per_rank=3)(state(*faults[:3])) == []
    assert FaultCounter(max_faults_per_rank=3)(state(*faults)) == [1]


def test_fault_counter_counts_per_process_a_respawned_rank_starts_again():
    faults = (fault("exception", 1), fault("actor_died", 1, respawned=(1,)),
              fault("exception", 1), fault("exception", 1), fault("exception", 1))
    assert FaultCounter(max_faults_per_rank=3)(state(*faults)) == []  # 3 since the new process
    assert FaultCounter(max_faults_per_rank=3)(state(*faults, fault("exception", 1))) == [1]


def test_max_attempts_and_no_progress_name_their_setting():
    faults = [fault("exception", 0)] * 3
    assert MaxAttempts(2)(state(*faults)) == [("InProcessConfig.max_restarts", 2)]
    assert MaxAttempts(3)(state(*faults)) == []
    stalled = state(*faults, progress=(10, 20, 20, 20))
    assert NoProgressLimit(2)(stalled) == [("InProcessConfig.max_attempts_without_progress", 2)]
    assert NoProgressLimit(2)(state(*faults, progress=(10, 20, 30, 40))) == []


def test_compose_unions_in_order_without_duplicates():
    parts = Compose(lambda s: [2, 1], lambda s: [1, 3], lambda s: None)
    assert parts(state(fault("exception", 0))) == [2, 1, 3]


def test_policy_exception_restarts_in_process_and_a_dead_rank_is_respawned():
    cfg = rr.ResilienceConfig.default()
    soft = decide(state(fault("exception", 1)), cfg, num_respawns=0)
    assert (soft.action, soft.respawn) == (Action.RESTART, ())
    dead = decide(state(fault("actor_died", 1)), cfg, num_respawns=0)
    assert (dead.action, dead.respawn) == (Action.RESPAWN, (1,))
    lost = decide(state(fault("node_lost", 0)), cfg, num_respawns=0)
    assert (lost.action, lost.respawn) == (Action.RESPAWN, (0,))


def test_policy_all_replaces_every_rank_and_the_respawn_limit_stops_the_run():
    cfg = rr.ResilienceConfig.default(in_job=rr.InJobConfig(policy="all", max_restarts=2))
    assert decide(state(fault("oom", 0)), cfg, num_respawns=0).respawn == (0, 1)
    stop = decide(state(fault("oom", 0)), cfg, num_respawns=2)
    assert stop.action is Action.FAIL and isinstance(stop.error, RestartLimitError)
    assert stop.error.causes == ["oom"] and type(stop.error.causes[0]) is str
    assert "InJobConfig.max_restarts" in str(stop.error)


def test_policy_without_in_job_fails_on_a_lost_process():
    cfg = rr.ResilienceConfig(in_process=rr.InProcessConfig())
    assert decide(state(fault("actor_died", 1)), cfg, num_respawns=0).action is Action.FAIL


def test_node_exclusion_counts_process_faults_per_node_not_exceptions():
    on_a = [FaultRecord(cause=c, ranks=(1,), attempt=i, step=None, nodes=("A",))
            for i, c in enumerate(("actor_died", "exception", "oom"))]
    two_on_a = state(*on_a)
    assert NodeExclusion(max_node_faults=1)(two_on_a) == ["A"]  # 2 process faults, 1 exception
    assert NodeExclusion(max_node_faults=2)(two_on_a) == []
    done = RecoveryState(attempt=3, world_size=2, faults=two_on_a.faults,
                         progress_by_attempt=(1, 2, 3), excluded_nodes=frozenset({"A"}))
    assert NodeExclusion(max_node_faults=1)(done) == []  # already excluded


def test_policy_excludes_the_node_and_moves_every_rank_on_it():
    cfg = rr.ResilienceConfig.default(in_job=rr.InJobConfig(max_node_faults=1))
    faults = [FaultRecord(cause="actor_died", ranks=(1,), attempt=i, step=None, nodes=("A",),
                          respawned=(1,) if i == 0 else ()) for i in range(2)]
    current = RecoveryState(attempt=1, world_size=3, faults=tuple(faults),
                            progress_by_attempt=(5, 9), rank_nodes=("B", "A", "A"))
    decision = decide(current, cfg, num_respawns=1)
    assert decision.exclude_nodes == ("A",) and decision.respawn == (1, 2)
    first = RecoveryState(attempt=0, world_size=3, faults=tuple(faults[:1]),
                          progress_by_attempt=(5,), rank_nodes=("B", "A", "A"))
    assert decide(first, cfg, num_respawns=0).exclude_nodes == ()


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_max_node_faults_is_checked(value):
    with pytest.raises(ValueError, match="InJobConfig.max_node_faults"):
        rr.InJobConfig(max_node_faults=value)


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


@pytest.mark.parametrize("module", ["ray_resilience", "ray_resilience.callbacks",
                                    "ray_resilience.checkpoint",
                                    "ray_resilience.goodput", "ray_resilience.policy",
                                    "ray_resilience.testing"])
def test_public_names_resolve(module):
    package = importlib.import_module(module)
    assert package.__all__ == sorted(package.__all__, key=str.lower)
    assert all(getattr(package, name) is not None for name in package.__all__)


def test_control_plane_imports_no_torch():
    """The supervisor, the commit coordinator and the writers start without torch (3-5 s each)."""
    code = ("import sys, ray_resilience._internal.supervisor.supervisor, ray_resilience.trainer, "
            "ray_resilience._internal.checkpoint.service.coordinator, "
            "ray_resilience._internal.checkpoint.service.writer, "
            "ray_resilience._internal.rank.actor; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
