"""Faults in every phase (init, checkpoint save, checkpoint load during recovery, validation)
and hang timeouts that follow the phase a rank is in, or are learned from the workload."""

from __future__ import annotations

import pytest

import ray_resilience as rr
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

STEPS = 12


@pytest.mark.timeout(300)
def test_faults_in_every_phase_end_bit_equal(clean_run, token_data_dir, tmp_path):
    clean = clean_run(2, STEPS)  # validation changes no parameter: the plain run is the oracle
    plan = FaultPlan.explicit([
        Fault(step=1, rank=1, kind="exception", phase="init"),
        Fault(step=4, rank=0, kind="exception", phase="checkpoint_save"),
        Fault(step=8, rank=1, kind="exception", phase="validation"),
        # Fires in the checkpoint load of the recovery from the validation fault.
        Fault(step=7, rank=0, kind="exception", phase="checkpoint_load"),
    ])
    result = workload.fit(
        token_data_dir, str(tmp_path), "phases", max_steps=STEPS, validate_every=4,
        resilience=rr.ResilienceConfig.default(checkpoint_interval=2, fault_plan=plan,
                                               step_timeout_s=20.0, first_step_timeout_s=60.0))
    assert result.ok, result.error
    assert sorted(f["fault_id"] for f in result.faults) == sorted(f.id for f in plan)
    by_id = {f["fault_id"]: f for f in result.faults}
    phase_of = {f.phase: f.id for f in plan}
    load_fault, validation_fault = by_id[phase_of["checkpoint_load"]], by_id[phase_of["validation"]]
    assert load_fault["attempt"] == validation_fault["attempt"] + 1  # a fault during recovery
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])


@pytest.mark.slow  # ~20 s; phases run by default in test_faults_in_every_phase_end_bit_equal
@pytest.mark.timeout(240)
def test_long_validation_uses_its_phase_timeout_not_the_step_timeout(ray_session, token_data_dir,
                                                                     tmp_path):
    result = workload.fit(
        token_data_dir, str(tmp_path), "slow-validation", max_steps=5, validate_every=4,
        validation_sleep_s=5.0,
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(), step_timeout_s=3.0,
                                       first_step_timeout_s=60.0,
                                       phase_timeouts_s={"validation": 40.0}))
    assert result.ok and not result.faults, result.faults
    assert result.timeouts["worst_observed_s"]["validation"] >= 5.0
    assert result.timeouts["worst_observed_s"]["step"] < 3.0


@pytest.mark.slow  # ~15 s
@pytest.mark.timeout(240)
def test_adaptive_timeouts_follow_the_worst_interval(ray_session, token_data_dir, tmp_path):
    adaptive = rr.AdaptiveTimeouts(multiplier=4.0, step_floor_s=2.0, first_step_floor_s=30.0,
                                   phase_floor_s=2.0, min_samples=2,
                                   pinned=frozenset({"first_step"}))
    result = workload.fit(
        token_data_dir, str(tmp_path), "adaptive", max_steps=12, validate_every=4,
        validation_sleep_s=1.0,
        resilience=rr.ResilienceConfig(step_timeout_s=50.0, first_step_timeout_s=60.0,
                                       adaptive_timeouts=adaptive))
    assert result.ok, result.error
    learned, worst = result.timeouts["timeouts_s"], result.timeouts["worst_observed_s"]
    # Changes under 5% are not applied (no log spam), hence the tolerance.
    assert learned["step"] == pytest.approx(max(2.0, 4.0 * worst["step"]), rel=0.05)
    assert learned["validation"] == pytest.approx(max(2.0, 4.0 * worst["validation"]), rel=0.05)
    assert learned["validation"] >= 4.0  # learned from the 1 s validation passes
    assert learned["first_step"] == 60.0  # pinned
