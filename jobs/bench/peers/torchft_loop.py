"""The training loop of one torchft replica group (one rank), shared by the torchft peer and
Ray Train's `TorchftConfig` peer.

Every rank is its own replica group; the groups agree on a quorum through the lighthouse at
every step (torchft's default asynchronous quorum, formed during the forward pass), and when one
dies the others keep training without it: the step in flight is discarded, nothing is rolled
back. The dead replica is restarted by its launcher and heals from a live peer's state instead
of loading a checkpoint. So the model is replicated (gradients averaged by the manager's
allreduce), not FSDP-sharded. With `durable`, replica 0 also saves DCP checkpoints every
`checkpoint_interval` steps (async, as `harness.dcp_io`), what a production user adds so that
losing every replica at once does not lose the run.

Step events carry the number of participating replicas, so infra goodput counts only the steps
the full world trained. Replicas start together (`_start_together`), as the ranks of every other
mechanism do through their rendezvous: the lighthouse forms a quorum as soon as `min_replicas`
heartbeating replicas joined, so a replica whose interpreter started faster would otherwise
train alone until the other's manager is up.
"""

from __future__ import annotations

import os
import pathlib
import time
from datetime import timedelta
from typing import Any

import torch
from harness.dcp_io import AsyncDCP
from harness.events import EventLog, FaultLedger
from harness.sizes import size
from harness.spec import FINAL_PARAMS_FILE, Workload
from harness.workload import FaultTrigger, rank_seed
from torchft import Manager, Optimizer, ProcessGroupGloo

from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset


def _average_gradients(manager: Any, model: torch.nn.Module) -> None:
    """Average the gradients over the step's participants with the manager's fault-tolerant
    allreduce (a failed one marks the step uncommittable instead of raising).

    torchft's own DistributedDataParallel wrapper is not used: on a peer's death its comm hook
    fails an assertion (`assert fut._fut`, torchft 0.2.0 with torch 2.13 on CPU), which kills
    the survivor too, the opposite of what torchft is for.
    """
    works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
    for work in works:
        work.wait()


START_TIMEOUT_S = 300.0


def _start_together(workload: Workload, replica: int) -> None:
    """First start of a replica: wait until every replica's manager is up (a file each in the
    run folder). A restarted replica finds its own file and goes on at once."""
    folder = os.path.join(workload.run_dir, "torchft_started")
    os.makedirs(folder, exist_ok=True)
    mine = os.path.join(folder, str(replica))
    if os.path.exists(mine):
        return
    pathlib.Path(mine).touch()
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(os.listdir(folder)) < workload.world_size and time.monotonic() < deadline:
        time.sleep(0.05)


def run_replica(workload: Workload, replica: int, log: EventLog, *, durable: bool,
                **manager_kwargs: Any) -> None:
    """Train replica group `replica` to `max_steps` (or until the job ends)."""
    torch.set_num_threads(1)
    torch.manual_seed(rank_seed(workload, replica))
    model = build_model(size(workload.size).model, seed=workload.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=workload.lr, weight_decay=0.0)
    timeout = timedelta(seconds=workload.detect_timeout_s)
    manager_ref: list[Any] = []

    def load_state_dict(state: dict[str, Any]) -> None:
        """Called by the manager when this replica heals from a live peer."""
        t_start = time.time()
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        step = manager_ref[0].current_step() if manager_ref else 0
        log.load(replica, t_start, from_step=step, tier="peer")

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"bench_replica_{replica}", timeout=timeout, **manager_kwargs)
    manager_ref.append(manager)
    _start_together(workload, replica)
    log.pg_ready(replica)
    saver = AsyncDCP(workload.run_dir, 0, log) if durable and replica == 0 else None
    optimizer = Optimizer(manager, inner)
    data = TokenDataset(workload.data_dir)
    faults = FaultTrigger(workload, FaultLedger(workload.run_dir), replica)
    while manager.current_step() < workload.max_steps:
        optimizer.zero_grad()  # starts this step's quorum (asynchronous: it overlaps forward)
        step = manager.current_step() + 1
        faults(step)
        inputs, targets = data.batch(step - 1, replica, workload.world_size, workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        _average_gradients(manager, model)
        if saver is not None:
            saver.before_optimizer_step()
        optimizer.step()  # applied only if every participant's allreduce succeeded
        if manager.current_step() >= step:
            log.write("step", rank=replica, step=step, loss=loss.item(),
                      world=manager.num_participants())
            if saver is not None and workload.is_save_step(step):
                t_save = time.time()
                saver.save(step, model, inner)
                log.save(replica, step, time.time() - t_save)
    if manager.current_step() >= workload.max_steps:  # any replica that got to the end
        path = os.path.join(workload.run_dir, FINAL_PARAMS_FILE)
        torch.save(model.state_dict(), f"{path}.{replica}.tmp")
        os.replace(f"{path}.{replica}.tmp", path)
    log.done(replica, manager.current_step())
    if saver is not None:
        saver.close()
    manager.shutdown(wait=False)
