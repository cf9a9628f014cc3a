"""In-job respawn: dead or stuck ranks get new actors; the run ends bit-equal to no faults."""

from __future__ import annotations

import dataclasses

import pytest

import ray_resilience as rr
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import RestartLimitError, TrainingFailedError, WorkerDiedError
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

STEPS = 12


def _resilience(plan, progress_interval_s: float = 0.25, **in_job) -> rr.ResilienceConfig:
    in_job.setdefault("heartbeat_timeout_s", 10.0)
    return rr.ResilienceConfig(
        in_process=rr.InProcessConfig(interrupt_timeout_s=2.0),
        in_job=rr.InJobConfig(**in_job), fault_plan=plan, progress_interval_s=progress_interval_s,
        step_timeout_s=3.0, first_step_timeout_s=60.0)


@pytest.fixture(scope="module")
def clean(clean_run):
    return clean_run(2, STEPS)


@pytest.mark.timeout(300)
def test_killed_ranks_are_replaced(clean, token_data_dir, tmp_path):
    """SIGKILL of rank 1, then of rank 0, then an OOM kill of rank 1's replacement: one run."""
    plan = FaultPlan.explicit([Fault(step=3, rank=1, kind="sigkill"),
                                  Fault(step=6, rank=0, kind="sigkill"),
                                  Fault(step=8, rank=1, kind="oom")])
    resilience = dataclasses.replace(_resilience(plan), background_imports="after_first_step")
    result = workload.fit(token_data_dir, str(tmp_path), "killed", max_steps=STEPS,
                          resilience=resilience)
    assert result.ok, result.error
    assert [(f["cause"], f["ranks"]) for f in result.faults] == [
        ("actor_died", [1]), ("actor_died", [0]), ("oom", [1])]
    # Each respawn's next prestarted worker was asked for once its attempt had stepped, not
    # while the respawned rank started, loaded and took its first step.
    first_step = {}
    for m in result.metrics_history:
        first_step.setdefault(m["attempt"], m["time"])
    asked = result.control["background_imports"]["prestarts"]
    # (A kill before the supervisor heard of its attempt's first step leaves that attempt's
    # request to the next one: a worker asked for during a recovery would boot beside it.)
    assert asked and asked[-1]["attempt"] == 3, asked
    for p in asked:
        assert p["t"] >= first_step[p["attempt"]], (p, first_step)
    pids = [v["pid"] for v in result.return_values]
    assert not set(pids) & set(clean.worker_pids) and pids == result.worker_pids
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


@pytest.mark.timeout(300)
def test_restarts_resume_from_the_local_tier_redoing_at_most_one_step(clean, token_data_dir,
                                                                      tmp_path):
    """An exception (in-process restart), then a SIGKILL (respawn on this node), with a
    committed checkpoint every 5 steps: both resume from the local snapshot of the step they
    failed at (or the one before), not from step 5; the run ends bit-equal to no faults."""
    plan = FaultPlan.explicit([Fault(step=7, rank=1, kind="exception"),
                                  Fault(step=9, rank=1, kind="sigkill")])
    resilience = dataclasses.replace(_resilience(plan),
                                     checkpoint=CheckpointConfig(interval_steps=5,
                                                                 local_interval_steps=1))
    # 0.3 s per step: progress (forwarded every 0.25 s) reaches the supervisor between the two
    # faults; a step counts as done once every rank reported it, and reports still queued in a
    # SIGKILLed process are lost, which would leave the first recovery without its first step.
    result = workload.fit(token_data_dir, str(tmp_path), "local", max_steps=STEPS, sleep_s=0.3,
                          resilience=resilience)
    assert result.ok, result.error
    assert [f["cause"] for f in result.faults] == ["exception", "actor_died"]
    # The SIGKILLed rank's new process was booted for it after the first step and imported
    # torch in the background (preimport), or finished that while the rank waited.
    assert [(r["rank"], r["preimported"]) for r in result.faults[1]["replacements"]] == [(1, True)]
    faults = result.goodput.faults
    assert [f.checkpoint_tier for f in faults] == ["local", "local"], faults
    # The injected steps (the supervisor's `step_at_fault` may lag the ranks by a progress report).
    assert [f.resumed_from_step in (p.step - 1, p.step)
            for f, p in zip(faults, plan, strict=True)] == [True, True], faults
    assert all(f.steps_redone <= 1 for f in faults), [f.steps_redone for f in faults]
    assert [(v["tier"], v["resumed_from"] in (8, 9)) for v in result.return_values] \
        == [("local", True)] * 2
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


