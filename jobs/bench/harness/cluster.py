"""A simulated multi-node Ray cluster on this machine, and the node-loss fault.

Each node is a separate raylet (`ray.cluster_utils.Cluster`): a head for the control plane and
`nodes` worker nodes with one CPU and one "trainer" resource each, which is where the ranks go
(one per node). A node-loss fault is fired by the harness, not by a rank: once rank 0 logged
the step before the fault's, `NodeKiller` writes the fault to the ledger and kills every
process of the node hosting the target rank without grace (as `Cluster.remove_node` does), then
adds a replacement node after REPLACEMENT_DELAY_S, as a cluster's autoscaler would.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psutil
import ray
from ray.cluster_utils import Cluster

from ray_resilience.testing import FaultKind

from .events import EVENTS_DIR, FaultLedger
from .launcher import with_bench_paths
from .spec import Workload

T = TypeVar("T")
REPLACEMENT_DELAY_S = 1.0
TRAINER = "trainer"
OBJECT_STORE_SHARE = 0.3
"""Ray's default object store is 30% of a node's memory; `ray.cluster_utils` gives each node
150 MiB instead, so a simulated node's writers, whose memory-tier budget defaults to the node's
object store, kept no shard over ~0.16 GB in memory and every node-loss restore above the tiny
size read storage. Each worker node gets Ray's share of this machine's memory, divided among
the worker nodes (they share it)."""
DESCRIPTION = ("ray.cluster_utils.Cluster: head + one raylet per rank with a 'trainer' "
               f"resource and {OBJECT_STORE_SHARE:.0%} of the machine's memory / nodes as its "
               f"object store; lost node replaced after {REPLACEMENT_DELAY_S:g} s")


def node_object_store_bytes(nodes: int) -> int:
    """The object store of each of `nodes` simulated worker nodes (see OBJECT_STORE_SHARE)."""
    return int(psutil.virtual_memory().total * OBJECT_STORE_SHARE / max(1, nodes))


def _add_node(cluster: Any, nodes: int) -> Any:
    return cluster.add_node(num_cpus=1, resources={TRAINER: 1},
                            object_store_memory=node_object_store_bytes(nodes))


@contextlib.contextmanager
def simulated_cluster(nodes: int, head_cpus: int, *, keep_logs: str | None = None
                      ) -> Iterator[Any]:
    """`ray.init` on a fresh cluster of a head and `nodes` worker nodes; torn down on exit.
    `keep_logs`: a folder that receives the Ray workers' stderr logs (our actors' log lines,
    e.g. the supervisor's) before the cluster's temp folder goes."""
    os.environ["PYTHONPATH"] = with_bench_paths(os.environ.get("PYTHONPATH", ""))
    temp_dir = tempfile.mkdtemp(prefix="rrb_cl_", dir="/tmp")  # short: AF_UNIX path limit
    # Ray's Cluster records the head's address in <RAY_TMPDIR or /tmp>/ray/ray_current_cluster,
    # which other drivers on the machine read (and which fails where /tmp/ray does not exist):
    # kept in this cluster's own folder.
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir
    os.makedirs(os.path.join(temp_dir, "ray"), exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "include_dashboard": False, "temp_dir": temp_dir,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    for _ in range(nodes):
        _add_node(cluster, nodes)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        if keep_logs is not None:
            keep_worker_logs(temp_dir, keep_logs)
        shutil.rmtree(temp_dir, ignore_errors=True)


def keep_worker_logs(temp_dir: str, dest: str) -> list[str]:
    """Copies the non-empty `worker-*.err` logs of every Ray session under `temp_dir` into
    `dest` (prefixed with the session's folder name); the names copied."""
    copied = []
    for path in sorted(glob.glob(os.path.join(temp_dir, "session_*", "logs", "worker-*.err"))):
        if os.path.getsize(path) == 0:
            continue
        session = os.path.basename(os.path.dirname(os.path.dirname(path)))
        os.makedirs(dest, exist_ok=True)
        name = f"{session}-{os.path.basename(path)}"
        shutil.copyfile(path, os.path.join(dest, name))
        copied.append(name)
    return copied


class NodeKiller:
    """Fires the plan's node-loss faults from the main thread (see the module docstring)."""

    def __init__(self, cluster: Any, workload: Workload) -> None:
        self.cluster, self.workload = cluster, workload
        self._due = [f for f in workload.fault_plan if f.kind is FaultKind.NODE_LOSS]

    def run_beside(self, fit: Callable[[], T]) -> T:
        """Runs `fit` on a thread and fires the faults here until it returns; its result."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fit()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                box["error"] = exc

        thread = threading.Thread(target=target, name="fit", daemon=True)
        thread.start()
        ledger = FaultLedger(self.workload.run_dir)
        while thread.is_alive():
            thread.join(0.05)
            if self._due and thread.is_alive():
                self._maybe_fire(ledger)
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _maybe_fire(self, ledger: FaultLedger) -> None:
        fault = self._due[0]
        pids = _step_reached(self.workload.run_dir, fault.step - 1, fault.rank)
        node = self._node_of(pids) if pids else None
        if node is None:
            return
        self._due.pop(0)
        ledger.record(fault)
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        self.cluster.worker_nodes.remove(node)
        time.sleep(REPLACEMENT_DELAY_S)
        _add_node(self.cluster, self.workload.nodes)

    def _node_of(self, pids: set[int]) -> Any:
        for node in list(self.cluster.worker_nodes):
            raylets = {p.process.pid for p in node.all_processes.get("raylet", [])}
            for pid in pids:
                try:
                    if raylets & {p.pid for p in psutil.Process(pid).parents()}:
                        return node
                except psutil.Error:
                    continue
        return None


def _step_reached(run_dir: str, step: int, rank: int) -> set[int] | None:
    """Pids of `rank`'s live processes once rank 0 logged `step` (None before)."""
    folder = os.path.join(run_dir, EVENTS_DIR)
    if not os.path.isdir(folder):
        return None
    reached, pids = False, set()
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event["ev"] == "step" and event.get("rank") == 0 and event["step"] >= step:
                    reached = True
                if event["ev"] == "start" and event.get("rank") == rank and \
                        psutil.pid_exists(event["pid"]):
                    pids.add(event["pid"])
    return pids if reached and pids else None
