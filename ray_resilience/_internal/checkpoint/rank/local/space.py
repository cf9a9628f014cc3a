"""Room and integrity for the local tier: whether two files per rank fit in the tmpfs and in the
memory limit its pages are charged to, and the data checksum (`format/checksum.py`).
"""

from __future__ import annotations

import os

from ray_resilience._internal.checkpoint.format.checksum import (  # noqa: F401 - re-exported
    CHECKSUM,
    checksum,
    known_checksum,
)

CGROUP_MEMORY = "/sys/fs/cgroup"
"""Where cgroup v2 exposes this container's memory limit and usage."""


def capacity_problem(root: str, per_file: int, ranks_on_node: int) -> str | None:
    """Why two files of `per_file` bytes for each of `ranks_on_node` ranks would not fit under
    `root`; None when they fit. Files the run already holds there count as room."""
    need = 2 * per_file * ranks_on_node
    try:
        os.makedirs(root, exist_ok=True)
        stat = os.statvfs(root)
    except OSError as exc:
        return f"{root} is not usable ({exc})"
    ours = allocated_bytes(root)
    free = stat.f_bavail * stat.f_frsize
    shape = (f"two {_gb(per_file)} files for each of {ranks_on_node} rank(s) on this node = "
             f"{_gb(need)}")
    if free + ours < need:
        return (f"{shape} do not fit in {os.path.dirname(root)}: {_gb(free)} free (+"
                f"{_gb(ours)} already this run's); give that tmpfs more room (on Kubernetes: the "
                "sizeLimit of the Memory emptyDir mounted there), point CheckpointConfig.local_dir "
                "at a larger one, or set local_interval_steps=0")
    headroom = memory_headroom()
    if headroom is not None and headroom + ours < need:
        return (f"{shape} would exceed this container's memory limit (tmpfs pages count "
                f"against it): {_gb(headroom)} left; raise the pod's memory limit by "
                f"{_gb(need - headroom - ours)} or set local_interval_steps=0")
    return None


def allocated_bytes(root: str) -> int:
    """Bytes the files directly under `root` hold."""
    total = 0
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
    except OSError:
        pass
    return total


def memory_headroom(base: str = CGROUP_MEMORY) -> int | None:
    """Bytes this container may still use under its cgroup v2 memory limit (None: no limit)."""
    try:
        with open(os.path.join(base, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(base, "memory.current")) as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
