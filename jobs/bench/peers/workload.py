"""The training loop every peer runs, once torch.distributed is up on each rank.

Same as `jobs/train_llama_fsdp.py`'s loop (FSDP2 tiny LLaMA, AdamW, the Parquet token data whose
position is the step number), plus what the benchmark needs: the planned faults fire at the
start of their step (once per run, via the ledger), every step and save is logged, and rank 0
writes the full final parameters so a faulty run can be compared with a fault-free one bit for
bit. Only the checkpoint path differs between peers, so it is passed in as a `CheckpointIO`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset
from ray_resilience.testing.fire import fire

from .events import EventLog, FaultLedger
from .spec import FINAL_PARAMS_FILE, Workload


class CheckpointIO(Protocol):
    """How a peer persists and restores the training state; called on every rank."""

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Restore the newest usable checkpoint into model and optimizer; return its step
        (0 when there is none and training starts fresh)."""
        ...

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Save the state after `step`; returns when training may continue."""
        ...


def state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The sharded (DTensor) model + optimizer state, the form DCP saves and loads."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Load a DCP checkpoint directory into model and optimizer in place (collective)."""
    state = state_dict(model, optimizer)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def build(workload: Workload) -> tuple[nn.Module, torch.optim.Optimizer]:
    """FSDP2-sharded model (each block, then the root) and its AdamW, identical on every peer."""
    model = build_model(workload.model, seed=workload.seed)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr, weight_decay=0.0)
    return model, optimizer


def train(
    workload: Workload, *, rank: int, world_size: int, log: EventLog, ckpt: CheckpointIO,
    on_step: Callable[[int], None] | None = None,
) -> int:
    """Train from the newest checkpoint to `max_steps`; returns the final step.

    `on_step(step)` runs after each completed step (NVRx heartbeats). The caller has initialised
    torch.distributed; this function never tears it down (see `finish`).
    """
    torch.set_num_threads(1)  # 2 ranks on 2 cores; Ray Train and torchrun both default to 1
    model, optimizer = build(workload)
    log.pg_ready(rank)
    t_load = time.time()
    start = ckpt.load(model, optimizer)
    log.load(rank, t_load, start)
    data = TokenDataset(workload.data_dir)
    ledger = FaultLedger(workload.run_dir)
    for step in range(start + 1, workload.max_steps + 1):
        fire_due_faults(workload, ledger, rank, step)
        inputs, targets = data.batch(step - 1, rank, world_size, workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.step(rank, step, loss.item())
        if on_step is not None:
            on_step(step)
        # No save after the last step: nothing is left to protect (final params go separately).
        if step % workload.checkpoint_interval == 0 and step < workload.max_steps:
            t_save = time.time()
            ckpt.save(step, model, optimizer)
            log.save(rank, step, time.time() - t_save)
    write_final_params(workload, model, rank)
    log.done(rank, workload.max_steps)
    return workload.max_steps


def fire_due_faults(workload: Workload, ledger: FaultLedger, rank: int, step: int) -> None:
    """Fire the faults planned for (rank, step) that have not fired in an earlier attempt."""
    due = workload.fault_plan.for_rank_step(rank, step)
    if not due:
        return  # the common case: no file read on the hot path
    for fault in workload.fault_plan.for_rank_step(rank, step, exclude=ledger.fired_ids()):
        ledger.record(fault)  # wall time first: a sigkill leaves no chance to write it later
        fire(fault)


def write_final_params(workload: Workload, model: nn.Module, rank: int) -> None:
    """Gather the full parameters (a collective) and let rank 0 write them atomically."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    params = get_model_state_dict(model, options=options)
    if rank == 0:
        path = os.path.join(workload.run_dir, FINAL_PARAMS_FILE)
        torch.save(params, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)


def read_final_params(run_dir: str) -> dict[str, torch.Tensor] | None:
    """The parameters rank 0 wrote at the end of the run, or None if it never got there."""
    path = os.path.join(run_dir, FINAL_PARAMS_FILE)
    return torch.load(path, weights_only=True) if os.path.exists(path) else None


def params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, float]:
    """(bit-for-bit equal, largest absolute difference) of two parameter dicts."""
    if a.keys() != b.keys():
        return False, float("inf")
    worst = 0.0
    for name, tensor in a.items():
        other = b[name]
        if tensor.shape != other.shape:
            return False, float("inf")
        worst = max(worst, (tensor.double() - other.double()).abs().max().item())
    return all(torch.equal(t, b[n]) for n, t in a.items()), worst
