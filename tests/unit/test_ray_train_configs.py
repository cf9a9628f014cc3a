"""Ray Train's configs in `ResilientTrainer`: every supported field mapped, every other set field
refused at construction naming it and our equivalent; the resilient default; the typed failure.
No Ray cluster: nothing here starts an actor."""

from __future__ import annotations

import pickle
import threading

import pytest
import ray.train

import ray_resilience as rr
from ray_resilience._internal.ray_train import UNLIMITED_RESTARTS
from ray_resilience.config import DEFAULT_CHECKPOINT_INTERVAL_STEPS
from ray_resilience.errors import ConfigError, TrainingFailedError

pytestmark = pytest.mark.timeout(60)


def _loop(config):
    return None


def _trainer(**kwargs) -> rr.ResilientTrainer:
    return rr.ResilientTrainer(_loop, **kwargs)


def test_scaling_fields_are_mapped_as_ray_reads_them():
    t = _trainer(scaling_config=ray.train.ScalingConfig(
        num_workers=3, resources_per_worker={"CPU": 2, "memory": 1e9},
        placement_strategy="SPREAD", accelerator_type="H100"))
    s = t.scaling_config
    assert isinstance(s, rr.ScalingConfig) and s.num_workers == 3 and not s.use_gpu
    assert s.placement_strategy == "SPREAD"
    assert s.bundle == {"CPU": 2.0, "memory": 1e9, "accelerator_type:H100": 0.001}
    gpu = _trainer(scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=True))
    assert gpu.scaling_config.use_gpu and gpu.scaling_config.bundle == {"GPU": 1.0}
    cpu = _trainer(scaling_config=ray.train.ScalingConfig(num_workers=2))
    assert cpu.scaling_config.bundle == {"CPU": 1.0} and cpu.scaling_config.backend == "gloo"


def test_run_fields_failure_budget_and_retention_are_mapped(tmp_path):
    t = _trainer(run_config=ray.train.RunConfig(
        name="ported", storage_path=str(tmp_path),
        failure_config=ray.train.FailureConfig(max_failures=5),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=4)))
    assert (t.run_config.name, t.run_config.storage_path) == ("ported", str(tmp_path))
    res = t.resilience
    assert res.in_process.max_restarts == 5 and res.in_job.max_restarts == 5
    assert res.checkpoint.num_to_keep == 4
    assert res.checkpoint.interval_steps == DEFAULT_CHECKPOINT_INTERVAL_STEPS
    forever = _trainer(run_config=ray.train.RunConfig(
        name="x", failure_config=ray.train.FailureConfig(max_failures=-1)))
    assert forever.resilience.in_process.max_restarts == UNLIMITED_RESTARTS


def test_ray_defaults_keep_our_resilient_defaults():
    """Ray's RunConfig always carries FailureConfig(max_failures=0): that is its default, read
    as unset (turning restarts off is ResilienceConfig.disabled())."""
    t = _trainer(run_config=ray.train.RunConfig())
    default = rr.ResilienceConfig.default()
    assert t.resilience.in_process.max_restarts == default.in_process.max_restarts
    assert t.resilience.in_job == default.in_job and t.resilience.checkpoint == default.checkpoint
    assert t.run_config.name.startswith("ray_train_run-")  # Ray's unique default name


def test_a_trainer_without_resilience_is_resilient():
    t = _trainer()
    assert t.resilience.in_process is not None and t.resilience.in_job is not None
    assert t.resilience.checkpoint.interval_steps == DEFAULT_CHECKPOINT_INTERVAL_STEPS == 100
    assert t.resilience.checkpoint.local_interval_steps == "auto"
    off = _trainer(resilience=rr.ResilienceConfig.disabled())
    assert off.resilience.in_process is None and off.resilience.checkpoint is None


class _Callback(ray.train.UserCallback):
    pass


