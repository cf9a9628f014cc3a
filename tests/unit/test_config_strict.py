"""Strict configs: NaN, infinity, wrong types, nested configs of the wrong kind, bad names and
timings that contradict each other are refused on construction with a ConfigError naming the
field (and for a wrong type, the type given and the type expected). No Ray, no actors."""

from __future__ import annotations

import math

import pytest

import ray_resilience as rr
from ray_resilience.errors import ConfigError
from ray_resilience.testing import Fault, FaultPlan

pytestmark = pytest.mark.timeout(30)

NAN, INF = math.nan, math.inf

_DURATIONS = [
    (rr.ResilienceConfig, name) for name in (
        "first_step_timeout_s", "step_timeout_s", "progress_interval_s", "monitor_interval_s",
        "process_group_timeout_s", "placement_timeout_s")
] + [
    (rr.InProcessConfig, "interrupt_timeout_s"), (rr.InProcessConfig, "barrier_timeout_s"),
    (rr.InJobConfig, "heartbeat_timeout_s"), (rr.InJobConfig, "replacement_timeout_s"),
] + [
    (rr.CheckpointConfig, name) for name in (
        "storage_retry_backoff_s", "storage_retry_max_backoff_s", "write_timeout_s",
        "collective_timeout_s", "warn_interval_s")
] + [
    (rr.AdaptiveTimeouts, name) for name in (
        "multiplier", "step_floor_s", "first_step_floor_s", "phase_floor_s")
]
_ALREADY_REFUSED_INF = {(rr.ResilienceConfig, "step_timeout_s"),
                        (rr.ResilienceConfig, "progress_interval_s"),
                        (rr.CheckpointConfig, "warn_interval_s")}
"""Fields an infinite value already failed through a cross-field check (kept out below)."""
_STRICT_CASES = (
    [(cls, name, NAN) for cls, name in _DURATIONS]
    + [(cls, name, INF) for cls, name in _DURATIONS if (cls, name) not in _ALREADY_REFUSED_INF]
    + [(cls, name, value) for cls, name in _DURATIONS
       if cls in (rr.ResilienceConfig, rr.AdaptiveTimeouts) for value in ("120", None)]
    + [(rr.AdaptiveTimeouts, name, True) for name in
       ("step_floor_s", "first_step_floor_s", "phase_floor_s")]
    + [(rr.ScalingConfig, "num_workers", True)]
    + [(rr.AdaptiveTimeouts, "min_samples", value) for value in (True, 2.5, 3.0, NAN, "3")]
)


@pytest.mark.parametrize("cls, name, value", _STRICT_CASES,
                         ids=[f"{c.__name__}.{n}={v!r}" for c, n, v in _STRICT_CASES])
def test_numbers_refuse_nan_inf_bools_and_non_numbers(cls, name, value):
    with pytest.raises(ConfigError) as info:
        cls(**{name: value})
    assert info.value.field == f"{cls.__name__}.{name}"


_COUNTS = [
    (rr.InProcessConfig, "max_restarts"), (rr.InProcessConfig, "max_attempts_without_progress"),
    (rr.InJobConfig, "max_restarts"), (rr.InJobConfig, "num_spares"),
    (rr.InJobConfig, "min_workers"), (rr.CheckpointConfig, "interval_steps"),
    (rr.CheckpointConfig, "num_to_keep"), (rr.CheckpointConfig, "local_interval_steps"),
]


@pytest.mark.parametrize("value", [True, 2.5, 3.0, NAN, "3"])
@pytest.mark.parametrize("cls, name", _COUNTS, ids=[f"{c.__name__}.{n}" for c, n in _COUNTS])
def test_counts_still_refuse_what_they_refused(cls, name, value):
    """Refused before the shared validators too: a regression check of the move to them."""
    with pytest.raises(ConfigError) as info:
        cls(**{name: value})
    assert info.value.field == f"{cls.__name__}.{name}"


@pytest.mark.parametrize("make, field, words", [
    (lambda: rr.ScalingConfig(use_gpu="yes"), "ScalingConfig.use_gpu", "bool"),
    (lambda: rr.ScalingConfig(resources_per_worker={"CPU": NAN}),
     "ScalingConfig.resources_per_worker['CPU']", "finite"),
    (lambda: rr.ScalingConfig(resources_per_worker={"CPU": "1"}),
     "ScalingConfig.resources_per_worker['CPU']", "got a str, expected a number"),
    (lambda: rr.CheckpointConfig(memory_tier="no"), "CheckpointConfig.memory_tier",
     "got a str, expected a bool"),
    (lambda: rr.RunConfig(name="run", verbose="quiet"), "RunConfig.verbose", "bool"),
    (lambda: rr.RunConfig(name="run", storage_filesystem="/tmp"),
     "RunConfig.storage_filesystem", "expected FileSystem"),
    (lambda: rr.InProcessConfig(health_check=3), "InProcessConfig.health_check", "callable"),
])
def test_bools_are_bools_and_types_are_checked(make, field, words):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field and words in str(info.value)


@pytest.mark.parametrize("name, value, given, expected", [
    ("checkpoint", 5, "an int", "expected CheckpointConfig or None"),
    ("in_process", {"max_restarts": 3}, "a dict", "expected InProcessConfig or None"),
    ("in_job", {"policy": "all"}, "a dict", "expected InJobConfig or None"),
    ("in_job", True, "a bool", "expected InJobConfig or None"),
    ("fault_plan", [Fault(step=1, rank=0, kind="exception")], "a list",
     "expected FaultPlan or None"),
    ("adaptive_timeouts", {"multiplier": 2}, "a dict", "expected AdaptiveTimeouts or None"),
    ("phase_timeouts_s", None, "a NoneType", "expected a dict"),
    ("phase_timeouts_s", {"validation": NAN}, None, "finite"),
])
def test_nested_configs_are_type_checked(name, value, given, expected):
    with pytest.raises(ConfigError) as info:
        rr.ResilienceConfig(**{name: value})
    assert info.value.field.startswith(f"ResilienceConfig.{name}")
    assert expected in str(info.value) and (given is None or f"got {given}" in str(info.value))


