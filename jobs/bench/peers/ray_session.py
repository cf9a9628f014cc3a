"""A private, short-lived Ray instance for one benchmark run.

The machine is shared, so the benchmark never attaches to (or stops) a Ray someone else started:
it starts its own head with its own temp folder, no dashboard and a fixed CPU count, and shuts it
down afterwards. Worker processes inherit the driver's environment, which is how they import
`peers` (jobs/ is put on PYTHONPATH before the head starts).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

import ray

from .launcher import JOBS_DIR

#: CPUs the private Ray advertises: 2 training workers, Ray Train's controller, one spare.
RAY_NUM_CPUS = 4


@contextlib.contextmanager
def private_ray() -> Iterator[None]:
    """`ray.init` on a fresh local head in a private temp folder; shut down on exit."""
    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; the benchmark needs "
                           "its own private instance (run it as its own process).")
    paths = [JOBS_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # Short path: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    temp_dir = tempfile.mkdtemp(prefix="rrb_ray_", dir="/tmp")
    ray.init(_temp_dir=temp_dir, include_dashboard=False, num_cpus=RAY_NUM_CPUS,
             log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
