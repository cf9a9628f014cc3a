"""One saver per checkpoint method of the checkpoint benchmark, used on every rank at once.

A saver's `save(step)` is called after the optimizer step of every save step and returns
whether it saved (a skip-when-busy policy may drop it); `before_optimizer_step()` is the wait a
method imposes on the next optimizer step (async staging, ours' snapshot guard), charged to the
save before it; `commits` are (step, time) of checkpoints that became durable, as this rank
sees them (rank 0's are the run's; ours' come from its coordinator, polled by the driver).
Every method saves the same sharded model + AdamW state and the rank's RNG state.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from harness.dcp_io import AsyncDCP, dcp_state
from harness.events import EventLog, read_events
from harness.nvrx_local import NvrxLocal
from torch.distributed.tensor import DTensor

METHODS = ("torch_save", "dcp_sync", "dcp_async", "dcp_async_process", "dcp_async_skip",
           "ours_block", "ours_coalesce", "ours_skip", "ours_local", "nvrx_local")
#: Methods that persist to storage (the others write node-local memory only).
DURABLE = METHODS[:8]


def _local(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    return value


class Saver:
    """No checkpoints (the baseline); the base of the others."""

    def __init__(self, rank: Any, folder: str) -> None:
        self.rank, self.folder = rank, folder
        self.commits: list[tuple[int, float]] = []
        self.held_bytes = 0

    def save(self, step: int) -> bool:
        return False

    def before_optimizer_step(self) -> float:
        return 0.0

    def settle(self) -> None:
        """Waits until the saves made so far are durable (after each untimed warm-up save)."""

    def finish(self) -> None:
        pass


class TorchSave(Saver):
    """torch.save of the rank's local shards, fsynced (durable, as DCP's writer and ours)."""

    def save(self, step: int) -> bool:
        state = _local(dcp_state(self.rank.model, self.rank.optimizer, self.rank.rank))
        with open(os.path.join(self.folder, f"rank{self.rank.rank}.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        self.commits.append((step, time.time()))
        return True


class DcpSync(Saver):
    def save(self, step: int) -> bool:
        dcp.save(dcp_state(self.rank.model, self.rank.optimizer, self.rank.rank),
                 checkpoint_id=os.path.join(self.folder, f"step_{step:06d}"))
        self.commits.append((step, time.time()))
        return True


class DcpAsync(Saver):
    """`harness.dcp_io.AsyncDCP`: the recovery peers' durable tier, in one of its variants."""

    def __init__(self, rank: Any, folder: str, *, checkpointer: str, skip_if_busy: bool) -> None:
        super().__init__(rank, folder)
        self._log = EventLog(folder, f"rank{rank.rank}")
        self._io = AsyncDCP(folder, rank.rank, self._log, checkpointer=checkpointer,
                            skip_if_busy=skip_if_busy)
        self.held_bytes = rank.state_bytes()  # the stager's shared-memory copy

    def save(self, step: int) -> bool:
        return self._io.save(step, self.rank.model, self.rank.optimizer)

    def before_optimizer_step(self) -> float:
        return self._io.before_optimizer_step()

    def settle(self) -> None:
        self._io.finish_pending()

    def finish(self) -> None:
        self._io.close()
        self.commits = [(e["step"], e["t"]) for e in read_events(self.folder)
                        if e["ev"] == "commit"]


class Ours(Saver):
    """Ours' `RankCheckpointer` (attached by the driver with the policy's service)."""

    def save(self, step: int) -> bool:
        ckpt = self.rank.ckpt
        return ckpt.save(step, model=self.rank.model, optimizer=self.rank.optimizer,
                         extra={"step": step, "rng": torch.get_rng_state()}) is not None

    def before_optimizer_step(self) -> float:
        return 0.0  # ours' guard waits inside optimizer.step(); the rank adds it afterwards

    def settle(self) -> None:
        self.rank.ckpt.wait_idle(600)

    def finish(self) -> None:
        self.rank.ckpt.wait_idle(600)  # held memory: the driver's, once the writers gave back


class OursLocal(Ours):
    """Ours' local tier alone: `maybe_save` on a service configured with only that tier."""

    def save(self, step: int) -> bool:
        self.rank.ckpt.maybe_save(step, model=self.rank.model, optimizer=self.rank.optimizer,
                                  extra={"step": step, "rng": torch.get_rng_state()})
        self.commits.append((step, time.time()))
        return True


class Nvrx(Saver):
    """NVRx's LocalCheckpointManager, as the launcher peers' local tier uses it."""

    def __init__(self, rank: Any, folder: str, *, shm_root: str) -> None:
        super().__init__(rank, folder)
        self._local = NvrxLocal(shm_root, os.path.basename(folder))

    def save(self, step: int) -> bool:
        self._local.save(step, self.rank.model, self.rank.optimizer)
        self.commits.append((step, time.time()))
        return True


def make_saver(method: str, rank: Any, folder: str, shm_root: str) -> Saver:
    if method == "none":
        return Saver(rank, folder)
    simple = {"torch_save": TorchSave, "dcp_sync": DcpSync, "ours_local": OursLocal}
    if method in simple:
        return simple[method](rank, folder)
    if method.startswith("dcp_async"):
        return DcpAsync(rank, folder, checkpointer="process" if method.endswith("process")
                        else "thread", skip_if_busy=method.endswith("skip"))
    if method == "nvrx_local":
        return Nvrx(rank, folder, shm_root=shm_root)
    if method.startswith("ours_"):
        return Ours(rank, folder)
    raise ValueError(f"method={method!r} is unknown; choose from none, {', '.join(METHODS)}.")
