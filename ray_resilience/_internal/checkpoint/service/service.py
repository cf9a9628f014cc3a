"""`CheckpointService`: the supervisor's handle on the coordinator and the writers; hands out
a `RankCheckpointSpec` per rank, and brings a restarted coordinator its writers back.
"""

from __future__ import annotations

import secrets
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal.checkpoint.format.local_roots import check_local_dir, run_root
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.coordinator import CommitCoordinator
from ray_resilience._internal.checkpoint.service.lease_keeper import LeaseKeeper
from ray_resilience._internal.checkpoint.service.writer_pool import (
    launch_writer,
    with_suppressed_kill,
)
from ray_resilience._internal.checkpoint.wire import RankCheckpointSpec
from ray_resilience._internal.constants import checkpoint_call_timeout_s
from ray_resilience.checkpoint.config import CheckpointConfig

COORDINATOR_MAX_CONCURRENCY = 64
COORDINATOR_MAX_RESTARTS = 10
"""Restarts of a crashed commit coordinator (its calls are retried on the new instance)."""


class CheckpointService:
    """Supervisor side: `start` once per run, `ensure_writers` after respawns, `shutdown` at the
    end."""

    def __init__(self, *, storage: CheckpointStorage, config: CheckpointConfig, coordinator: Any,
                 writers: list[tuple[Any, str]], local_root: str | None = None,
                 lease: LeaseKeeper | None = None, owns_lease: bool = False,
                 slots: dict | None = None, node_ids: list[str] | None = None) -> None:
        self.storage, self.config, self._coordinator = storage, config, coordinator
        self.local_root = local_root
        self._writers = writers
        self.lease, self._owns_lease = lease, owns_lease
        self._slots, self._node_ids = slots or {}, list(node_ids or [])
        self._launched: dict[tuple[str, int], tuple[str, Any]] = {}
        """Writers started by `prelaunch`, for the next `ensure_writers` to hand over."""

    @classmethod
    def start(cls, *, storage_path: str, run_name: str, storage_filesystem: pafs.FileSystem | None,
              world_size: int, node_ids_by_rank: list[str], config: CheckpointConfig,
              lease: LeaseKeeper | None = None) -> CheckpointService:
        """Checks storage and `local_dir`, takes the run's lease unless `lease` holds it (then the
        caller renews and releases it), starts the coordinator on this (the supervisor's) node,
        and the writers."""
        if len(node_ids_by_rank) != world_size:
            raise ValueError(f"node_ids_by_rank has {len(node_ids_by_rank)} entries for "
                             f"world_size={world_size}; give one node id per rank")
        storage = CheckpointStorage.for_run(storage_path, run_name, storage_filesystem)
        storage.check_writable()
        if config.local_interval_steps:
            check_local_dir(config.local_dir)
        owns = lease is None
        lease = LeaseKeeper.claim(storage, run_name, config) if owns else lease
        try:
            return cls._start_actors(storage, config, run_name, node_ids_by_rank, lease, owns)
        except BaseException:
            if owns:
                lease.close()
            raise

    @classmethod
    def _start_actors(cls, storage: CheckpointStorage, config: CheckpointConfig, run_name: str,
                      node_ids_by_rank: list[str], lease: LeaseKeeper,
                      owns: bool) -> CheckpointService:
        here = ray.get_runtime_context().get_node_id()
        local_root = (run_root(config.local_dir, run_name, secrets.token_hex(6))
                      if config.local_interval_steps else None)
        # Every rank may hold one call waiting on a save round, besides writers and the supervisor.
        concurrency = max(COORDINATOR_MAX_CONCURRENCY, 2 * len(node_ids_by_rank) + 16)
        coordinator = ray.remote(CommitCoordinator).options(
            num_cpus=0, max_concurrency=concurrency, max_restarts=COORDINATOR_MAX_RESTARTS,
            max_task_retries=-1,  # a call cut by a crash reaches the restarted instance
            # On the supervisor's node.
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(storage=storage, config=config, local_root=local_root, fence=lease.fence)
        # Writers start alongside the coordinator (each imports torch), which adopts them; they
        # belong to this process, so they outlive a crash of the coordinator.
        launched = {(node, index): launch_writer(storage=storage, config=config,
                                                 coordinator=coordinator, node_id=node,
                                                 index=index, local_root=local_root)
                    for node in dict.fromkeys(node_ids_by_rank)
                    for index in range(config.writers_per_node)}
        try:
            writers, slots = ray.get(
                coordinator.ensure_writers.remote(list(node_ids_by_rank), launched),
                timeout=checkpoint_call_timeout_s())
        except BaseException:
            ray.kill(coordinator, no_restart=True)
            for _, handle in launched.values():
                with_suppressed_kill(handle)
            raise
        return cls(storage=storage, config=config, coordinator=coordinator, writers=writers,
                   local_root=local_root, lease=lease, owns_lease=owns, slots=slots,
                   node_ids=node_ids_by_rank)

    def rank_spec(self, rank: int) -> RankCheckpointSpec:
        writer, writer_id = self._writers[rank]
        return RankCheckpointSpec(storage=self.storage, config=self.config,
                                  coordinator=self._coordinator, writer=writer, writer_id=writer_id,
                                  rank=rank, world_size=len(self._writers),
                                  local_root=self.local_root)

    def prelaunch(self, node_id: str) -> None:
        """A rank is moving to `node_id`: that node's writers start now, beside the rank's own
        start-up, instead of after it (a writer's boot is seconds on a busy node); the next
        `ensure_writers` hands them to the coordinator, which kills those no rank uses."""
        for index in range(self.config.writers_per_node):
            key = (node_id, index)
            if key not in self._slots and key not in self._launched:
                self._launched[key] = launch_writer(
                    storage=self.storage, config=self.config, coordinator=self._coordinator,
                    node_id=node_id, index=index, local_root=self.local_root)

    def ensure_writers(self, node_ids_by_rank: list[str]) -> list[RankCheckpointSpec]:
        """After a respawn (or a shrink): replaces dead writers, serves new nodes; fresh specs."""
        launched, self._launched = self._launched, {}
        self._writers, self._slots = ray.get(
            self._coordinator.ensure_writers.remote(list(node_ids_by_rank), launched or None),
            timeout=checkpoint_call_timeout_s())
        self._node_ids = list(node_ids_by_rank)
        return [self.rank_spec(rank) for rank in range(len(self._writers))]

    def recover(self) -> None:
        """The coordinator restarted: it adopts the writers that still answer (new ones for the
        others), which report their durable, uncommitted shards again."""
        self._writers, self._slots = ray.get(
            self._coordinator.ensure_writers.remote(self._node_ids, self._slots, True),
            timeout=checkpoint_call_timeout_s())

    def warm(self) -> None:
        """Has every writer start importing DCP (the first write needs it; the run calls this
        after its first step so the import does not slow the ranks' start-up, or with the ranks
        on nodes with idle cores); returns at once.
        A dead writer's call fails unseen: its replacement is warmed by the next call."""
        for handle in self._writer_handles():
            handle.warm.remote()

    def _writer_handles(self) -> list[Any]:
        """One handle per writer (ranks sharing a writer list it once each)."""
        return list({wid: w for w, wid in self._writers}.values())

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Waits until the coordinator and writers finished importing DCP, starting it where
        `warm` did not (benchmarks call it so start-up CPU is not counted against saves; saves
        made earlier are queued, not lost)."""
        handles = [self._coordinator, *self._writer_handles()]
        ray.get([h.ready.remote() for h in handles],
                timeout=checkpoint_call_timeout_s() if timeout_s is None else timeout_s)

    def latest_committed_step(self) -> int | None:
        return ray.get(self._coordinator.latest_committed_step.remote(),
                       timeout=checkpoint_call_timeout_s())

    def poll(self, cursor: int) -> dict[str, Any]:
        """`CommitCoordinator.poll`: newest commit, dropped saves from `cursor`, lease, restarts."""
        return ray.get(self._coordinator.poll.remote(cursor), timeout=checkpoint_call_timeout_s())

    def release_polls(self) -> None:
        """`CommitCoordinator.release_polls`: every long poll answers now."""
        ray.get(self._coordinator.release_polls.remote(), timeout=checkpoint_call_timeout_s())

    def long_poll(self, cursor: int, seen: tuple[str | None, int | None],
                  wait_s: float) -> ray.ObjectRef:
        """`CommitCoordinator.poll` answering on news against `seen` or after `wait_s`: the
        reference to wait on."""
        return self._coordinator.poll.remote(cursor, seen=seen, wait_s=wait_s)

    def stats(self) -> dict[str, Any]:
        """Committed and pending steps, commit latencies, and per writer its memory and counters."""
        stats = ray.get(self._coordinator.stats.remote(), timeout=checkpoint_call_timeout_s())
        stats["memory_bytes"] = sum(w.get("memory_tier_bytes", 0) + w.get("replica_bytes", 0)
                                    + w.get("in_flight_bytes", 0) for w in stats["writers"])
        stats["run_checkpoints_dir"] = self.storage.display()
        return stats

    def drain(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` until every step all ranks made durable is committed."""
        return ray.get(self._coordinator.drain.remote(timeout_s), timeout=timeout_s + 60)

    def shutdown(self) -> None:
        """Stops the writers and the coordinator (in-flight writes are abandoned); releases the
        lease this service took."""
        for _, handle in self._launched.values():  # started for a node no rank reached
            with_suppressed_kill(handle)
        self._launched = {}
        try:
            ray.get(self._coordinator.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        try:
            ray.kill(self._coordinator, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self._owns_lease:
            self.lease.close()
