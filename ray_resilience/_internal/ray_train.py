"""Ray Train's configs in, ours out: `ResilientTrainer` takes `ray.train.ScalingConfig`,
`RunConfig`, `FailureConfig` and `CheckpointConfig` (Ray 2.60's v2 API, and the v1 `ray.air`
classes) and maps every field we support. Any other field set to a non-default value is refused
with a `ConfigError` naming it and our equivalent, or saying we have none: nothing is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.config import (
    DEFAULT_CHECKPOINT_INTERVAL_STEPS,
    InJobConfig,
    InProcessConfig,
    ResilienceConfig,
    RunConfig,
    ScalingConfig,
)
from ray_resilience.errors import ConfigError

UNLIMITED_RESTARTS = 2**31 - 1
"""What `FailureConfig(max_failures=-1)` (retry forever) becomes; restart storms still stop at
`max_attempts_without_progress`."""

_NONE = "we have no equivalent"
_UNSUPPORTED: dict[str, str] = {
    "ScalingConfig.num_workers": "an elastic (min, max) world: give num_workers=max and "
                                 "resilience=ResilienceConfig.default(in_job=InJobConfig("
                                 "min_workers=min)) to shrink when capacity is lost",
    "ScalingConfig.trainer_resources": f"{_NONE}: the supervisor needs no resources",
    "ScalingConfig.label_selector": f"{_NONE}; ask for a custom node resource in "
                                    "resources_per_worker instead",
    "ScalingConfig.use_tpu": f"{_NONE}: ranks run on CPUs or GPUs",
    "ScalingConfig.topology": f"{_NONE}: ranks run on CPUs or GPUs",
    "ScalingConfig.elastic_resize_monitor_interval_s": f"{_NONE}: the world shrinks only when "
                                                      "replacements find no capacity "
                                                      "(InJobConfig.min_workers)",
    "RunConfig.callbacks": "ray_resilience.RunConfig(callbacks=[...]) with "
                           "ray_resilience.callbacks.Callback subclasses",
    "RunConfig.worker_runtime_env": f"{_NONE} per worker: give the job a runtime_env "
                                    "(ray.init(runtime_env=...) or ray job submit "
                                    "--runtime-env-json); every rank inherits it",
    "RunConfig.logging_config": f"{_NONE}: configure Python logging (our loggers are under "
                                "'ray_resilience')",
    "RunConfig.verbose": "ray_resilience.RunConfig(verbose=...)",
    "FailureConfig.controller_failure_limit": f"{_NONE}: a lost driver is retried by the job "
                                              "(e.g. the RayJob's backoffLimit)",
    "FailureConfig.max_preemption_failures": f"{_NONE}: a preempted rank is a fault counted "
                                             "against max_failures",
    "FailureConfig.relax_collectives_on_preemption": _NONE,
    "FailureConfig.preemption_grace_s": _NONE,
    "CheckpointConfig.checkpoint_score_attribute": f"{_NONE}: the newest num_to_keep commits "
                                                   "are kept",
    "CheckpointConfig.checkpoint_score_order": f"{_NONE}: the newest num_to_keep commits are "
                                               "kept",
    "CheckpointConfig.checkpoint_frequency": "ray_resilience.CheckpointConfig(interval_steps=...)",
}


@dataclasses.dataclass(frozen=True)
class Adopted:
    """The configs `ResilientTrainer` runs with."""

    scaling: ScalingConfig
    run: RunConfig
    resilience: ResilienceConfig
    from_ray_train: bool
    """Whether any of them was a Ray Train config."""


def adopt(scaling: Any, run: Any, resilience: Any) -> Adopted:
    """Our configs for what the trainer was given (None: defaults, with a resilient default)."""
    ray_scaling, ray_run = _is_ray(scaling), _is_ray(run)
    if ray_scaling:
        scaling = scaling_from_ray(scaling)
    elif scaling is None:
        scaling = ScalingConfig()
    _require("scaling_config", scaling, ScalingConfig, "ScalingConfig")
    failure = checkpoint = None
    if ray_run:
        failure, checkpoint = run.failure_config, run.checkpoint_config
        run = run_from_ray(run)
    elif run is None:
        run = RunConfig()
    _require("run_config", run, RunConfig, "RunConfig")
    if resilience is None:
        resilience = resilience_from_ray(failure, checkpoint)
    else:
        _require("resilience", resilience, ResilienceConfig, "ResilienceConfig")
        _refuse_alongside(failure, checkpoint)
    return Adopted(scaling, run, resilience, from_ray_train=ray_scaling or ray_run)


def _is_ray(config: Any) -> bool:
    return type(config).__module__.startswith(("ray.train", "ray.air"))


def _require(field: str, value: Any, expected: type, name: str) -> None:
    if not isinstance(value, expected):
        raise ConfigError(field, value, f"got a {type(value).__module__}.{type(value).__name__}, "
                                        f"expected ray_resilience.{name} or ray.train.{name}.")


def _refuse_set_fields(config: Any, kind: str, mapped: set[str]) -> None:
    """Refuses every field of `config` outside `mapped` whose value is not the default."""
    fresh = type(config)()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in mapped or value == getattr(fresh, field.name):
            continue
        name = f"{kind}.{field.name}"
        raise ConfigError(f"ray.train.{name}", value,
                          f"is not supported by ResilientTrainer; {_UNSUPPORTED.get(name, _NONE)}.")


def scaling_from_ray(ray_scaling: Any) -> ScalingConfig:
    """num_workers, use_gpu, resources_per_worker (as Ray reads it: exactly these resources,
    GPU 1 with use_gpu), placement_strategy and accelerator_type."""
    if not isinstance(ray_scaling.num_workers, int):
        raise ConfigError("ray.train.ScalingConfig.num_workers", ray_scaling.num_workers,
                          _UNSUPPORTED["ScalingConfig.num_workers"] + ".")
    _refuse_set_fields(ray_scaling, "ScalingConfig", {
        "num_workers", "use_gpu", "resources_per_worker", "placement_strategy",
        "accelerator_type"})
    given = ray_scaling.resources_per_worker
    if given is None:
        resources = {"GPU": 1.0} if ray_scaling.use_gpu else {"CPU": 1.0}
    else:
        resources = {k: v for k, v in given.items() if v != 0}
        if ray_scaling.use_gpu:
            resources.setdefault("GPU", 1.0)
    resources.setdefault("CPU", 0.0)  # Ray asks for no CPU unless told: neither do we
    if ray_scaling.accelerator_type:
        resources.setdefault(f"accelerator_type:{ray_scaling.accelerator_type}", 0.001)
    return ScalingConfig(num_workers=ray_scaling.num_workers, use_gpu=bool(ray_scaling.use_gpu),
                         resources_per_worker=resources,
                         placement_strategy=ray_scaling.placement_strategy)


def run_from_ray(ray_run: Any) -> RunConfig:
    """name, storage_path and storage_filesystem; failure_config and checkpoint_config go to
    `resilience_from_ray`."""
    _refuse_set_fields(ray_run, "RunConfig", {
        "name", "storage_path", "storage_filesystem", "failure_config", "checkpoint_config"})
    kwargs: dict[str, Any] = {"storage_filesystem": ray_run.storage_filesystem}
    if ray_run.name:
        kwargs["name"] = ray_run.name
    if ray_run.storage_path:
        kwargs["storage_path"] = str(ray_run.storage_path)
    return RunConfig(**kwargs)


def resilience_from_ray(failure: Any, checkpoint: Any) -> ResilienceConfig:
    """`ResilienceConfig.default()`, with FailureConfig.max_failures as both rungs' restart
    budget (0, Ray's default, keeps ours; -1: unlimited) and CheckpointConfig.num_to_keep."""
    max_failures = _max_failures(failure)
    num_to_keep = _num_to_keep(checkpoint)
    if max_failures is None and num_to_keep is None:
        return ResilienceConfig.default()
    kwargs: dict[str, Any] = {}
    if max_failures is not None:
        kwargs["in_process"] = InProcessConfig(max_restarts=max_failures)
        kwargs["in_job"] = InJobConfig(max_restarts=max_failures)
    if num_to_keep is not None:
        kwargs["checkpoint"] = CheckpointConfig(interval_steps=DEFAULT_CHECKPOINT_INTERVAL_STEPS,
                                                num_to_keep=num_to_keep)
    return ResilienceConfig.default(**kwargs)


def _max_failures(failure: Any) -> int | None:
    if failure is None:
        return None
    _refuse_set_fields(failure, "FailureConfig", {"max_failures"})
    value = failure.max_failures
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError("ray.train.FailureConfig.max_failures", value,
                          "must be an integer >= -1 (-1: retry without limit).")
    return None if value == 0 else UNLIMITED_RESTARTS if value == -1 else value


def _num_to_keep(checkpoint: Any) -> int | None:
    if checkpoint is None:
        return None
    _refuse_set_fields(checkpoint, "CheckpointConfig", {"num_to_keep"})
    value = checkpoint.num_to_keep
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 2):
        raise ConfigError("ray.train.CheckpointConfig.num_to_keep", value,
                          "ResilientTrainer keeps at least 2 committed checkpoints, so a crash "
                          "while writing one leaves one loadable; use num_to_keep >= 2.")
    return value


def _refuse_alongside(failure: Any, checkpoint: Any) -> None:
    """With an explicit `resilience=`, the budget and retention are set there, in one place."""
    if failure is not None and _max_failures(failure) is not None:
        raise ConfigError("ray.train.FailureConfig.max_failures", failure.max_failures,
                          "give the restart budget in the resilience= you passed: "
                          "InProcessConfig.max_restarts and InJobConfig.max_restarts.")
    if checkpoint is not None and _num_to_keep(checkpoint) is not None:
        raise ConfigError("ray.train.CheckpointConfig.num_to_keep", checkpoint.num_to_keep,
                          "give it in the resilience= you passed: "
                          "ResilienceConfig(checkpoint=CheckpointConfig(num_to_keep=...)).")
