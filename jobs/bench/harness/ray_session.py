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
from collections.abc import Iterator

from .launcher import with_bench_paths
from .spec import Workload


@contextlib.contextmanager
def private_ray(num_cpus: int) -> Iterator[None]:
    """`ray.init` on a fresh local head in a private temp folder advertising `num_cpus`; shut
    down on exit."""
    import ray

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
def ray_for(workload: Workload, num_cpus: int) -> Iterator[None]:
    """The Ray a Ray-based mechanism runs `workload` on: a private single node, or a simulated
    cluster (`workload.nodes`) with its node-loss faults fired by a `NodeKiller`."""
    if not workload.nodes:
        with private_ray(num_cpus):
            yield
        return
    from .cluster import NodeKiller, simulated_cluster

    with simulated_cluster(workload.nodes, head_cpus=max(1, num_cpus - workload.world_size)) \
            as cluster, NodeKiller(cluster, workload):
        yield


def rank_resources(workload: Workload) -> dict[str, float]:
    """Extra resources a rank asks for: one node's "trainer" slot in a simulated cluster."""
    from .cluster import TRAINER

    return {TRAINER: 1.0} if workload.nodes else {}
