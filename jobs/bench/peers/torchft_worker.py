"""One torchft replica group (one rank) of the benchmark workload, started by torchrun.

    TORCHFT_LIGHTHOUSE=http://localhost:29510 torchrun --standalone --nproc-per-node 1 \
        --max-restarts 5 -m peers.torchft_worker RUN/workload.json --replica 1

torchft's model of fault tolerance differs from the others': every rank is its own replica group,
the groups agree on a quorum through the lighthouse at every step, and when one dies the others
keep training without it (the step in flight is discarded, nothing is rolled back). The dead
replica is restarted by its own launcher and heals from a live peer's state over HTTP instead of
loading a checkpoint. So the model is replicated (gradients averaged by the manager's allreduce),
not FSDP-sharded, and there are no storage checkpoints: with replica groups of one rank, sharding
would need torchft's HSDP mesh, and a checkpoint only matters here when every replica dies at once.

Step events carry the number of participating replicas, so infra goodput counts only the steps
the full world trained.
"""

from __future__ import annotations

import time

_T_PROCESS = time.time()  # first statement: the replica's process start, before the torch import

# The imports come after that timestamp on purpose (torch takes seconds to import).
import argparse
import os
from datetime import timedelta
from typing import Any

import torch

from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset

from .events import EventLog, FaultLedger
from .spec import FINAL_PARAMS_FILE, Workload
from .workload import fire_due_faults

#: Collective / RPC timeout of the manager: a dead peer's allreduce fails by connection loss
#: long before this; it bounds a stuck one.
MANAGER_TIMEOUT_S = 10.0


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", help="path of the run's workload.json")
    parser.add_argument("--replica", type=int, required=True, help="replica group index")
    args = parser.parse_args(argv)
    from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: PLC0415 - optional: the torchft peer only

    workload, replica = Workload.read(args.workload), args.replica
    log = EventLog(workload.run_dir, f"rank{replica}-pid{os.getpid()}")
    log.start(replica, _T_PROCESS)
    torch.set_num_threads(1)
    model = build_model(workload.model, seed=workload.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=workload.lr, weight_decay=0.0)
    manager_ref: list[Any] = []

    def load_state_dict(state: dict[str, Any]) -> None:
        """Called by the manager when this replica heals from a live peer."""
        t_start = time.time()
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        step = manager_ref[0].current_step() if manager_ref else 0
        log.load(replica, t_start, from_step=step)

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=MANAGER_TIMEOUT_S)), min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"bench_replica_{replica}", timeout=timedelta(seconds=MANAGER_TIMEOUT_S),
        # Synchronous quorum: zero_grad() returns with this step's quorum formed (and the
        # replica healed if it was behind), so the step number below is the one trained.
        use_async_quorum=False,
        init_sync=False)  # same seed, same initial weights on every replica
    manager_ref.append(manager)
    log.pg_ready(replica)
    optimizer = Optimizer(manager, inner)
    data, ledger = TokenDataset(workload.data_dir), FaultLedger(workload.run_dir)
    while manager.current_step() < workload.max_steps:
        optimizer.zero_grad()  # joins this step's quorum; heals from a peer if behind
        step = manager.current_step() + 1
        fire_due_faults(workload, ledger, replica, step)
        inputs, targets = data.batch(step - 1, replica, workload.world_size, workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        _average_gradients(manager, model)
        optimizer.step()  # applied only if every participant's allreduce succeeded
        if manager.current_step() >= step:
            log.write("step", rank=replica, step=step, loss=loss.item(),
                      world=manager.num_participants())
    if manager.current_step() >= workload.max_steps:  # any replica that got to the end
        path = os.path.join(workload.run_dir, FINAL_PARAMS_FILE)
        torch.save(model.state_dict(), f"{path}.{replica}.tmp")
        os.replace(f"{path}.{replica}.tmp", path)
    log.done(replica, manager.current_step())
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
