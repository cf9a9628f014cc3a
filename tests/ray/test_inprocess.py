"""In-process restart: faults recovered in the same processes, ending bit-equal to no faults."""

from __future__ import annotations

import pytest

import ray_resilience as rr
from ray_resilience.errors import RestartLimitError, TrainingFailedError
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

STEPS = 12


def _resilience(plan, **kwargs) -> rr.ResilienceConfig:
    kwargs.setdefault("step_timeout_s", 3.0)
    kwargs.setdefault("first_step_timeout_s", 60.0)
    return rr.ResilienceConfig(in_process=kwargs.pop("in_process", rr.InProcessConfig()),
                               fault_plan=plan, **kwargs)


@pytest.fixture(scope="module")
def clean_runs(clean_run):
    """Fault-free runs by number of workers (the oracle), each trained when first asked for."""

    class Runs(dict):
        def __missing__(self, num_workers: int):
            self[num_workers] = clean_run(num_workers, STEPS)
            return self[num_workers]

    return Runs()


@pytest.mark.timeout(240)
# ~15 s (2) and ~40 s (3): the default run restarts exceptions on rank 1 and on rank 0 in
# process in test_default_config_resumes_from_the_local_tier_without_storage_saves.
@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [2, 3])
def test_exceptions_on_several_ranks_end_bit_equal(clean_runs, token_data_dir, tmp_path,
                                                    num_workers):
    plan = FaultPlan.explicit([
        Fault(step=3, rank=1, kind="exception"),
        Fault(step=6, rank=0, kind="exception"),
        Fault(step=9, rank=num_workers - 1, kind="exception"),
    ])
    result = workload.fit(token_data_dir, str(tmp_path), f"exc{num_workers}",
                          num_workers=num_workers, max_steps=STEPS, resilience=_resilience(plan))
    assert result.ok, result.error
    assert [f["fault_id"] for f in result.faults] == [f.id for f in plan]
    assert [f["cause"] for f in result.faults] == ["exception"] * 3
    assert result.attempts == 4
    clean = clean_runs[num_workers]
    for rank in range(num_workers):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])
        assert result.return_values[rank]["attempt"] == 3
    # Same processes: nothing was respawned.
    assert [v["pid"] for v in result.return_values] == result.worker_pids
    report = result.goodput
    assert report is not None and len(report.faults) == 3
    assert all(f.recovery_s is not None for f in report.faults)


@pytest.mark.timeout(240)
def test_python_hang_is_interrupted_and_recovered(clean_runs, token_data_dir, tmp_path):
    plan = FaultPlan.explicit([Fault(step=5, rank=1, kind="hang")])
    result = workload.fit(token_data_dir, str(tmp_path), "hang", max_steps=STEPS,
                          resilience=_resilience(plan))
    assert result.ok, result.error
    assert [f["cause"] for f in result.faults] == ["hang"]
    assert result.faults[0]["fault_id"] == plan.faults[0].id
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean_runs[2].return_values[rank]["state"])
    assert [v["pid"] for v in result.return_values] == result.worker_pids


@pytest.mark.slow  # ~15 s; test_restart_storm_without_progress_stops covers the typed limit error
@pytest.mark.timeout(180)
def test_faults_on_every_step_stop_at_the_limit(ray_session, token_data_dir, tmp_path):
    plan = FaultPlan.explicit([Fault(step=s, rank=1, kind="exception") for s in range(1, 9)])
    result = workload.fit(
        token_data_dir, str(tmp_path), "limit", max_steps=STEPS, raise_on_failure=False,
        resilience=_resilience(plan, in_process=rr.InProcessConfig(max_restarts=3)))
    assert not result.ok
    err = result.error
    assert isinstance(err, RestartLimitError)
    assert err.setting == "InProcessConfig.max_restarts" and err.limit == 3
    assert err.ranks == [1] and err.causes == ["exception"] * 4
    assert "InProcessConfig.max_restarts=3" in str(err)


@pytest.mark.timeout(180)
def test_restart_storm_without_progress_stops(ray_session, tmp_path):
    def always_fails():
        raise ConnectionError("parameter server unreachable")

    trainer = rr.ResilientTrainer(
        always_fails, scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="storm", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(
            max_restarts=50, max_attempts_without_progress=2)))
    with pytest.raises(TrainingFailedError) as failed:
        trainer.fit()
    result = failed.value.result
    assert isinstance(result.error, RestartLimitError)
    assert result.error.setting == "InProcessConfig.max_attempts_without_progress"
    assert result.attempts == 3
    assert "parameter server unreachable" in str(result.error)


@pytest.mark.timeout(240)
def test_default_config_resumes_from_the_local_tier_without_storage_saves(
        clean_runs, token_data_dir, tmp_path):
    """`ResilienceConfig.default()` without a checkpoint interval: nothing is committed to
    storage, yet each exception resumes from the local tier (before it, such a run started over
    from step 0 at every restart): during the first attempt's probe from its write at step 3,
    after it redoing at most the interval the ranks agreed on."""
    plan = FaultPlan.explicit([Fault(step=4, rank=1, kind="exception"),
                                  Fault(step=9, rank=0, kind="exception")])
    resilience = rr.ResilienceConfig.default(checkpoint_interval=0, fault_plan=plan,
                                             step_timeout_s=3.0, first_step_timeout_s=60.0)
    result = workload.fit(token_data_dir, str(tmp_path), "default", max_steps=STEPS, sleep_s=0.3,
                          resilience=resilience)
    assert result.ok, result.error
    assert result.checkpoint["latest_committed_step"] is None
    faults = result.goodput.faults
    assert [(f.checkpoint_tier, f.resumed_from_step) for f in faults][0] == ("local", 3), faults
    assert faults[1].checkpoint_tier == "local"
    assert 0 <= faults[1].steps_redone <= result.local_interval_steps, (faults, result.checkpoint)
    assert [v["resumed_from"] for v in result.return_values] == [faults[1].resumed_from_step] * 2
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean_runs[2].return_values[rank]["state"])
