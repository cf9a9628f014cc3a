"""Node-local checkpoints with NVRx's `LocalCheckpointManager` (nvidia-resiliency-ext 0.4.1).

The manager writes each rank's state to a node-local folder (here /dev/shm) and, on restart,
agrees with the other ranks on the newest iteration every rank holds. Its shipped state-dict
class, `BasicTensorAwareStateDict`, asserts every tensor is on CUDA and moves tensors back to
"cuda" on load, and its async save path calls `torch.cuda.synchronize()`; neither can run on a
CPU-only torch. `TensorAwareStateDict` is the documented extension point for frameworks, so
this module implements it for CPU tensors and uses the manager's synchronous save (the save
serializes the tensors before training resumes, so no copy is needed first).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import (
    LocalCheckpointManager,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from .workload import Restored

DESCRIPTION = "NVRx LocalCheckpointManager to /dev/shm (sync; CPU TensorAwareStateDict)"

# The manager logs every save and rename at INFO; the launcher's log is our detection signal.
logging.getLogger("nvidia_resiliency_ext").setLevel(logging.WARNING)


class CpuTensorAwareStateDict(BasicTensorAwareStateDict):
    """NVRx's basic state dict for tensors that already live in CPU memory."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict
        self._is_hollow = False

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Already on CPU; the synchronous save serializes them before training resumes."""

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """They stay on CPU."""


def _local(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    return value


def _live_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards: views of the live parameters and optimizer state."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": _local(model_sd), "optim": _local(optim_sd["state"])}


def _copy_into(live: Any, saved: Any) -> None:
    if isinstance(live, dict):
        for key, value in live.items():
            _copy_into(value, saved[key])
    elif isinstance(live, torch.Tensor):
        with torch.no_grad():
            live.copy_(saved)


class NvrxLocal:
    """Local tier of a `CheckpointIO`: one instance per rank and process."""

    def __init__(self, root: str, session: str) -> None:
        self._manager = LocalCheckpointManager(root, session_id=session)

    def newest_step(self) -> int:
        """Newest iteration every rank holds (collective), -1 if none."""
        return self._manager.find_latest()

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored:
        """Load the iteration `newest_step` found (collective)."""
        step = self._manager.find_latest()
        loaded, _ = self._manager.load()
        _copy_into(_live_state(model, optimizer), loaded.state_dict["state"])
        return Restored(step=step, rng=loaded.state_dict["rng"], tier="local")

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        state = {"state": _live_state(model, optimizer), "rng": torch.get_rng_state()}
        self._manager.save(CpuTensorAwareStateDict(state), step, is_async=False)
