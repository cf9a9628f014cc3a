"""Run in a subprocess by test_node_loss.py: a 3-node local cluster loses a node mid-run.

Prints one JSON line: the faulty run's outcome and whether its final weights equal the fault-free
weights the test handed over (trained once on the test session's local Ray).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import threading
import time

import ray
import ray._private.state as gcs
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ray_resilience as rr
from ray_resilience._internal.constants import SUPERVISOR_NAME_PREFIX
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

STEPS = 12
#: Seconds each step sleeps: long enough that the writers' DCP import, which starts after the
#: first step on CPU ranks, ends and a step commits (and is replicated) before the last step.
STEP_SLEEP_S = 0.6


def remove_node_at(cluster: Cluster, node, run_name: str, step: int, log: dict,
                   *, add_back: bool = True, replicated: bool = True) -> None:
    """Waits until the run reaches `step` (and, with `replicated`, until both ranks' shards of
    the newest commit have a replica), removes `node` without grace, then adds capacity."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            supervisor = ray.get_actor(SUPERVISOR_NAME_PREFIX + run_name)
            status = ray.get(supervisor.status.remote())
            log["step_at_removal"] = status.get("step") or 0
            if log["step_at_removal"] >= step:
                if not replicated:
                    break
                newest = _replicated_step(ray.get(supervisor.checkpoint_stats.remote()))
                if newest is not None:
                    log["replicated_step"] = newest
                    break
        except Exception:  # noqa: BLE001 - not started yet
            pass
        time.sleep(0.05)
    log["removed_at"] = time.time()

    log["placement"] = {
        a["ActorClassName"]: a["Address"].get("NodeID") if isinstance(a["Address"], dict) else None
        for a in gcs.actors().values() if a["State"] == "ALIVE"}
    log["removed_node"] = node.node_id
    # Like Cluster.remove_node(allow_graceful=False), whose zombie check breaks on Ray 2.60.
    node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    cluster.worker_nodes.remove(node)
    if add_back:
        time.sleep(1.0)
        cluster.add_node(num_cpus=1, resources={"trainer": 1})
        log["added_at"] = time.time()


def _replicated_step(stats: dict | None) -> int | None:
    """The newest committed step once both ranks' shards of it have a replica in memory."""
    if not stats or not stats["committed_steps"]:
        return None
    newest = stats["committed_steps"][0]
    held = {rank for w in stats["writers"] for rank, s in (w.get("replica_steps") or {}).items()
            if s == newest}
    return newest if held >= {0, 1} else None


def _control_nodes(run_name: str) -> set[str]:
    """Nodes of the driver, the run's supervisor and its commit coordinator (the control
    plane, which a real cluster keeps on the head node); waits until both actors exist."""
    nodes = {ray.get_runtime_context().get_node_id()}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        alive = [a for a in gcs.actors().values() if a["State"] == "ALIVE"]
        sup = [a for a in alive if a.get("Name") == SUPERVISOR_NAME_PREFIX + run_name]
        coord = [a for a in alive if a["ActorClassName"] == "CommitCoordinator"]
        if sup and coord:
            return nodes | {sup[0]["Address"]["NodeID"], coord[0]["Address"]["NodeID"]}
        time.sleep(0.05)
    return nodes


def _equal(faulty: rr.Result, clean: list[dict] | None) -> bool:
    return bool(faulty.ok and clean) and all(
        workload.torch.equal(faulty.return_values[r]["state"][k], clean[r][k])
        for r in range(2) for k in clean[r])


