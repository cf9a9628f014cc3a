"""`CheckpointService`: the supervisor's handle on the coordinator and the writers; hands out
a `RankCheckpointSpec` per rank.
"""

from __future__ import annotations

import secrets
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal.checkpoint.format.local_roots import run_root
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.coordinator import CommitCoordinator
from ray_resilience._internal.checkpoint.service.writer_pool import (
    launch_writer,
    with_suppressed_kill,
)
from ray_resilience._internal.checkpoint.wire import RankCheckpointSpec
from ray_resilience._internal.constants import checkpoint_call_timeout_s
from ray_resilience.checkpoint.config import CheckpointConfig

COORDINATOR_MAX_CONCURRENCY = 64


class CheckpointService:
    """Supervisor side: `start` once per run, `ensure_writers` after respawns, `shutdown` at the
    end."""

    def __init__(self, *, storage: CheckpointStorage, config: CheckpointConfig, coordinator: Any,
                 writers: list[tuple[Any, str]], local_root: str | None = None) -> None:
        self.storage, self.config, self._coordinator = storage, config, coordinator
        self.local_root = local_root
        self._writers = writers

    @classmethod
    def start(cls, *, storage_path: str, run_name: str, storage_filesystem: pafs.FileSystem | None,
              world_size: int, node_ids_by_rank: list[str], config: CheckpointConfig,
              ) -> CheckpointService:
        """Checks storage, starts the coordinator on this (the supervisor's) node, and the
        writers."""
        if len(node_ids_by_rank) != world_size:
            raise ValueError(f"node_ids_by_rank has {len(node_ids_by_rank)} entries for "
                             f"world_size={world_size}; give one node id per rank")
        storage = CheckpointStorage.for_run(storage_path, run_name, storage_filesystem)
        storage.check_writable()
        here = ray.get_runtime_context().get_node_id()
        local_root = (run_root(config.local_dir, run_name, secrets.token_hex(6))
                      if config.local_interval_steps else None)
        # Every rank may hold one call waiting on a save round, besides writers and the supervisor.
        concurrency = max(COORDINATOR_MAX_CONCURRENCY, 2 * world_size + 16)
        coordinator = ray.remote(CommitCoordinator).options(
            num_cpus=0, max_concurrency=concurrency, max_restarts=0,
            # On the supervisor's node.
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(storage=storage, config=config, local_root=local_root)
        # Writers start alongside the coordinator (each imports torch), which adopts them.
        launched = {(node, index): launch_writer(storage=storage, config=config,
                                                 coordinator=coordinator, node_id=node,
                                                 index=index, local_root=local_root)
                    for node in dict.fromkeys(node_ids_by_rank)
                    for index in range(config.writers_per_node)}
        try:
            writers = ray.get(coordinator.ensure_writers.remote(list(node_ids_by_rank), launched),
                              timeout=checkpoint_call_timeout_s())
        except BaseException:
            ray.kill(coordinator)
            for _, handle in launched.values():
                with_suppressed_kill(handle)
            raise
        return cls(storage=storage, config=config, coordinator=coordinator, writers=writers,
                   local_root=local_root)

    def rank_spec(self, rank: int) -> RankCheckpointSpec:
        writer, writer_id = self._writers[rank]
        return RankCheckpointSpec(storage=self.storage, config=self.config,
                                  coordinator=self._coordinator, writer=writer, writer_id=writer_id,
                                  rank=rank, world_size=len(self._writers),
                                  local_root=self.local_root)

    def ensure_writers(self, node_ids_by_rank: list[str]) -> list[RankCheckpointSpec]:
        """After a respawn (or a shrink): replaces dead writers, serves new nodes; fresh specs."""
        self._writers = ray.get(self._coordinator.ensure_writers.remote(list(node_ids_by_rank)),
                                timeout=checkpoint_call_timeout_s())
        return [self.rank_spec(rank) for rank in range(len(self._writers))]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Waits until the coordinator and writers finished importing DCP (benchmarks call it so
        start-up CPU is not counted against saves; saves made earlier are queued, not lost)."""
        handles = [self._coordinator, *{wid: w for w, wid in self._writers}.values()]
        ray.get([h.ready.remote() for h in handles],
                timeout=checkpoint_call_timeout_s() if timeout_s is None else timeout_s)

    def latest_committed_step(self) -> int | None:
        return ray.get(self._coordinator.latest_committed_step.remote(),
                       timeout=checkpoint_call_timeout_s())

    def stats(self) -> dict[str, Any]:
        """Committed and pending steps, commit latencies, and per writer its memory and counters."""
        stats = ray.get(self._coordinator.stats.remote(), timeout=checkpoint_call_timeout_s())
        stats["memory_bytes"] = sum(w.get("memory_tier_bytes", 0) + w.get("replica_bytes", 0)
                                    + w.get("in_flight_bytes", 0) for w in stats["writers"])
        stats["run_checkpoints_dir"] = self.storage.display()
        return stats

    def shutdown(self) -> None:
        """Stops the writers and the coordinator (in-flight writes are abandoned)."""
        try:
            ray.get(self._coordinator.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        try:
            ray.kill(self._coordinator)
        except Exception:  # noqa: BLE001 - already gone
            pass
