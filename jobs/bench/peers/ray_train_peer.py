"""Ray Train: `TorchTrainer` + `FailureConfig(max_failures=N)`, the peer a Ray user would pick.

Each rank saves its FSDP shard with DCP into a local folder and hands it to
`ray.train.report(checkpoint=Checkpoint.from_directory(...))` every K steps; Ray Train uploads
every rank's files into one checkpoint folder under the run's storage path and registers it.
On any failure the controller tears the whole worker group down and starts a new one, whose
train function resumes from `ray.train.get_checkpoint()`.

What is observed, and how: a public controller-side `UserCallback` logs `after_exception` (the
moment Ray Train's controller learns of a failure, by polling the workers) as detection and
`after_report` with a checkpoint as the commit. The train function's entry marks the new attempt's
start; Ray Train builds the process group before calling it, so rendezvous falls into "teardown".
Hangs are not supported: Ray Train has no heartbeat of its own, a hung rank is only noticed when
the collective times out (30 minutes by default), so a hang fault is skipped, not waited for.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from ray_resilience.testing import FaultKind

from .events import EventLog
from .launcher import collect
from .ray_session import private_ray
from .spec import PeerRun, Workload
from .workload import load_state, state_dict, train

META_FILE = "bench_meta.json"


class RayTrainCheckpoints:
    """`CheckpointIO` through Ray Train's checkpoint API (one instance per worker attempt)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        import ray.train  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return 0
        with checkpoint.as_directory() as folder:
            load_state(model, optimizer, folder)
            with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
                return int(json.load(f)["step"])

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import ray.train  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs

        folder = tempfile.mkdtemp(prefix=f"rrb_ckpt_{step}_")
        try:
            dcp.save(state_dict(model, optimizer), checkpoint_id=folder)
            if self.rank == 0:
                with open(os.path.join(folder, META_FILE), "w", encoding="utf-8") as f:
                    json.dump({"step": step}, f)
            ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(folder),
                             checkpoint_dir_name=f"step_{step:06d}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _train_fn(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker: log the attempt's start, then the shared loop."""
    import ray.train  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs

    t_entry = time.time()
    workload = Workload.from_json(config["workload"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    log = EventLog(workload.run_dir, f"rank{rank}-pid{os.getpid()}-{uuid.uuid4().hex[:6]}")
    log.start(rank, t_entry)
    train(workload, rank=rank, world_size=world_size, log=log, ckpt=RayTrainCheckpoints(rank))


def _callback(run_dir: str) -> Any:
    """A controller-side `ray.train.UserCallback` that logs detections and commits."""
    import ray.train  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs

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


class RayTrainPeer:
    """Ray Train v2 `TorchTrainer` with `FailureConfig(max_failures=len(plan) + 1)`."""

    name = "ray-train"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM})

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        try:
            import ray.train.torch  # noqa: F401, PLC0415 - the probe: ImportError is the answer
        except ImportError as exc:
            return f"ray[train] is not installed: {exc}"
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, checkpoint_interval=workload.checkpoint_interval,
                      faulty=len(workload.fault_plan) > 0, run_dir=workload.run_dir,
                      notes=[("detect = controller's after_exception callback (it polls "
                              "workers every 2 s by default); teardown includes the new "
                              "worker group's process-group setup")])
        with private_ray():
            t_start = time.time()
            error = self._fit(workload)
        if error is not None:
            run.status, run.error = "failed", f"{type(error).__name__}: {error}"
        return collect(run, workload, t_start)

    def _fit(self, workload: Workload) -> BaseException | None:
        """`fit()` on a thread, so the run has a deadline; leaving `private_ray` on a timeout
        shuts the whole private Ray down, which ends the run and the thread with it."""
        outcome: list[BaseException | None] = []

        def fit() -> None:
            try:
                outcome.append(self._trainer(workload).fit().error)
            except Exception as exc:  # noqa: BLE001 - v2 raises TrainingFailedError
                outcome.append(exc)

        thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if not outcome:
            return TimeoutError(f"Ray Train run still going after timeout_s={self.timeout_s:.0f}")
        return outcome[0]

    def _trainer(self, workload: Workload) -> Any:
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs
        from ray.train.torch import TorchConfig, TorchTrainer  # noqa: PLC0415 - optional peer: Ray Train loads only when it runs

        return TorchTrainer(
            _train_fn,
            train_loop_config={"workload": workload.to_json()},
            torch_config=TorchConfig(backend="gloo",
                                     timeout_s=int(workload.process_group_timeout_s)),
            scaling_config=ScalingConfig(num_workers=workload.world_size, use_gpu=False),
            run_config=RunConfig(
                name="ray_train", storage_path=os.path.join(workload.run_dir, "storage"),
                failure_config=FailureConfig(max_failures=len(workload.fault_plan) + 1),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
                callbacks=[_callback(workload.run_dir)]),
        )