@pytest.mark.parametrize("kwargs", [
    {"name": "run\n"}, {"storage_path": "s3://"}, {"storage_path": "s3:///prefix"},
    {"storage_path": "gs://"}, {"storage_path": " /tmp/x"},
], ids=["trailing-newline", "s3-no-bucket", "s3-empty-bucket", "gs-no-bucket", "leading-space"])
def test_run_names_match_in_full_and_uris_name_a_bucket(kwargs):
    with pytest.raises(ConfigError) as info:
        rr.RunConfig(**{"name": "run", **kwargs})
    assert info.value.field == f"RunConfig.{next(iter(kwargs))}"


def test_good_storage_uris_and_names_pass():
    for path in ("s3://bucket", "s3://bucket/prefix?endpoint_override=127.0.0.1:9000",
                 "file:///tmp/runs", "/tmp/runs"):
        assert rr.RunConfig(name="a.b-c_1", storage_path=path).storage_path == path


@pytest.mark.parametrize("make, field", [
    (lambda: rr.ResilienceConfig(progress_interval_s=20.0,
                                 in_job=rr.InJobConfig(heartbeat_timeout_s=10.0)),
     "InJobConfig.heartbeat_timeout_s"),
    (lambda: rr.ResilienceConfig(progress_interval_s=1.0,
                                 in_job=rr.InJobConfig(heartbeat_timeout_s=3.0)),
     "InJobConfig.heartbeat_timeout_s"),
    (lambda: rr.ResilienceConfig(phase_timeouts_s={"validation": 4000.0}),
     "ResilienceConfig.phase_timeouts_s['validation']"),
    (lambda: rr.ResilienceConfig(phase_timeouts_s={"validation": 0.1}),
     "ResilienceConfig.phase_timeouts_s['validation']"),
    (lambda: rr.ResilienceConfig(step_timeout_s=2.0, monitor_interval_s=5.0,
                                 progress_interval_s=0.5),
     "ResilienceConfig.monitor_interval_s"),
    (lambda: rr.CheckpointConfig(storage_retry_backoff_s=100.0, storage_retry_max_backoff_s=0.1),
     "CheckpointConfig.storage_retry_backoff_s"),
])
def test_timings_that_contradict_each_other_are_refused(make, field):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field


@pytest.mark.parametrize("make, field, words", [
    (lambda: rr.ResilienceConfig(phase_timeouts_s={"step": 30.0}),
     "ResilienceConfig.phase_timeouts_s['step']", "step_timeout_s"),
    (lambda: rr.ResilienceConfig(phase_timeouts_s={"First-Step": 30.0}),
     "ResilienceConfig.phase_timeouts_s['First-Step']", "first_step_timeout_s"),
    (lambda: rr.ResilienceConfig(adaptive_timeouts=rr.AdaptiveTimeouts(pinned={"frist_step"})),
     "AdaptiveTimeouts.pinned", "did you mean 'first_step'"),
    (lambda: rr.ResilienceConfig(phase_timeouts_s={"validation": 60.0},
                                 adaptive_timeouts=rr.AdaptiveTimeouts(pinned={"validaton"})),
     "AdaptiveTimeouts.pinned", "did you mean 'validation'"),
    (lambda: rr.AdaptiveTimeouts(pinned="step"), "AdaptiveTimeouts.pinned", "set of strings"),
    (lambda: rr.AdaptiveTimeouts(pinned={"step", 3}), "AdaptiveTimeouts.pinned", "3"),
])
def test_timeout_names_are_checked(make, field, words):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field and words in str(info.value)


def test_pinned_names_that_exist_are_kept_as_a_set_of_names():
    cfg = rr.ResilienceConfig(phase_timeouts_s={"validation": 60.0},
                              adaptive_timeouts=rr.AdaptiveTimeouts(pinned=["step", "validation"]))
    assert cfg.adaptive_timeouts.pinned == frozenset({"step", "validation"})


@pytest.mark.parametrize("make, field", [
    (lambda: FaultPlan.generate(seed=1, fault_count=1, after_step=0, max_steps=5, world_size=2,
                                kinds=["exception"], weights=[NAN]), "weights[0]"),
    (lambda: FaultPlan.generate(seed=1, fault_count=1, after_step=0, max_steps=5, world_size=2,
                                kinds=["exception", "hang"], weights=[1.0, INF]), "weights[1]"),
    (lambda: FaultPlan.generate(seed=1.5, fault_count=1, after_step=0, max_steps=5,
                                world_size=2, kinds=["exception"]), "seed"),
    (lambda: FaultPlan.generate(seed=1, fault_count=True, after_step=0, max_steps=5,
                                world_size=2, kinds=["exception"]), "fault_count"),
    (lambda: Fault(step=2.0, rank=0, kind="exception"), "Fault.step"),
    (lambda: FaultPlan(faults="f1"), "FaultPlan.faults"),
    (lambda: FaultPlan.explicit([5]), "Fault"),
])
def test_fault_plans_refuse_nan_and_non_integers(make, field):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field


def test_a_config_error_is_still_a_value_error_with_field_value_and_fix():
    with pytest.raises(ValueError) as info:
        rr.ResilienceConfig(step_timeout_s=NAN)
    err = info.value
    assert isinstance(err, ConfigError) and math.isnan(err.value) and "finite" in err.fix
