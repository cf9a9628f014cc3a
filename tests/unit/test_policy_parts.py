"""The recovery parts and the default policy on frozen states, without Ray or actors."""

from __future__ import annotations

import pytest

import ray_resilience as rr
from ray_resilience.errors import RestartLimitError
from ray_resilience.policy import (
    Action,
    Compose,
    FaultCounter,
    FaultRecord,
    MaxAttempts,
    NodeExclusion,
    NoProgressLimit,
    RecoveryState,
)
from tests.support.recovery_states import decide, fault, state

pytestmark = pytest.mark.timeout(30)


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