def main(data_dir: str, storage: str, mode: str, reference: str | None) -> None:
    """mode "replace": capacity returns and the lost rank is respawned (bit-equal oracle);
    mode "fresh": the same before anything is committed, so every rank starts over while the
    survivor still holds local snapshots (bit-equal oracle);
    mode "shrink": it never returns and the run finishes on the remaining rank;
    mode "exclude": rank 1 is killed twice on its node, which is then excluded (see `exclude`).
    `reference`: the fault-free final weights of the same workload (a file the test wrote)."""
    clean = workload.torch.load(reference, weights_only=True) if reference else None
    # No dashboard: nothing here uses it, and its ten head processes took 2-3 s of the start
    # and CPU all run long on this 2-core machine.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    workers = [cluster.add_node(num_cpus=1, resources={"trainer": 1})
               for _ in range(3 if mode == "exclude" else 2)]
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    scaling = {"num_workers": 2, "resources_per_worker": {"trainer": 1}}

    def fit(name: str, resilience: rr.ResilienceConfig) -> rr.Result:
        return rr.ResilientTrainer(
            workload.train_loop, train_loop_config={"data_dir": data_dir, "max_steps": STEPS,
                                                    "sleep_s": STEP_SLEEP_S},
            scaling_config=rr.ScalingConfig(placement_strategy="SPREAD", **scaling),
            run_config=rr.RunConfig(name=name, storage_path=storage, verbose=False),
            resilience=resilience).fit(raise_on_failure=False)  # reported as data below

    if mode == "exclude":
        exclude(fit, clean)
        ray.shutdown()
        cluster.shutdown()
        return
    if mode in ("replace", "fresh"):
        in_job = rr.InJobConfig(heartbeat_timeout_s=3.0, replacement_timeout_s=60.0)
    else:
        in_job = rr.InJobConfig(heartbeat_timeout_s=3.0, replacement_timeout_s=5.0, min_workers=1)
    log: dict = {}
    box: dict = {}
    # Node processes can only be killed from the main thread (signals): train in a thread.
    # Replicas of each rank's newest committed shard on the other node's writer: the rank moved
    # to the new node can restore from memory although its writer died with the lost node.
    checkpoint = CheckpointConfig(interval_steps=100 if mode == "fresh" else 2, memory_replicas=1)
    resilience = rr.ResilienceConfig.default(checkpoint=checkpoint, in_job=in_job)
    trainer = threading.Thread(target=lambda: box.update(result=fit("lost", resilience)))
    trainer.start()
    # All simulated nodes share one IP, so the driver may be attached to a worker node's raylet
    # and the supervisor (with the commit coordinator) may live there. Remove the other one.
    control = _control_nodes("lost")
    log["control_nodes"] = sorted(control)
    victims = [n for n in workers if n.node_id not in control]
    if not victims:  # the control plane spans both worker nodes: nothing can be removed safely
        raise RuntimeError(f"supervisor/coordinator/driver occupy every worker node: {control}")
    victim = victims[0]
    remove_node_at(cluster, victim, "lost", 5, log, add_back=mode != "shrink",
                   replicated=mode != "fresh")
    trainer.join()
    faulty = box["result"]
    print(json.dumps({"ok": faulty.ok,
                      "final_step": faulty.metrics.get("step"),
                      "world_sizes": sorted({v is not None for v in faulty.return_values}),
                      "num_returns": len(faulty.return_values), "error": str(faulty.error),
                      "faults": faulty.faults, "bit_equal": _equal(faulty, clean), "log": log,
                      "loads": (faulty.checkpoint or {}).get("loads"),
                      "restore_s": (faulty.checkpoint or {}).get("restore_s"),
                      "recoveries": [dataclasses.asdict(f) for f in faulty.goodput.faults]
                      if faulty.goodput is not None else None}, default=str))
    ray.shutdown()
    cluster.shutdown()


def exclude(fit, clean: list[dict] | None) -> None:
    """Rank 1 is SIGKILLed at steps 4 and 8 on the same node; with max_node_faults=1 that node
    is excluded at the second fault and rank 1 moves to the third node (3 worker nodes, 2 ranks)."""
    plan = FaultPlan.explicit([Fault(step=4, rank=1, kind="sigkill"),
                                  Fault(step=8, rank=1, kind="sigkill")])
    faulty = fit("exclude", rr.ResilienceConfig.default(
        checkpoint_interval=2, fault_plan=plan,
        in_job=rr.InJobConfig(max_node_faults=1, replacement_timeout_s=60.0)))
    print(json.dumps({"ok": faulty.ok, "error": str(faulty.error),
                      "faults": faulty.faults, "bit_equal": _equal(faulty, clean),
                      "final_nodes": [v["node_id"] if v else None for v in faulty.return_values]},
                     default=str))


if __name__ == "__main__":
    os.environ.pop("RAY_ADDRESS", None)
    tempfile.tempdir = tempfile.mkdtemp(prefix="rr-nl-", dir="/tmp")
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "replace",
         sys.argv[4] if len(sys.argv) > 4 else None)