@pytest.mark.parametrize("make, field, equivalent", [
    (lambda: ray.train.ScalingConfig(num_workers=(1, 4)), "ScalingConfig.num_workers",
     "InJobConfig(min_workers"),
    (lambda: ray.train.ScalingConfig(num_workers=2, label_selector={"zone": "a"}),
     "ScalingConfig.label_selector", "custom node resource"),
    (lambda: ray.train.ScalingConfig(num_workers=2, elastic_resize_monitor_interval_s=5.0),
     "ScalingConfig.elastic_resize_monitor_interval_s", "InJobConfig.min_workers"),
    (lambda: ray.train.RunConfig(callbacks=[_Callback()]), "RunConfig.callbacks",
     "ray_resilience.callbacks.Callback"),
    (lambda: ray.train.RunConfig(worker_runtime_env={"pip": ["x"]}),
     "RunConfig.worker_runtime_env", "runtime_env"),
    (lambda: ray.train.RunConfig(logging_config=ray.train.LoggingConfig(log_level="DEBUG")),
     "RunConfig.logging_config", "Python logging"),
    (lambda: ray.train.RunConfig(failure_config=ray.train.FailureConfig(
        controller_failure_limit=2)), "FailureConfig.controller_failure_limit", "backoffLimit"),
    (lambda: ray.train.RunConfig(failure_config=ray.train.FailureConfig(
        max_preemption_failures=3)), "FailureConfig.max_preemption_failures", "max_failures"),
    (lambda: ray.train.RunConfig(failure_config=ray.train.FailureConfig(preemption_grace_s=9.0)),
     "FailureConfig.preemption_grace_s", "no equivalent"),
    (lambda: ray.train.RunConfig(checkpoint_config=ray.train.CheckpointConfig(
        checkpoint_score_attribute="loss")), "CheckpointConfig.checkpoint_score_attribute",
     "newest"),
    (lambda: ray.train.RunConfig(checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1)),
     "CheckpointConfig.num_to_keep", "at least 2"),
])
def test_every_other_set_field_is_refused_naming_our_equivalent(make, field, equivalent):
    config = make()
    kwarg = "scaling_config" if isinstance(config, ray.train.ScalingConfig) else "run_config"
    with pytest.raises(ConfigError) as info:
        _trainer(**{kwarg: config})
    assert info.value.field == f"ray.train.{field}" and equivalent in str(info.value)


def test_budgets_are_set_in_one_place():
    run = ray.train.RunConfig(name="x", failure_config=ray.train.FailureConfig(max_failures=2))
    with pytest.raises(ConfigError, match="InProcessConfig.max_restarts"):
        _trainer(run_config=run, resilience=rr.ResilienceConfig.default())
    keep = ray.train.RunConfig(name="x",
                               checkpoint_config=ray.train.CheckpointConfig(num_to_keep=3))
    with pytest.raises(ConfigError, match=r"CheckpointConfig\(num_to_keep"):
        _trainer(run_config=keep, resilience=rr.ResilienceConfig.default())


@pytest.mark.parametrize("kwarg, value, expected", [
    ("scaling_config", {"num_workers": 2}, "ScalingConfig"),
    ("run_config", "my-run", "RunConfig"),
    ("resilience", rr.InJobConfig(), "ResilienceConfig"),
    ("train_loop_config", [1, 2], "a dict"),
])
def test_configs_of_the_wrong_type_are_refused(kwarg, value, expected):
    with pytest.raises(ConfigError) as info:
        _trainer(**{kwarg: value})
    assert info.value.field == kwarg and expected in str(info.value)


def test_an_unpicklable_train_function_is_refused_naming_what_it_captures():
    lock = threading.Lock()

    def loop():
        with lock:
            pass

    with pytest.raises(ConfigError) as info:
        rr.ResilientTrainer(loop)
    assert info.value.field == "train_loop_per_worker[closure 'lock']"
    assert "_thread.lock" in str(info.value) and "inside the train function" in str(info.value)
    with pytest.raises(ConfigError) as info:
        rr.ResilientTrainer(_loop, train_loop_config={"data": [1, lock]})
    assert info.value.field == "train_loop_config['data'][1]"


def test_training_failed_error_carries_the_result_and_names_the_cause():
    cause = KeyError("no such column")
    result = rr.Result(metrics={}, metrics_history=[], path="/runs/x", error=cause,
                       state="failed", attempts=3)
    err = TrainingFailedError(result)
    assert err.result is result and err.error is cause
    assert "KeyError" in str(err) and "no such column" in str(err) and "3 attempt" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, TrainingFailedError) and str(again) == str(err)
    from ray_resilience._internal.ray_train_error import RayTrainingFailedError  # noqa: PLC0415 - the class that needs ray.train

    both = RayTrainingFailedError(result)
    assert isinstance(both, ray.train.TrainingFailedError) and isinstance(both, rr.ResilienceError)
