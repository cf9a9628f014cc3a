"""The supervisor's state machine on a dummy worker group: no Ray, no processes, a fake clock.

Each test scripts what every rank does per attempt (tests/support/dummy_group.py), runs the
supervisor to its end, and checks the transitions, the attempt counter and the outcome.
"""

from __future__ import annotations

import pytest

import ray_resilience as rr
from ray_resilience._internal.supervisor.state import RunState
from ray_resilience.errors import InsufficientResourcesError, RestartLimitError
from ray_resilience.policy import Decision, FaultCause, FaultRecord, RecoveryPolicy, RecoveryState
from tests.support.dummy_group import STEP_S, Act
from tests.support.supervisor_harness import both_rungs, make

pytestmark = pytest.mark.timeout(30)


START = [("scheduling", "starting"), ("starting", "running")]


def test_exception_restarts_in_process_and_the_supervisor_advances_the_attempt():
    # Rank 0 raises after step 3; rank 1 waits for it in the next collective.
    sup, group, events = make({(0, 0): Act("raise"), (0, 1): Act("hang")}, both_rungs())
    outcome = sup.run()
    assert events.transitions() == START + [("running", "restarting"), ("restarting", "running"),
                                            ("running", "finished")]
    assert sup.state is RunState.FINISHED and sup.attempt == 1 and outcome.attempts == 2
    assert outcome.state == "finished" and outcome.error is None
    (fault,) = outcome.faults
    assert (fault["cause"], fault["ranks"], fault["step"], fault["respawned"]) == (
        "exception", [0], 3, [])
    assert group.interrupted == [[1]] and group.killed == [] and group.replaced == []
    assert [s.attempt for s in group.launched[1]] == [1, 1]
    assert outcome.return_values == [b"r0", b"r1"]
    (done,) = events.of("on_recovery_done")
    assert (done.cause, done.mechanism, done.attempt, done.rollback_steps) == (
        FaultCause.EXCEPTION, "in-process", 1, 3)


@pytest.mark.parametrize("end, cause", [("die", "actor_died"), ("node_lost", "node_lost")])
def test_a_dead_rank_alone_is_respawned(end, cause):
    script = {(0, 0): Act("hang", steps=2), (0, 1): Act(end, steps=2)}
    sup, group, events = make(script, both_rungs())
    outcome = sup.run()
    assert events.transitions() == START + [("running", "respawning"), ("respawning", "running"),
                                            ("running", "finished")]
    assert sup.attempt == 1 and outcome.state == "finished"
    (fault,) = outcome.faults
    assert (fault["cause"], fault["ranks"], fault["respawned"]) == (cause, [1], [1])
    assert fault["replacements"][0]["pid"] == group.info[1]["pid"] == 2001
    assert group.replaced == [[1]] and group.killed == [1] and group.interrupted == [[0]]
    assert outcome.worker_pids == [1000, 2001]
    (done,) = events.of("on_recovery_done")
    assert (done.cause.value, done.mechanism, done.rank) == (cause, "respawn", 1)


def test_silence_past_the_step_timeout_is_a_hang_restarted_in_process():
    cfg = rr.ResilienceConfig(in_process=rr.InProcessConfig(), step_timeout_s=1.0,
                              first_step_timeout_s=2.0)
    sup, group, events = make({(0, 0): Act("hang", steps=2), (0, 1): Act("hang", steps=2)}, cfg)
    outcome = sup.run()
    assert events.transitions() == START + [("running", "restarting"), ("restarting", "running"),
                                            ("running", "finished")]
    (fault,) = outcome.faults
    assert (fault["cause"], fault["ranks"], fault["step"]) == ("hang", [0, 1], 2)
    assert "ResilienceConfig.step_timeout_s=1.0" in fault["error"]
    last_step = max(m["time"] for m in outcome.metrics_history if m["attempt"] == 0)
    silent = fault["t_detect"] - last_step  # on the fake clock: exact, no sleeps
    assert 1.0 - 1e-6 < silent <= 1.0 + 2 * cfg.monitor_interval_s
    assert group.interrupted == [[0, 1]] and sup.attempt == 1 and outcome.error is None


