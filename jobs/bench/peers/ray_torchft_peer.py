"""Ray Train + `TorchftConfig` (Ray 2.60): Ray Train's own torchft integration.

Each worker is its own replica group (`TorchftConfig`'s backend starts one process group per
group and a lighthouse actor); on a failure the controller replaces only the failing replica
group (`_replace_bad_workers`) while the survivors keep training through torchft's quorum. The
train function is the torchft peer's loop (`torchft_loop`), as Ray's
`torchft_linear_example.py` runs it. No Ray Train checkpoints: a report is a barrier across all
workers, which a replica group that is down cannot reach. The controller's poll is lowered as
for the plain Ray Train peer.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import ray.train
from harness.events import EventLog
from harness.launcher import collect
from harness.ray_session import rank_resources, ray_for
from harness.spec import PeerRun, Workload
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2.torch.torchft_config import TorchftConfig

from ray_resilience.testing import FaultKind

from .ray_train_peer import HEALTH_CHECK_INTERVAL_S, bench_callback, fit_with_deadline
from .torchft_loop import run_replica
from .torchft_peer import HANG_UNSUPPORTED, LIGHTHOUSE_KWARGS, NOTE_NOT_BIT_EQUAL


def _train_fn(config: dict[str, Any]) -> None:
    t_entry = time.time()
    workload = Workload.from_json(config["workload"])
    rank = ray.train.get_context().get_world_rank()
    log = EventLog(workload.run_dir, f"rank{rank}-pid{os.getpid()}-{uuid.uuid4().hex[:6]}")
    log.start(rank, t_entry)
    run_replica(workload, rank, log, durable=False, world_size=1, rank=0)


class RayTorchftPeer:
    """`TorchTrainer(..., torch_config=TorchftConfig(lighthouse_kwargs=...))`."""

    name = "ray-train-torchft"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.NODE_LOSS})
    unsupported_reasons = {FaultKind.HANG: HANG_UNSUPPORTED}
    num_spares = 0
    uses_durable = False
    local_tier = False
    config = (f"TorchftConfig, replica groups of 1 worker; RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="
              f"{HEALTH_CHECK_INTERVAL_S:g}; torchft peer's loop and lighthouse settings; "
              "no checkpoints")

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, run_dir=workload.run_dir,
                      notes=[NOTE_NOT_BIT_EQUAL, "detect = controller's after_exception callback"])
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(HEALTH_CHECK_INTERVAL_S)
        t_start = time.time()
        with ray_for(workload, num_cpus=workload.world_size + 1) as call:
            error = call(lambda: fit_with_deadline(self._trainer(workload), self.timeout_s))
        # The job's steps are done when rank 0's are (`collect`); fit() also waits for a replica
        # restarted after that, which trains alone from step 0 (no live peer to heal from).
        run.notes.append(f"fit() returned {time.time() - t_start:.1f} s after the start")
        if error is not None:
            run.status, run.error = "failed", f"{type(error).__name__}: {error}"
        return collect(run, workload, t_start)

    def _trainer(self, workload: Workload) -> Any:
        return TorchTrainer(
            _train_fn, train_loop_config={"workload": workload.to_json()},
            torch_config=TorchftConfig(lighthouse_kwargs=dict(LIGHTHOUSE_KWARGS), backend="gloo",
                                       timeout_s=int(workload.detect_timeout_s)),
            scaling_config=ScalingConfig(
                num_workers=workload.world_size, use_gpu=False,
                resources_per_worker={"CPU": 1.0, **rank_resources(workload)},
                placement_strategy="SPREAD" if workload.nodes else "PACK"),
            run_config=RunConfig(
                name="ray_train_torchft", storage_path=os.path.join(workload.run_dir, "storage"),
                failure_config=FailureConfig(max_failures=len(workload.fault_plan) + 1),
                callbacks=[bench_callback(workload.run_dir)]))
