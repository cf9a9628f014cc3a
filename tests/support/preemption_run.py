"""Run in a subprocess by test_preemption.py: a simulated cluster where one rank's node is a
real `ray start --block` process; it gets SIGTERM mid-run, as Kubernetes sends a pod on a spot
reclaim. Prints one JSON line: the run's outcome, where each rank ended, whether its final weights
equal the fault-free weights the test handed over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ray_resilience as rr
from ray_resilience._internal.constants import SUPERVISOR_NAME_PREFIX
from ray_resilience.checkpoint import CheckpointConfig
from tests.support import workload

STEPS = 20
RUN = "preempted"


def start_node(address: str) -> tuple[subprocess.Popen, str]:
    """A worker node as Kubernetes runs one: `ray start --block`, here as a child process;
    returns it and its node id once it joined."""
    before = {n["NodeID"] for n in ray.nodes()}
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start", f"--address={address}",
         "--num-cpus=1", '--resources={"trainer": 1}', "--block"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in before]
        if new:
            return proc, new[0]
        time.sleep(0.2)
    raise RuntimeError("the `ray start` node did not join in 120 s")


def sigterm_at(proc: subprocess.Popen, step: int, log: dict) -> None:
    """Waits until the run reaches `step`, then sends SIGTERM to the node's `ray start`."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            status = ray.get(ray.get_actor(SUPERVISOR_NAME_PREFIX + RUN).status.remote())
            if (status.get("step") or 0) >= step:
                break
        except Exception:  # noqa: BLE001 - not started yet
            pass
        time.sleep(0.05)
    log["sigterm_step"] = status.get("step")
    log["sigterm_at"] = time.time()
    proc.send_signal(signal.SIGTERM)


def main(data_dir: str, storage: str, reference: str) -> None:
    clean = workload.torch.load(reference, weights_only=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    cluster.add_node(num_cpus=1, resources={"trainer": 1})
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    proc, victim = start_node(cluster.address)  # after ray.init: the driver is not on it
    box: dict = {}
    resilience = rr.ResilienceConfig.default(
        checkpoint=CheckpointConfig(interval_steps=4),
        in_job=rr.InJobConfig(heartbeat_timeout_s=10.0, replacement_timeout_s=60.0))
    trainer = threading.Thread(target=lambda: box.update(result=rr.ResilientTrainer(
        workload.train_loop, train_loop_config={"data_dir": data_dir, "max_steps": STEPS,
                                                "sleep_s": 0.2},
        scaling_config=rr.ScalingConfig(num_workers=2, placement_strategy="SPREAD",
                                        resources_per_worker={"trainer": 1}),
        run_config=rr.RunConfig(name=RUN, storage_path=storage, verbose=False),
        resilience=resilience).fit()))
    trainer.start()
    log: dict = {"victim": victim}
    sigterm_at(proc, 5, log)
    cluster.add_node(num_cpus=1, resources={"trainer": 1})  # where the moved rank goes
    trainer.join()
    result = box["result"]
    try:
        log["ray_start_exit"] = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    history = [(m["step"], m["rank"]) for m in result.metrics_history]
    print(json.dumps({
        "ok": result.ok, "error": str(result.error), "faults": result.faults, "log": log,
        "history": history, "loads": (result.checkpoint or {}).get("loads"),
        "nodes": [v["node_id"] if v else None for v in result.return_values],
        "bit_equal": bool(result.ok) and all(
            workload.torch.equal(result.return_values[r]["state"][k], clean[r][k])
            for r in range(2) for k in clean[r])}, default=str))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    os.environ.pop("RAY_ADDRESS", None)
    tempfile.tempdir = tempfile.mkdtemp(prefix="rr-pre-", dir="/tmp")
    main(sys.argv[1], sys.argv[2], sys.argv[3])
