"""The launchers' `CheckpointIO`: durable DCP async checkpoints plus, optionally, NVRx's
node-local tier; a restart resumes from whichever holds the newer step."""

from __future__ import annotations

import torch
from torch import nn

from .dcp_io import AsyncDCP
from .events import EventLog
from .nvrx_local import NvrxLocal
from .spec import Workload
from .workload import Restored


class TieredCheckpoints:
    """Every rank builds one per process; `load`, `save` and `save_local` are collective."""

    def __init__(self, workload: Workload, rank: int, log: EventLog, *, local: bool) -> None:
        self.durable = AsyncDCP(workload.run_dir, rank, log)
        session = workload.run_dir.rstrip("/").rsplit("/", 1)[-1]
        self.local = NvrxLocal(workload.local_root, session) if local else None

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        newest = self.durable.newest()
        durable_step = newest[0] if newest is not None else 0
        if self.local is not None and self.local.newest_step() > durable_step:
            return self.local.load(model, optimizer)
        return self.durable.load(model, optimizer)

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.durable.save(step, model, optimizer)

    def save_local(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.local is not None:
            self.local.save(step, model, optimizer)

    def before_optimizer_step(self) -> float:
        return self.durable.before_optimizer_step()

    def close(self) -> None:
        self.durable.close()
