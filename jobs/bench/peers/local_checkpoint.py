"""Sync DCP checkpoints in a local folder: what a torchrun or ft_launcher user writes.

Each save is `torch.distributed.checkpoint.save` into `<run_dir>/checkpoints/step_000120`;
training waits for it (sync). DCP's save returns on rank 0 only after every rank's shard is
written and rank 0 has written the `.metadata` file, so rank 0 then commits the checkpoint by
replacing the `LATEST` marker atomically. A rank killed mid-save leaves a folder no marker points
at; it is never loaded and is overwritten when that step is saved again. The two newest committed
checkpoints are kept, the previous one as a fallback.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from .events import EventLog
from .workload import load_state, state_dict

CHECKPOINTS_DIR = "checkpoints"
MARKER = "LATEST"
KEEP = 2

# Re-saving a step after a rollback overwrites the uncommitted folder on purpose.
warnings.filterwarnings("ignore", message="Detected an existing checkpoint")


class LocalDCPCheckpoints:
    """`CheckpointIO` for the launcher peers; one instance per rank and process."""

    def __init__(self, run_dir: str, rank: int, log: EventLog) -> None:
        self.root = os.path.join(run_dir, CHECKPOINTS_DIR)
        self.rank = rank
        self.log = log
        os.makedirs(self.root, exist_ok=True)

    def _marker(self) -> dict | None:
        path = os.path.join(self.root, MARKER)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the checkpoint `LATEST` names (every rank reads the same marker: it only changes
        during a save, and no save runs while an attempt is starting)."""
        marker = self._marker()
        if marker is None:
            return 0
        load_state(model, optimizer, os.path.join(self.root, marker["dir"]))
        return int(marker["step"])

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        name = f"step_{step:06d}"
        dcp.save(state_dict(model, optimizer), checkpoint_id=os.path.join(self.root, name))
        if self.rank != 0:
            return
        tmp = os.path.join(self.root, f".{MARKER}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"step": step, "dir": name}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.root, MARKER))
        self.log.commit(step, source="rank0 LATEST marker")
        self._prune(keep_from=step)

    def _prune(self, keep_from: int) -> None:
        """Delete committed checkpoints older than the KEEP newest (rank 0, after a commit)."""
        steps = sorted(
            int(n.split("_")[1]) for n in os.listdir(self.root) if n.startswith("step_"))
        committed = [s for s in steps if s <= keep_from]
        for old in committed[:-KEEP]:
            shutil.rmtree(os.path.join(self.root, f"step_{old:06d}"), ignore_errors=True)
