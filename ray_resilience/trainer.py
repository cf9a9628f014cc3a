"""`ResilientTrainer`: the Python entry point, shaped like Ray Train's `TorchTrainer`."""

from __future__ import annotations

import logging
import posixpath
import sys
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal import pickle_check, ray_train, run_folder
from ray_resilience._internal.checkpoint.format.local_roots import check_local_dir
from ray_resilience._internal.constants import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    SUPERVISOR_MAX_CONCURRENCY,
    SUPERVISOR_NAME_PREFIX,
    forwarded_env,
)
from ray_resilience._internal.control.metrics_log import read_newest
from ray_resilience._internal.display import ProgressDisplay
from ray_resilience._internal.run_folder import write_run_artifacts
from ray_resilience._internal.supervisor.outcome import RunOutcome
from ray_resilience._internal.supervisor.supervisor import Supervisor
from ray_resilience._internal.worker_group.resources import check_cluster_can_host
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import RunInUseError
from ray_resilience.config import ResilienceConfig, RunConfig, ScalingConfig
from ray_resilience.errors import ConfigError, TrainingFailedError
from ray_resilience.result import Result

log = logging.getLogger(__name__)


class ResilientTrainer:
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` ranks and keeps it running.

    The train function takes no argument or one (`train_loop_config`). Inside it, use
    `ray_resilience.get_context()`, `report()` and `load_checkpoint()`. `scaling_config` and
    `run_config` may be ours or Ray Train's (`ray.train.ScalingConfig`, `ray.train.RunConfig`
    with its `FailureConfig` and `CheckpointConfig`; see docs/ray_train_port.md). Without
    `resilience`, the run is resilient: `ResilienceConfig.default()` (every rung, a committed
    checkpoint every 100 steps, the local tier at an interval chosen from its measured
    cost); `ResilienceConfig.disabled()` turns that off. `datasets` feeds the ranks through
    `get_dataset_shard(name)`.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: dict[str, Any] | None = None,
                 datasets: dict[str, Any] | None = None,
                 scaling_config: ScalingConfig | Any | None = None,
                 run_config: RunConfig | Any | None = None,
                 resilience: ResilienceConfig | None = None) -> None:
        if not callable(train_loop_per_worker):
            raise ConfigError("train_loop_per_worker", train_loop_per_worker,
                              "pass the function each rank runs.")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError("train_loop_config", train_loop_config,
                              f"got a {type(train_loop_config).__name__}, expected a dict.")
        self._fn, self._config = train_loop_per_worker, train_loop_config
        self.datasets = _checked_datasets(datasets)
        adopted = ray_train.adopt(scaling_config, run_config, resilience)
        self.scaling_config, self.run_config = adopted.scaling, adopted.run
        self.resilience = adopted.resilience
        self._validate_plan()
        # Pickled now: what cannot travel to the ranks is named here, before any actor starts.
        self._fn_bytes = pickle_check.dumps("train_loop_per_worker", train_loop_per_worker)
        pickle_check.dumps("train_loop_config", train_loop_config)

    def _validate_plan(self) -> None:
        in_job = self.resilience.in_job
        if in_job is not None and (in_job.min_workers or 0) > self.scaling_config.num_workers:
            raise ConfigError("InJobConfig.min_workers", in_job.min_workers, f"must be <= "
                              f"ScalingConfig.num_workers={self.scaling_config.num_workers}.")
        plan = self.resilience.fault_plan
        if plan is None:
            return
        plan.validate_for(world_size=self.scaling_config.num_workers, max_steps=2**62)
        harness = sorted({f.kind.value for f in plan if not f.kind.fired_in_worker})
        if harness:
            raise ConfigError(
                "ResilienceConfig.fault_plan", harness,
                "these kinds are fired by a test harness that controls nodes, writers or storage "
                "(see tests/support/node_loss_run.py and tests/ray/test_checkpoint_faults.py), "
                "not by the trainer; keep them out of the plan given to ResilientTrainer.")

    def fit(self, *, raise_on_failure: bool = True) -> Result:
        """Runs to completion and returns the `Result`; starts Ray if needed. A failed run raises
        `TrainingFailedError` (carrying the `Result`; also a `ray.train.TrainingFailedError` once
        the driver imported `ray.train`), or with `raise_on_failure=False` returns the failed
        `Result` (`result.error` holds the cause)."""
        if not ray.is_initialized():
            ray.init()
        in_job = self.resilience.in_job
        check_cluster_can_host(self.scaling_config, in_job.num_spares if in_job is not None else 0)
        fs, base = run_folder.resolve(self.run_config.storage_path,
                                      self.run_config.storage_filesystem)
        run_path = posixpath.join(base, self.run_config.name)
        run_folder.check_writable(fs, run_path, field="RunConfig.storage_path",
                               value=self.run_config.storage_path)
        checkpoint = self.resilience.checkpoint
        if isinstance(checkpoint, CheckpointConfig) and checkpoint.local_interval_steps:
            check_local_dir(checkpoint.local_dir)
        run_dir = run_folder.run_dir_uri(self.run_config.storage_path, self.run_config.name)
        supervisor = self._start_supervisor(run_dir)
        outcome = self._wait(supervisor)
        log_path = outcome.control.get("metrics_log")
        history = read_newest(fs, log_path, self.run_config.metrics_history_size) \
            if log_path else None
        result = outcome.to_result(run_dir, ray.cloudpickle.loads, history)
        dropped = outcome.dropped_summary()
        if dropped is not None:
            log.warning("run %s: %s", self.run_config.name, dropped)
        if not isinstance(result.error, RunInUseError):  # the run folder is another job's
            write_run_artifacts(fs, run_path, result)
        if self.run_config.verbose:
            ProgressDisplay(self.run_config.name).summary(result)
        if result.error is not None and raise_on_failure:
            raise _failed_error(result) from result.error
        return result

    def _start_supervisor(self, run_dir: str) -> Any:
        env = forwarded_env()
        name = SUPERVISOR_NAME_PREFIX + self.run_config.name
        try:
            ray.get_actor(name)
        except ValueError:
            pass
        else:
            raise ConfigError("RunConfig.name", self.run_config.name,
                              "a run with this name is already running in this Ray namespace; "
                              "wait for it, or choose another name.")
        # On the driver's node (the head node under `ray job submit`), hard: a lost worker node
        # must never take the supervisor with it, and it needs no resources, so it always fits.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        return ray.remote(Supervisor).options(
            num_cpus=0, max_concurrency=SUPERVISOR_MAX_CONCURRENCY, name=name,
            scheduling_strategy=here,
            runtime_env={"env_vars": env} if env else None,
        ).remote(
            # Bytes: only the ranks unpickle the train function (and import what it needs).
            train_fn=self._fn_bytes, train_config=self._config,
            scaling=self.scaling_config,
            resilience=self.resilience, run_name=self.run_config.name, run_dir=run_dir,
            env_vars=env, storage_path=self.run_config.storage_path,
            storage_filesystem=self.run_config.storage_filesystem,
            callbacks=self.run_config.callbacks, datasets=self.datasets,
            log_metrics=self.run_config.log_metrics)

    def _wait(self, supervisor: Any) -> RunOutcome:
        run_ref = supervisor.run.remote()
        try:
            with ProgressDisplay(self.run_config.name, enabled=self.run_config.verbose) as display:
                while not ray.wait([run_ref], timeout=0.5)[0]:
                    try:
                        display.update(ray.get(supervisor.status.remote(), timeout=5))
                    except ray.exceptions.GetTimeoutError:
                        pass
            return ray.get(run_ref)
        except KeyboardInterrupt:
            log.warning("interrupted: stopping run %s", self.run_config.name)
            supervisor.abort.remote()
            try:
                ray.get(run_ref, timeout=DEFAULT_SHUTDOWN_TIMEOUT_S * 2)
            except Exception:  # noqa: BLE001 - we are leaving anyway
                pass
            raise
        except ray.exceptions.RayActorError as exc:
            return RunOutcome.lost_supervisor(exc)
        finally:
            ray.kill(supervisor, no_restart=True)


def _failed_error(result: Result) -> TrainingFailedError:
    """Ray Train's exception type too when the driver uses Ray Train (`ray.train` imported)."""
    if "ray.train" in sys.modules:
        from ray_resilience._internal.ray_train_error import RayTrainingFailedError  # noqa: PLC0415 - imports ray.train, already loaded here

        return RayTrainingFailedError(result)
    return TrainingFailedError(result)


def _checked_datasets(datasets: Any) -> dict[str, Any]:
    """{name: ray.data.Dataset}, each split into global batches across the ranks."""
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise ConfigError("datasets", datasets, 'pass a dict of Ray Datasets, e.g. '
                          '{"train": ray.data.read_parquet(path)}.')
    from ray.data import Dataset  # noqa: PLC0415 - Ray Data loads only for runs with datasets

    for name, dataset in datasets.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("datasets", name, "dataset names must be non-empty strings.")
        if not isinstance(dataset, Dataset):
            raise ConfigError(f"datasets[{name!r}]", dataset,
                              "must be a ray.data.Dataset (e.g. ray.data.read_parquet(path)).")
    return dict(datasets)
