"""Releasing everything torch.distributed holds from one attempt, so the next starts clean:
groups destroyed, module globals released (``torch_globals.py``), a full collection.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import time

import torch.distributed as dist

from ray_resilience._internal.process_groups.heap import trim_heap
from ray_resilience._internal.process_groups.torch_globals import release_attempt_globals

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True, kw_only=True)
class TeardownReport:
    """What ``teardown_process_groups`` released, and what survived it."""

    groups_destroyed: int
    """Process groups known to torch.distributed before teardown (default group included)."""
    globals_released: tuple[str, ...]
    """torch.distributed caches emptied and default group arguments reset (qualified names)."""
    device_meshes_alive: int
    """DeviceMesh objects alive after gc (0 when not counted); non-zero: a leak."""
    surviving_mesh_holders: tuple[str, ...]
    heap_released_bytes: int
    """Resident bytes the allocator gave back to the OS after collection (see ``heap.py``)."""
    duration_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceCounts:
    """What the soak compares across attempts."""

    fds: int
    threads: int
    """OS threads (``/proc/self/task``): gloo's and torch's native threads included."""
    device_meshes: int


def resource_counts() -> ResourceCounts:
    """Descriptors, OS threads and live device meshes of this process now (runs ``gc``)."""
    gc.collect()
    return ResourceCounts(fds=len(os.listdir("/proc/self/fd")),
                          threads=len(os.listdir("/proc/self/task")),
                          device_meshes=len(_live_device_meshes()))


def freeze_startup_objects(*, collect: bool = True) -> int:
    """Moves every object the collector tracks now out of its sight; returns how many. Call
    once, after imports and before the first attempt (later, the model would never be collected)."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def teardown_process_groups(*, count_meshes: bool = True) -> TeardownReport:
    """Destroys every process group, releases torch's module-level references, runs gc. Call
    after the abort, once the training thread ended and the model and exceptions are dropped."""
    start = time.monotonic()
    groups = _destroy_all_groups()
    released = release_attempt_globals()
    gc.collect()
    meshes = _live_device_meshes() if count_meshes else []
    holders = _holder_types(meshes)
    meshes_alive = len(meshes)
    meshes.clear()
    report = TeardownReport(groups_destroyed=groups, globals_released=tuple(released),
                            device_meshes_alive=meshes_alive, surviving_mesh_holders=holders,
                            heap_released_bytes=trim_heap(), duration_s=time.monotonic() - start)
    if report.device_meshes_alive:
        logger.warning("%d device meshes survived teardown, held by %s: the old model, "
                       "optimizer or an exception traceback is still referenced",
                       report.device_meshes_alive, ", ".join(report.surviving_mesh_holders))
    return report


def _destroy_all_groups() -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    count = len(dist.distributed_c10d._world.pg_map)
    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - an aborted group may refuse; its sockets are shut
        logger.warning("destroy_process_group failed after abort: %r", exc)
    return count


def _live_device_meshes() -> list[object]:
    mesh_cls = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
    if mesh_cls is None or not isinstance(mesh_cls, type):
        return []
    return [obj for obj in gc.get_objects() if isinstance(obj, mesh_cls)]


def _holder_types(meshes: list[object]) -> tuple[str, ...]:
    """Type names of what refers to surviving meshes (diagnostics for the warning)."""
    names = {type(ref).__qualname__ for mesh in meshes for ref in gc.get_referrers(mesh)
             if ref is not meshes}
    return tuple(sorted(names))
