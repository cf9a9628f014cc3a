"""The training loop every FSDP mechanism runs, once torch.distributed is up on each rank.

FSDP2 LLaMA with dropout, AdamW, the Parquet token data whose position is the step number, plus
what the benchmark needs: planned faults fire at the start of their step, before its forward
pass (once per run, via the ledger); every step and save is logged; each rank's RNG state
travels with its checkpoints; rank 0 writes the full final parameters so runs can be compared
bit for bit. Only the checkpoint path differs between mechanisms: it is a `CheckpointIO`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from ray_resilience.examples.llama import build_model, build_sharded, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset
from ray_resilience.testing.fire import fire

from .events import EventLog, FaultLedger
from .sizes import size
from .spec import FINAL_PARAMS_FILE, Workload


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a load brought back: the step to resume after, the rank's RNG state, the tier."""

    step: int
    rng: torch.Tensor | None
    tier: str


class CheckpointIO(Protocol):
    """How a mechanism persists and restores the training state; called on every rank."""

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        """Restore the newest usable checkpoint in place; None: start fresh."""
        ...

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Durable checkpoint of the state after `step`; returns when training may go on."""
        ...

    def save_local(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Node-local checkpoint of the state after `step` (a no-op without a local tier)."""
        ...

    def before_optimizer_step(self) -> float:
        """Wait until no save still reads the tensors the optimizer step changes; seconds."""
        ...

    def close(self) -> None:
        """Training is over: let saves in flight finish (after `done`, outside the wall)."""
        ...


def rank_seed(workload: Workload, rank: int) -> int:
    """Each rank's initial RNG seed (dropout masks), the same under every mechanism."""
    return workload.seed * 1000 + 17 + rank


def build(workload: Workload) -> tuple[nn.Module, torch.optim.Optimizer]:
    """FSDP2-sharded model (each block, then the root) and its AdamW, identical everywhere.

    Built on the meta device with only this rank's shards allocated, uninitialized: a restart
    loads a checkpoint straight into them (an expert user's restart never initializes the whole
    model on the CPU first), and a fresh start fills them with `init_fresh`."""
    model = build_sharded(size(workload.size).model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.lr, weight_decay=0.0)
    return model, optimizer


def init_fresh(workload: Workload, model: nn.Module) -> None:
    """A fresh start's weights: the seed's full model, each rank keeping its shards (the same
    values on every mechanism)."""
    full = build_model(size(workload.size).model, seed=workload.seed).state_dict()
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))


def restore(workload: Workload, rank: int, restored: Restored | None) -> int:
    """Resume point after a load: the RNG state as saved, or the fresh-start seed."""
    if restored is not None and restored.rng is not None:
        torch.set_rng_state(restored.rng)
    else:
        torch.manual_seed(rank_seed(workload, rank))
    return restored.step if restored is not None else 0


def train(
    workload: Workload, *, rank: int, world_size: int, log: EventLog, ckpt: CheckpointIO,
    on_step: Callable[[int], None] | None = None,
) -> int:
    """Train from the newest checkpoint to `max_steps`; returns the final step.

    `on_step(step)` runs after each completed step (NVRx heartbeats). The caller has initialised
    torch.distributed; this function never tears it down.
    """
    torch.set_num_threads(1)  # 2 ranks on 2 cores; Ray Train and torchrun both default to 1
    model, optimizer = build(workload)
    log.pg_ready(rank)
    t_load = time.time()
    restored = ckpt.load(model, optimizer)
    if restored is None:
        init_fresh(workload, model)
    start = restore(workload, rank, restored)
    log.load(rank, t_load, start, tier=restored.tier if restored else None)
    data = TokenDataset(workload.data_dir)
    faults = FaultTrigger(workload, FaultLedger(workload.run_dir), rank)
    for step in range(start + 1, workload.max_steps + 1):
        faults(step)
        inputs, targets = data.batch(step - 1, rank, world_size, workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        waited = ckpt.before_optimizer_step()
        if waited:
            log.save(rank, step - 1, waited, part="optimizer_step_wait")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.step(rank, step, loss.item())
        if step in workload.snapshot_steps:
            log.threads(rank, step)
        if on_step is not None:
            on_step(step)
        _checkpoint(workload, ckpt, log, rank, step, model, optimizer)
    write_final_params(workload, model, rank)
    log.done(rank, workload.max_steps)
    ckpt.close()
    return workload.max_steps


def _checkpoint(workload: Workload, ckpt: CheckpointIO, log: EventLog, rank: int, step: int,
                model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if workload.is_save_step(step):
        t_save = time.time()
        ckpt.save(step, model, optimizer)
        log.save(rank, step, time.time() - t_save)
    if workload.is_local_step(step):
        t_save = time.time()
        ckpt.save_local(step, model, optimizer)
        log.save(rank, step, time.time() - t_save, tier="local")


class FaultTrigger:
    """Fires this rank's planned faults at the start of their step (each once per run).

    A fault fires at the first step at or after its planned one that this rank trains: the
    same step for every mechanism whose ranks train every step, and still once for a torchft
    replica that healed past it. Fired faults are read from the ledger once per process (a
    restarted rank must not fire them again); the hot path is one comparison. Faults the
    harness fires (node loss) are not this rank's to fire.
    """

    def __init__(self, workload: Workload, ledger: FaultLedger, rank: int) -> None:
        fired = ledger.fired_ids()
        self._ledger = ledger
        self._due = [f for f in workload.fault_plan
                     if f.rank == rank and f.id not in fired and f.kind.fired_in_worker]

    def __call__(self, step: int) -> None:
        if not self._due or self._due[0].step > step:
            return
        fault = self._due.pop(0)
        self._ledger.record(fault)  # wall time first: a sigkill leaves no chance to write it later
        fire(fault)


def write_final_params(workload: Workload, model: nn.Module, rank: int) -> None:
    """Gather the full parameters (a collective) and let rank 0 write them atomically."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    params = get_model_state_dict(model, options=options)
    if rank == 0:
        save_params(workload.run_dir, params)


def save_params(run_dir: str, params: dict[str, torch.Tensor]) -> None:
    path = os.path.join(run_dir, FINAL_PARAMS_FILE)
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
