"""Ray Train v2: `TorchTrainer` + `FailureConfig`, configured as a Ray user tuning it would.

- the controller's poll (`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`, 2 s by default) is lowered to
  HEALTH_CHECK_INTERVAL_S, so failures are seen within that and a report is consumed at once;
- each rank saves its FSDP shard with DCP into a folder on /dev/shm and reports it with
  `checkpoint_upload_mode=ASYNC`: training resumes after the in-memory write and Ray Train
  copies the files into the run's storage in the background, registering the checkpoint when
  the copy is done (the disk is written once);
- the gloo timeout is the workload's detection timeout: with no heartbeat of its own, a hang
  surfaces as the peer's collective failing, which the controller then handles.
On any failure the controller tears the whole worker group down and starts a new one, whose
train function resumes from `ray.train.get_checkpoint()`.

Observed through a controller-side `UserCallback`: `after_exception` (the controller learned of a
failure) is the detection, `after_report` with a checkpoint the commit. Ray Train builds the
process group before calling the train function, so rendezvous falls into "teardown".
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from typing import Any

import ray.train
import torch
import torch.distributed.checkpoint as dcp
from harness.dcp_io import dcp_state, load_dcp
from harness.events import EventLog
from harness.launcher import collect
from harness.ray_session import rank_resources, ray_for
from harness.spec import PeerRun, Workload
from harness.workload import Restored, train
from ray.train import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.torch import TorchConfig, TorchTrainer
from torch import nn

from ray_resilience.testing import FaultKind

META_FILE = "bench_meta.json"
HEALTH_CHECK_INTERVAL_S = 0.1
"""Same as torchrun's and ft_launcher's worker polling (`--monitor-interval 0.1`)."""


class RayTrainCheckpoints:
    """`CheckpointIO` through Ray Train's checkpoint API (one instance per worker attempt)."""

    def __init__(self, rank: int, local_root: str) -> None:
        self.rank, self.local_root = rank, local_root

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            rng = load_dcp(model, optimizer, self.rank, folder)
            with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
                return Restored(step=int(json.load(f)["step"]), rng=rng, tier="storage")

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        os.makedirs(self.local_root, exist_ok=True)
        folder = tempfile.mkdtemp(prefix=f"step{step}_", dir=self.local_root)
        dcp.save(dcp_state(model, optimizer, self.rank), checkpoint_id=folder)
        if self.rank == 0:
            with open(os.path.join(folder, META_FILE), "w", encoding="utf-8") as f:
                json.dump({"step": step}, f)
        # ASYNC deletes the local folder once it is uploaded.
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(folder),
                         checkpoint_dir_name=f"step_{step:06d}",
                         checkpoint_upload_mode=CheckpointUploadMode.ASYNC)

    def save_local(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Ray Train has no node-local tier."""

    def before_optimizer_step(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


def _train_fn(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker: log the attempt's start, then the shared loop."""
    t_entry = time.time()
    workload = Workload.from_json(config["workload"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    log = EventLog(workload.run_dir, f"rank{rank}-pid{os.getpid()}-{uuid.uuid4().hex[:6]}")
    log.start(rank, t_entry)
    train(workload, rank=rank, world_size=world_size, log=log,
          ckpt=RayTrainCheckpoints(rank, workload.local_root))


def bench_callback(run_dir: str) -> Any:
    """A controller-side `ray.train.UserCallback` that logs detections and commits."""

    class _BenchCallback(ray.train.UserCallback):
        def __init__(self) -> None:
            self.run_dir = run_dir
            self._log: EventLog | None = None

        def _events(self) -> EventLog:
            if self._log is None:  # created in the controller process, not the driver
                self._log = EventLog(self.run_dir, f"controller-pid{os.getpid()}")
            return self._log

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                         checkpoint: Any) -> None:
            if checkpoint is not None and metrics:
                self._events().commit(int(metrics[0]["step"]), source="ray_train after_report")

        def after_exception(self, run_context: Any,
                            worker_exceptions: dict[int, Exception]) -> None:
            detail = "; ".join(f"rank {r}: {type(e).__name__}: {e}"
                               for r, e in sorted(worker_exceptions.items()))
            self._events().detect("ray_train after_exception", detail)

    return _BenchCallback()


def fit_with_deadline(trainer: Any, timeout_s: float) -> BaseException | None:
    """`fit()` on a thread, so the run has a deadline; leaving `private_ray` on a timeout shuts
    the whole private Ray down, which ends the run and the thread with it."""
    outcome: list[BaseException | None] = []

    def fit() -> None:
        try:
            outcome.append(trainer.fit().error)
        except Exception as exc:  # noqa: BLE001 - v2 raises TrainingFailedError
            outcome.append(exc)

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return TimeoutError(f"Ray Train run still going after timeout_s={timeout_s:.0f}")
    return outcome[0]


class RayTrainPeer:
    """Ray Train v2 `TorchTrainer` with `FailureConfig(max_failures=len(plan) + 1)`."""

    name = "ray-train"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG, FaultKind.NODE_LOSS})
    num_spares = 0
    uses_durable = True
    local_tier = False
    config = (f"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={HEALTH_CHECK_INTERVAL_S:g}; DCP save to "
              "/dev/shm + report(checkpoint_upload_mode=ASYNC); gloo timeout = detection timeout")

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, run_dir=workload.run_dir,
                      notes=["detect = controller's after_exception callback; teardown includes "
                             "the new worker group's process-group setup"])
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(HEALTH_CHECK_INTERVAL_S)
        t_start = time.time()
        with ray_for(workload, num_cpus=workload.world_size + 1) as call:
            error = call(lambda: fit_with_deadline(self._trainer(workload), self.timeout_s))
        if error is not None:
            run.status, run.error = "failed", f"{type(error).__name__}: {error}"
        return collect(run, workload, t_start)

    def _trainer(self, workload: Workload) -> Any:
        return TorchTrainer(
            _train_fn,
            train_loop_config={"workload": workload.to_json()},
            torch_config=TorchConfig(backend="gloo", timeout_s=int(workload.detect_timeout_s)),
            scaling_config=ScalingConfig(
                num_workers=workload.world_size, use_gpu=False,
                resources_per_worker={"CPU": 1.0, **rank_resources(workload)},
                placement_strategy="SPREAD" if workload.nodes else "PACK"),
            run_config=RunConfig(
                name="ray_train", storage_path=os.path.join(workload.run_dir, "storage"),
                failure_config=FailureConfig(max_failures=len(workload.fault_plan) + 1),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
                callbacks=[bench_callback(workload.run_dir)]),
        )