def test_the_restart_limit_fails_the_run_naming_the_setting():
    script = {(a, r): Act("raise" if r == 0 else "hang") for a in range(5) for r in (0, 1)}
    cfg = rr.ResilienceConfig(in_process=rr.InProcessConfig(max_restarts=2))
    sup, group, events = make(script, cfg)
    outcome = sup.run()
    restart = [("running", "restarting"), ("restarting", "running")]
    assert events.transitions() == START + restart * 2 + [("running", "failed")]
    assert sup.attempt == 2 and outcome.attempts == 3 and outcome.state == "failed"
    assert isinstance(outcome.error, RestartLimitError)
    assert outcome.error.setting == "InProcessConfig.max_restarts" and outcome.error.limit == 2
    assert "InProcessConfig.max_restarts=2" in str(outcome.error)
    assert [f["cause"] for f in outcome.faults] == ["exception"] * 3 and group.shut_down
    (end,) = events.of("on_run_end")
    assert end.state == "failed" and end.error is outcome.error


def test_no_capacity_for_a_replacement_shrinks_the_world_to_min_workers():
    script = {(0, 0): Act("hang", steps=1), (0, 1): Act("hang", steps=1),
              (0, 2): Act("die", steps=1)}
    sup, group, events = make(script, both_rungs(min_workers=2), world_size=3, no_capacity=(2,))
    outcome = sup.run()
    assert events.transitions() == START + [("running", "respawning"), ("respawning", "running"),
                                            ("running", "finished")]
    assert group.dropped == [2] and sup.record.world_size == 2
    assert [(s.rank, s.world_size, s.attempt) for s in group.launched[1]] == [(0, 2, 1), (1, 2, 1)]
    assert outcome.return_values == [b"r0", b"r1"] and outcome.faults[0]["respawned"] == [2]


def test_no_capacity_without_min_workers_fails_naming_the_setting():
    script = {(0, 0): Act("hang", steps=1), (0, 1): Act("die", steps=1)}
    sup, _, events = make(script, both_rungs(), no_capacity=(1,))
    outcome = sup.run()
    assert events.transitions()[-1] == ("respawning", "failed") and sup.attempt == 0
    assert isinstance(outcome.error, InsufficientResourcesError)
    assert "InJobConfig.min_workers" in str(outcome.error)


class RespawnEveryone(RecoveryPolicy):
    """A user policy: any fault replaces every rank, at most once."""

    def decide(self, fault: FaultRecord, state: RecoveryState) -> Decision:
        if state.num_respawns:
            return Decision.fail(RuntimeError("once is enough"))
        return Decision.respawn_ranks(tuple(range(state.world_size)))


def test_a_user_recovery_policy_replaces_the_default_ladder():
    cfg = rr.ResilienceConfig(in_process=rr.InProcessConfig(), recovery_policy=RespawnEveryone(),
                              in_job=rr.InJobConfig(num_prestarted_workers=0))
    script = {(0, 0): Act("raise"), (0, 1): Act("hang"), (1, 0): Act("raise"), (1, 1): Act("hang")}
    sup, group, events = make(script, cfg)
    outcome = sup.run()
    assert group.replaced == [[0, 1]]  # an exception alone would restart in-process by default
    assert events.transitions()[2:] == [("running", "respawning"), ("respawning", "running"),
                                        ("running", "failed")]
    assert str(outcome.error) == "once is enough" and outcome.attempts == 2


def test_abort_ends_the_run_before_it_starts():
    sup, group, events = make({}, both_rungs())
    sup.abort()
    outcome = sup.run()
    assert outcome.state == "aborted" and events.transitions() == [("scheduling", "aborted")]
    assert group.launched == [] and outcome.faults == []


def test_steps_are_reported_through_heartbeats_and_completed_globally():
    sup, _, events = make({}, both_rungs())
    outcome = sup.run()
    steps = [e.step for e in events.of("on_step_completed")]
    assert steps == [1, 2, 3] and outcome.metrics["step"] == 3
    assert outcome.goodput is not None and outcome.goodput.final_step == 3
    assert outcome.wall_s == pytest.approx(4 * STEP_S, abs=0.06)


def test_a_recovery_that_ends_before_its_agent_forwards_is_resumed_from_its_first_step():
    """Attempt 1 ends within one forwarding interval: its first reports still sit in the node's
    agent when the outcomes arrive with the rest. The agent is drained first, so the recovery
    resumed from before step 1, not from the outcome's first step (a tiers sitting recorded
    'fault at 114, resumed from 116' this way)."""
    sup, _, events = make({(0, 0): Act("raise"), (0, 1): Act("hang"),
                           (1, 0): Act("finish", steps=5, held=3),
                           (1, 1): Act("finish", steps=5, held=3)}, both_rungs())
    outcome = sup.run()
    assert outcome.state == "finished"
    (done,) = events.of("on_recovery_done")
    assert done.attempt == 1 and done.resumed_from_step == 0 and done.rollback_steps == 3
    assert [e.step for e in events.of("on_step_completed") if e.attempt == 1] == [1, 2, 3, 4, 5]
