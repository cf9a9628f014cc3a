"""A private, short-lived Ray instance for one benchmark run.

The machine is shared, so the benchmark never attaches to (or stops) a Ray someone else started:
it starts its own head with its own temp folder, no dashboard and the CPUs the run's actors ask
for (ranks, spares, and one for Ray Train's controller), and shuts it down afterwards. Worker
processes inherit the driver's environment, which is how they import `harness` and `peers`
(jobs/bench is put on PYTHONPATH before the head starts).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import TypeVar

import ray

from .cluster import TRAINER, NodeKiller, simulated_cluster
from .launcher import with_bench_paths
from .spec import Workload

RAY_LOGS_DIR = "ray_logs"
"""A simulated-cluster run's Ray worker logs, kept in its run folder (`keep_worker_logs`): the
supervisor's and writers' log lines, which say how a node loss was detected and repaired."""

T = TypeVar("T")


@contextlib.contextmanager
def private_ray(num_cpus: int) -> Iterator[None]:
    """`ray.init` on a fresh local head in a private temp folder advertising `num_cpus`; shut
    down on exit."""
    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; the benchmark needs "
                           "its own private instance (run it as its own process).")
    os.environ["PYTHONPATH"] = with_bench_paths(os.environ.get("PYTHONPATH", ""))
    # Short path: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    temp_dir = tempfile.mkdtemp(prefix="rrb_ray_", dir="/tmp")
    ray.init(_temp_dir=temp_dir, include_dashboard=False, num_cpus=num_cpus,
             log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@contextlib.contextmanager
def ray_for(workload: Workload, num_cpus: int) -> Iterator[Callable[[Callable[[], T]], T]]:
    """The Ray a Ray-based mechanism runs `workload` on, and a `call(fit)` to run its `fit`
    with: on a private single node, `fit()` as is; on a simulated cluster (`workload.nodes`),
    `fit` in a thread while this (main) thread fires the node-loss faults (`NodeKiller`: a
    node's processes can only be killed from the main thread)."""
    if not workload.nodes:
        with private_ray(num_cpus):
            yield lambda fit: fit()
        return
    with simulated_cluster(workload.nodes, head_cpus=max(1, num_cpus - workload.world_size),
                           keep_logs=os.path.join(workload.run_dir, RAY_LOGS_DIR)) as cluster:
        yield lambda fit: NodeKiller(cluster, workload).run_beside(fit)


def rank_resources(workload: Workload) -> dict[str, float]:
    """Extra resources a rank asks for: one node's "trainer" slot in a simulated cluster."""
    return {TRAINER: 1.0} if workload.nodes else {}
