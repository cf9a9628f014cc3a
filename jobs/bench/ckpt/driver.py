"""The checkpoint benchmark's driver: the ranks of one size, one configuration at a time.

Configurations (method, interval) and a no-checkpoint baseline run in an order that rotates
every repetition; each configuration's throughput is compared with the baseline of its own
repetition. Ours' methods get a fresh `CheckpointService` per configuration (its writers made
ready before timing, as every method's one-time set-up is); its coordinator stamps each commit
(`stats()["commit_times"]`), read once the configuration settled, so nothing polls it while
the ranks train.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from typing import Any

import ray

from ray_resilience._internal.checkpoint.service.service import CheckpointService
from ray_resilience.checkpoint import CheckpointConfig

from .rank import WARM_UP_SAVES, BenchRank


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    """Ranks of one size, reused across every configuration."""

    def __init__(self, size_name: str, world_size: int, storage: str, shm: str) -> None:
        # `run` and the writer's calls at once (taking a snapshot, giving memory back).
        actor = ray.remote(BenchRank).options(num_cpus=1, max_concurrency=4)
        port = _port()
        self.size_name, self.world_size = size_name, world_size
        self.storage, self.shm = storage, shm
        self.ranks = [actor.remote(r, world_size, port, size_name) for r in range(world_size)]
        self.node = ray.get_runtime_context().get_node_id()
        self.state_bytes = sum(ray.get([r.state_bytes.remote() for r in self.ranks]))
        self._count = 0

    def run(self, method: str, interval: int, steps: int) -> dict[str, Any]:
        """Every rank's result of one configuration, plus ours' commits (step, time) and
        memory."""
        self._count += 1
        name = f"{self.size_name}-{method}-{interval}-{self._count}"
        service = self._service(method, interval, name) if method.startswith("ours") else None
        try:
            results = ray.get([r.run.remote(method, interval, steps,
                                            os.path.join(self.storage, name),
                                            os.path.join(self.shm, name)) for r in self.ranks])
            extra: dict[str, Any] = {}
            if service is not None:
                extra = self._settle(service)
        finally:
            if service is not None:
                ray.get([r.detach.remote() for r in self.ranks])
                service.shutdown()
                shutil.rmtree(os.path.join(self.storage, name), ignore_errors=True)
            shutil.rmtree(os.path.join(self.shm, name), ignore_errors=True)
        return {"ranks": results, **extra}

    def _service(self, method: str, interval: int, name: str) -> CheckpointService:
        if method == "ours_local":
            config = CheckpointConfig(local_interval_steps=interval, local_max_bytes=None,
                                      local_dir=self.shm)
        else:
            # The save interval a user saving every `interval` steps sets (the rank calls
            # `save` itself at those steps): the writers import DCP before the first save.
            config = CheckpointConfig(in_flight_policy=method.split("_", 1)[1],
                                      interval_steps=interval, local_interval_steps=0)
        service = CheckpointService.start(
            storage_path=self.storage, run_name=name, storage_filesystem=None,
            world_size=self.world_size, node_ids_by_rank=[self.node] * self.world_size,
            config=config)
        service.wait_ready()
        specs = [service.rank_spec(r) for r in range(self.world_size)]
        ray.get([rank.attach.remote(spec) for rank, spec in zip(self.ranks, specs, strict=True)])
        return service

    def _settle(self, service: CheckpointService) -> dict[str, Any]:
        """Waits (at most 60 s) for pending commits, then (at most 10 s) until the shared memory
        ours holds for checkpoints stops changing (a writer gives what a newer commit replaced
        back to its rank; for a moment both have it open); committed count, commit times, that
        memory (every buffer a writer has open, idle ones included, and the ranks' staging
        memory) and how the writers took the snapshots (adopted: no copy)."""
        deadline = time.monotonic() + 60
        stats = service.stats()
        while stats["pending_steps"] and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = service.stats()
        deadline, seen, same = time.monotonic() + 10, None, 0
        while same < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = service.stats()
            held = (sum(w["buffers"]["bytes"] for w in stats["writers"]),
                    sum(ray.get([r.staging_bytes.remote() for r in self.ranks])))
            same, seen = (same + 1 if held == seen else 0), held
        intake = {way: sum(w.get(way, 0) for w in stats["writers"])
                  for way in ("adopted", "pulled", "filled", "copied", "unmapped")}
        return {"committed": stats["counts"].get("committed", 0),
                "commits": [(step, t) for step, t in stats["commit_times"] if step > WARM_UP_SAVES],
                "writer_bytes": seen[0], "rank_staging_bytes": seen[1], "intake": intake}

    def close(self, *, kill: bool = False) -> None:
        """Ends the ranks, asking them to close first unless `kill` (one of them died)."""
        try:
            if not kill:
                ray.get([r.close.remote() for r in self.ranks], timeout=120)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a rank that cannot close is killed below
        for r in self.ranks:
            ray.kill(r)
