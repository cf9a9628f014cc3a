"""Bad input fails before any actor starts, naming the setting, its value and the fix."""

from __future__ import annotations

import os

import pytest

import ray_resilience as rr
from ray_resilience.errors import InsufficientResourcesError
from ray_resilience.testing import Fault, FaultPlan


def _noop():
    return None


@pytest.mark.parametrize("kwargs, field", [
    ({"num_workers": 0}, "ScalingConfig.num_workers"),
    ({"num_workers": 2, "placement_strategy": "DENSE"}, "ScalingConfig.placement_strategy"),
    ({"num_workers": 1, "resources_per_worker": {"CPU": -1}}, "ScalingConfig.resources_per_worker"),
    ({"num_workers": 1, "resources_per_worker": {"GPU": 1}}, "ScalingConfig.resources_per_worker"),
])
def test_scaling_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as info:
        rr.ScalingConfig(**kwargs)
    assert isinstance(info.value, rr.ConfigError) and info.value.fix


@pytest.mark.parametrize("kwargs, field", [
    ({"step_timeout_s": -1}, "step_timeout_s"),
    ({"progress_interval_s": 0}, "progress_interval_s"),
    ({"progress_interval_s": 5, "step_timeout_s": 2, "first_step_timeout_s": 10},
     "progress_interval_s"),
    ({"step_timeout_s": 50, "first_step_timeout_s": 10}, "step_timeout_s"),
    ({"step_timeout_s": 50, "process_group_timeout_s": 40}, "process_group_timeout_s"),
])
def test_resilience_timeouts_in_the_wrong_order(kwargs, field):
    with pytest.raises(ValueError, match=field):
        rr.ResilienceConfig(**kwargs)


@pytest.mark.parametrize("cls, kwargs, field", [
    (rr.InProcessConfig, {"max_restarts": -1}, "InProcessConfig.max_restarts"),
    (rr.InProcessConfig, {"interrupt_timeout_s": 0}, "InProcessConfig.interrupt_timeout_s"),
    (rr.InJobConfig, {"policy": "some"}, "InJobConfig.policy"),
    (rr.InJobConfig, {"heartbeat_timeout_s": 0.1}, "InJobConfig.heartbeat_timeout_s"),
])
def test_recovery_config_errors(cls, kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        cls(**kwargs)


def test_run_name_must_be_a_folder_name():
    with pytest.raises(ValueError, match=r"RunConfig\.name"):
        rr.RunConfig(name="../escape")


def test_unwritable_storage_fails_before_actors(ray_session, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a file instead
        target = tmp_path / "a_file"
        target.write_text("x")
        storage = str(target / "sub")
    else:
        storage = str(locked)
    trainer = rr.ResilientTrainer(_noop, run_config=rr.RunConfig(name="r", storage_path=storage))
    with pytest.raises(ValueError, match=r"RunConfig\.storage_path") as info:
        trainer.fit()
    assert storage in str(info.value)


def test_gpu_on_a_cluster_without_gpus(ray_session, tmp_path):
    trainer = rr.ResilientTrainer(
        _noop, scaling_config=rr.ScalingConfig(num_workers=1, use_gpu=True),
        run_config=rr.RunConfig(name="gpu", storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"ScalingConfig\.use_gpu=True"):
        trainer.fit()


def test_more_workers_than_the_cluster_can_host(ray_session, tmp_path):
    trainer = rr.ResilientTrainer(
        _noop, scaling_config=rr.ScalingConfig(num_workers=64),
        run_config=rr.RunConfig(name="big", storage_path=str(tmp_path)))
    with pytest.raises(InsufficientResourcesError, match="num_workers=64") as info:
        trainer.fit()
    assert info.value.asked["CPU"] == 64 and info.value.available["CPU"] == 4


def test_fault_plan_with_harness_kinds_is_rejected():
    plan = FaultPlan.explicit([Fault(step=3, rank=1, kind="writer_kill")])
    with pytest.raises(ValueError, match=r"ResilienceConfig\.fault_plan.*writer_kill"):
        rr.ResilientTrainer(_noop, scaling_config=rr.ScalingConfig(num_workers=2),
                            resilience=rr.ResilienceConfig(fault_plan=plan))


def test_fault_plan_rank_outside_the_world_is_rejected():
    plan = FaultPlan.explicit([Fault(step=3, rank=5, kind="exception")])
    with pytest.raises(ValueError, match="rank=5"):
        rr.ResilientTrainer(_noop, scaling_config=rr.ScalingConfig(num_workers=2),
                            resilience=rr.ResilienceConfig(fault_plan=plan))


def test_min_workers_above_num_workers_is_rejected():
    with pytest.raises(ValueError, match=r"InJobConfig\.min_workers=3"):
        rr.ResilientTrainer(_noop, scaling_config=rr.ScalingConfig(num_workers=2),
                            resilience=rr.ResilienceConfig(in_job=rr.InJobConfig(min_workers=3)))