@pytest.mark.slow  # ~40 s; the default run respawns killed ranks (test_killed_ranks_are_replaced)
@pytest.mark.timeout(240)
def test_native_hang_escalates_to_respawn_onto_a_warm_spare(clean, token_data_dir, tmp_path):
    """A rank hung outside Python cannot be interrupted: it is killed and the warm spare started
    with the run takes its place. Once that attempt completed a step, a new spare starts in the
    freed bundle, and it takes over rank 1 again at a SIGKILL later on."""
    plan = FaultPlan.explicit([Fault(step=4, rank=1, kind="native_hang"),
                                  Fault(step=10, rank=1, kind="sigkill")])
    # No prestarted Ray workers: the oracle below is the process's creation time, and a
    # prestarted process the new spare may take was created before the hang.
    result = workload.fit(token_data_dir, str(tmp_path), "native", max_steps=STEPS, sleep_s=0.3,
                          resilience=_resilience(plan, num_spares=1, num_prestarted_workers=0))
    assert result.ok, result.error
    assert [(f["cause"], f["respawned"]) for f in result.faults] \
        == [("hang", [1]), ("actor_died", [1])]
    assert all(f.recovery_s is not None for f in result.goodput.faults)
    hang, kill = (f["t_fault"] for f in result.faults)
    # Rank 1 ends on the replenished spare: started after the hang, before the kill.
    assert hang < result.return_values[1]["started_at"] < kill, \
        (hang, result.return_values[1], kill)
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


@pytest.mark.slow  # ~30 s; a variant of the respawn test above
@pytest.mark.timeout(240)
def test_policy_all_replaces_every_rank(clean, token_data_dir, tmp_path):
    """Also with a 1 s heartbeat timeout: ranks send heartbeats while they finish their start-up
    warm-up (before, the two new ranks' prewarm, 1-2 s here, read as silence: "unresponsive"
    at every start until the restart limit)."""
    plan = FaultPlan.explicit([Fault(step=4, rank=1, kind="sigkill")])
    result = workload.fit(token_data_dir, str(tmp_path), "all", max_steps=STEPS,
                          resilience=_resilience(plan, policy="all", heartbeat_timeout_s=1.0,
                                                 progress_interval_s=0.1))
    assert result.ok, result.error
    assert [f["respawned"] for f in result.faults] == [[0, 1]]  # the survivor too, no other fault
    assert [v["attempt"] for v in result.return_values] == [1, 1]
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


@pytest.mark.slow  # ~10 s; the typed limit error runs by default below
@pytest.mark.timeout(120)
def test_dead_rank_without_in_job_fails_the_run(ray_session, token_data_dir, tmp_path):
    plan = FaultPlan.explicit([Fault(step=3, rank=1, kind="sigkill")])
    result = workload.fit(token_data_dir, str(tmp_path), "no-injob", max_steps=STEPS,
                          raise_on_failure=False,
                          resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(),
                                                         fault_plan=plan))
    assert isinstance(result.error, WorkerDiedError) and result.error.ranks == [1]


def _dies_on_start():
    import os  # noqa: PLC0415 - runs on the rank
    import signal  # noqa: PLC0415 - runs on the rank

    if rr.get_context().world_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    import torch.distributed as dist  # noqa: PLC0415 - runs on the rank

    dist.barrier()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("limits, setting", [
    pytest.param(dict(max_restarts=20, max_attempts_without_progress=1),
                 "InJobConfig.max_attempts_without_progress", marks=pytest.mark.slow),  # ~20 s
    # ~20 s; the default run stops a restart storm with the typed limit error in
    # tests/ray/test_inprocess.py (test_restart_storm_without_progress_stops).
    pytest.param(dict(max_restarts=1, max_attempts_without_progress=3),
                 "InJobConfig.max_restarts", marks=pytest.mark.slow),
], ids=["no-progress", "max-restarts"])
def test_rank_dying_after_every_respawn_stops_at_the_limit_with_typed_error(ray_session, tmp_path,
                                                                            limits, setting):
    """Rank 1 dies at every start (a storm): whichever limit comes first stops the run with a
    typed error naming that setting and the rank, after exactly one respawn."""
    trainer = rr.ResilientTrainer(
        _dies_on_start, scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="storm", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(
            in_process=rr.InProcessConfig(), first_step_timeout_s=60.0, step_timeout_s=30.0,
            in_job=rr.InJobConfig(**limits)))
    with pytest.raises(TrainingFailedError) as failed:
        trainer.fit()
    result = failed.value.result
    err = result.error
    assert isinstance(err, RestartLimitError), err
    assert err.setting == setting and err.ranks == [1]
    assert result.attempts == 2 and set(err.causes) == {"actor_died"}
