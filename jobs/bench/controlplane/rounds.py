"""Save rounds at scale: the real `CommitCoordinator` actor, every virtual rank voting ready,
one call per rank (as ranks vote today) or one per simulated node (`vote_many`)."""

from __future__ import annotations

import tempfile
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.coordinator import CommitCoordinator
from ray_resilience.checkpoint import CheckpointConfig

from .measure import Watch

VOTE_WAIT_S = 30.0
"""Long enough that no round needs a poll: the time measured is the fan-in alone."""


def save_rounds(hosts: list[Any], world: int, rounds: int) -> dict[str, Any]:
    """Round time (first vote sent to the last rank knowing the outcome) and the coordinator's
    CPU, for both ways of voting."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rr-bench-rounds-") as root:
        storage = CheckpointStorage.for_run(root, "bench")
        here = ray.get_runtime_context().get_node_id()
        coordinator = ray.remote(CommitCoordinator).options(
            num_cpus=0, max_concurrency=2 * world + 16,  # as CheckpointService sizes it
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(storage=storage, config=CheckpointConfig(interval_steps=1))
        try:
            ray.get(coordinator.ready.remote(), timeout=120)
            watch = Watch(coordinator)
            for mode, per_node in (("per_rank", False), ("per_node", True)):
                times, claimed = [], 0
                cpu0 = watch.cpu()
                for _ in range(rounds):
                    session = ray.get(coordinator.new_session.remote(world), timeout=60)
                    spans = ray.get([h.vote_round.remote(coordinator, session, 1, per_node,
                                                         VOTE_WAIT_S) for h in hosts],
                                    timeout=VOTE_WAIT_S * 4)
                    times.append(max(s[1] for s in spans) - min(s[0] for s in spans))
                    claimed += sum(s[2] for s in spans)
                out[mode] = {"round_s": times, "claimed_fraction": claimed / (rounds * world),
                             "coordinator_cpu_s_per_round": (watch.cpu() - cpu0) / rounds,
                             "coordinator_rss_mb": watch.rss_mb()}
                time.sleep(0.5)
        finally:
            ray.kill(coordinator)
    return out
