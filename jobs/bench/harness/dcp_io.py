"""Durable checkpoints with torch DCP `async_save` in its fastest CPU configuration.

What a torchrun or ft_launcher user who follows torch's and torchtitan's async-checkpoint advice
writes: `async_save` with staging in a background thread into shared memory (the copy overlaps
the next forward and backward; the next optimizer step waits for it, as it must, or the
checkpoint could be torn) and save-plan caching. The write runs on the thread checkpointer with
a process group of its own: the process checkpointer (`CHECKPOINTER = "process"`) spawns a
checkpoint process per rank at its first save, which every restart pays again (seconds of
interpreter and torch import here); the checkpoint benchmark measures both. A new save first
waits for the previous one (torchtitan's policy), so every requested save is persisted. When
rank 0's upload completes, every rank's shard and the metadata are written: it commits the
checkpoint by replacing the `LATEST` marker atomically. A rank killed mid-save leaves a folder
no marker points at; it is never loaded. The two newest committed checkpoints are kept. A
process without a default process group (a torchft replica group of one rank) saves alone
(`no_dist`).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from .events import EventLog
from .workload import Restored

CHECKPOINTER = "thread"
CHECKPOINTS_DIR = "checkpoints"
MARKER = "LATEST"
KEEP = 2
#: The configuration, written beside the rows that use it.
DESCRIPTION = ("DCP async_save: thread checkpointer on its own gloo group, async staging into "
               "shared memory, plan caching; a save waits for the previous one")

# Re-saving a step after a rollback overwrites the uncommitted folder on purpose.
warnings.filterwarnings("ignore", message="Detected an existing checkpoint")


def dcp_state(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    """The sharded (DTensor) model + optimizer state and this rank's RNG state under a key of
    its own (a plain tensor under a shared key would be deduplicated to rank 0's)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "rng": {f"rank{rank}": torch.get_rng_state()}}


def load_dcp(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
             path: str) -> torch.Tensor:
    """Load a DCP checkpoint folder into model and optimizer in place (collective); returns
    this rank's saved RNG state."""
    state = dcp_state(model, optimizer, rank)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return state["rng"][f"rank{rank}"]


class AsyncDCP:
    """Durable tier of a `CheckpointIO`: one instance per rank and process."""

    def __init__(self, run_dir: str, rank: int, log: EventLog, *,
                 checkpointer: str = CHECKPOINTER, skip_if_busy: bool = False) -> None:
        self.root = os.path.join(run_dir, CHECKPOINTS_DIR)
        self.rank, self.log, self.skip_if_busy = rank, log, skip_if_busy
        self._alone = not torch.distributed.is_initialized()
        self._process = checkpointer == "process" and not self._alone
        # The thread checkpointer runs the save's collectives beside training's: on a group of
        # their own, or they would interleave with FSDP's on the default group.
        self._group = None if self._alone or self._process else \
            torch.distributed.new_group(backend="gloo")
        os.makedirs(self.root, exist_ok=True)
        self._stager = DefaultStager(StagingOptions(
            use_pinned_memory=False, use_shared_memory=True, use_async_staging=True,
            use_non_blocking_copy=False))  # pinned memory and non-blocking copies need CUDA
        self._planner = DefaultSavePlanner(enable_plan_caching=True)
        self._pending: Any = None
        self._committed = threading.Event()
        self._committed.set()

    def newest(self) -> tuple[int, str] | None:
        """(step, folder) of the newest committed checkpoint (every rank reads the same marker:
        it only changes during a save, and no save runs while an attempt starts)."""
        path = os.path.join(self.root, MARKER)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            marker = json.load(f)
        return int(marker["step"]), os.path.join(self.root, marker["dir"])

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        newest = self.newest()
        if newest is None:
            return None
        rng = load_dcp(model, optimizer, self.rank, newest[1])
        return Restored(step=newest[0], rng=rng, tier="storage")

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Start saving `step`; False when `skip_if_busy` dropped it (every rank agrees)."""
        if self.skip_if_busy and self._busy():
            return False
        self.finish_pending()
        name = f"step_{step:06d}"
        self._pending = dcp.async_save(
            dcp_state(model, optimizer, self.rank), checkpoint_id=os.path.join(self.root, name),
            async_checkpointer_type=AsyncCheckpointerType.PROCESS if self._process
            else AsyncCheckpointerType.THREAD, async_stager=self._stager,
            planner=self._planner, process_group=self._group, no_dist=self._alone)
        if self.rank == 0:
            self._committed.clear()
            self._pending.upload_completion.add_done_callback(
                lambda future: self._commit(step, name, ok=future.exception() is None))
        return True

    def _busy(self) -> bool:
        """Whether any rank's previous save is still being written."""
        busy = torch.tensor([int(self._pending is not None
                                 and not self._pending.upload_completion.done())])
        if not self._alone:
            torch.distributed.all_reduce(busy, op=torch.distributed.ReduceOp.MAX)
        return bool(busy.item())

    def before_optimizer_step(self) -> float:
        if self._pending is None or self._pending.staging_completion.done():
            return 0.0
        start = time.time()
        self._pending.staging_completion.result()
        return time.time() - start

    def finish_pending(self) -> None:
        if self._pending is not None:
            self._pending.upload_completion.result()
            self._committed.wait()
            self._pending = None

    def close(self) -> None:
        self.finish_pending()
        self._stager.close()
        if self._process:
            end_checkpoint_process()

    def _commit(self, step: int, name: str, *, ok: bool) -> None:
        try:
            if ok:
                self._write_marker(step, name)
        finally:
            self._committed.set()

    def _write_marker(self, step: int, name: str) -> None:
        tmp = os.path.join(self.root, f".{MARKER}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"step": step, "dir": name}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.root, MARKER))
        self.log.commit(step, source="rank0 LATEST marker")
        steps = sorted(int(n.split("_")[1]) for n in os.listdir(self.root) if n.startswith("step_"))
        for old in [s for s in steps if s <= step][:-KEEP]:
            shutil.rmtree(os.path.join(self.root, f"step_{old:06d}"), ignore_errors=True)


def end_checkpoint_process() -> None:
    """Ends torch's checkpoint daemon of this process, if one was started (DCP keeps it, with
    its staged copy of the state, until the process exits: at ~1 GB per rank, 1.3 GB each).
    torch has no public call for it: its object's finalizer asks the daemon to exit."""
    from torch.distributed.checkpoint import _async_process_executor as executor  # noqa: PLC0415

    daemon, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if daemon is not None:
        daemon.__del__()
