"""A checkpoint service for the harness ranks and the checks the checkpoint tests share."""

from __future__ import annotations

import os
import time

import ray
import torch

from ray_resilience._internal.checkpoint.service.service import CheckpointService
from ray_resilience.checkpoint import CheckpointConfig


def start_service(storage_path: str, world_size: int, run: str = "run",
                  **config) -> CheckpointService:
    """A service for the harness ranks. The local tier is off unless asked for: these tests are
    about committed checkpoints, which a newer local snapshot would otherwise shadow on load."""
    config.setdefault("local_interval_steps", 0)
    node = ray.get_runtime_context().get_node_id()
    return CheckpointService.start(
        storage_path=storage_path, run_name=run, storage_filesystem=None, world_size=world_size,
        node_ids_by_rank=[node] * world_size, config=CheckpointConfig(**config))


def wait_committed(service: CheckpointService, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while service.latest_committed_step() != step:
        assert time.monotonic() < deadline, f"step {step} not committed: {service.stats()}"
        time.sleep(0.1)


def wait_dropped(service: CheckpointService, step: int, timeout_s: float = 60.0) -> list[dict]:
    """The coordinator's record of the dropped saves of `step`, once there is one."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [d for d in service.stats()["dropped"] if d["step"] == step]
        if found:
            return found
        assert time.monotonic() < deadline, f"no dropped save of step {step}: {service.stats()}"
        time.sleep(0.1)


def assert_same(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def step_folder(root: str, run: str, step: int) -> str:
    folder = os.path.join(root, run, "checkpoints")
    (name,) = [n for n in os.listdir(folder) if n.startswith(f"step_{step:012d}_")]
    return os.path.join(folder, name)
