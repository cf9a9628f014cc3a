"""One repair, as the supervisor has it carried out: tear down, then respawn what must be.

Every rank that keeps its process is interrupted (collectives aborted, an exception raised
into its training thread) and must unwind within `InProcessConfig.interrupt_timeout_s`; ranks
that do not, and ranks whose process is gone, are killed and replaced when `InJobConfig` allows.
The repair touches only the worker group; it returns a `RepairOutcome` and the supervisor
records it, shrinks the world, advances the attempt and launches it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ray_resilience._internal.attempt import AttemptOutcome, RankLost
from ray_resilience._internal.supervisor.run_record import Clock, RunRecord
from ray_resilience.config import ResilienceConfig, ScalingConfig
from ray_resilience.errors import (
    HangError,
    InsufficientResourcesError,
    WorkerDiedError,
    format_ranks,
)
from ray_resilience.policy.base import Decision

if TYPE_CHECKING:
    from ray_resilience._internal.worker_group.group import WorkerGroup

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 10.0
"""How long a kept rank may take to answer its health check."""
STACKS_BEFORE_KILL_S = 1.0
"""An interrupted rank still unwinding this long before its timeout dumps its threads' stacks
(at half the timeout where that is shorter)."""


@dataclasses.dataclass(frozen=True)
class RepairOutcome:
    """What a repair did. `error` set: the run cannot go on (the rest says how far it got)."""

    respawned: tuple[int, ...] = ()
    """Ranks that got a new process (or were to get one when `error` is set)."""
    dropped: tuple[int, ...] = ()
    """Ranks no capacity was found for in time: the world shrinks without them."""
    excluded_nodes: tuple[str, ...] = ()
    """Nodes excluded from now on."""
    replacements: tuple[dict[str, Any], ...] = ()
    """How each respawned rank's new process started."""
    outcomes: tuple[AttemptOutcome, ...] = ()
    """The interrupted ranks' last outcomes (their final reports), to record."""
    t_torn: float | None = None
    """When every rank had unwound or was killed; None when the teardown itself failed."""
    error: BaseException | None = None


class Repair:
    """Carries out one restart or respawn `decision` on the ranks of `attempt`."""

    def __init__(self, group: WorkerGroup, record: RunRecord, cfg: ResilienceConfig,
                 scaling: ScalingConfig, clock: Clock, *, decision: Decision,
                 attempt: int, on_node: Callable[[str], bool] | None = None) -> None:
        self.group, self.record, self.cfg, self.scaling = group, record, cfg, scaling
        self.on_node = on_node
        """Called with each node a respawned rank moves to, while it starts there; True when
        it prepared that node (started its checkpoint writers)."""
        self.clock, self.decision, self.attempt = clock, decision, attempt
        self.respawn: set[int] = set(decision.respawn)
        self.outcomes: list[AttemptOutcome] = []

    def run(self, futures: Mapping[Any, int], excluded_nodes: frozenset[str]) -> RepairOutcome:
        """Interrupts or kills every rank of the attempt, then replaces the ranks that need it."""
        error = self._teardown(futures)
        if error is not None:
            return self._outcome(error=error)
        t_torn = self.clock.time()
        if not self.respawn:
            return self._outcome(t_torn=t_torn)
        in_job = self.cfg.in_job
        if in_job is None:  # a kept rank's actor died while it unwound
            return self._outcome(t_torn=t_torn, error=WorkerDiedError(
                sorted(self.respawn), self.attempt, "died while unwinding; set InJobConfig to "
                                                    "replace dead ranks"))
        for node in self.decision.exclude_nodes:
            log.warning("excluding node %s: more than InJobConfig.max_node_faults=%s faults lost "
                        "or hung a rank there; its ranks move to other nodes",
                        node, in_job.max_node_faults)
        prepared: set[str] = set()

        def on_node(node: str) -> None:
            if self.on_node is not None and self.on_node(node):
                prepared.add(node)

        missing = self.group.replace(sorted(self.respawn), in_job.replacement_timeout_s,
                                     exclude=set(excluded_nodes) | set(self.decision.exclude_nodes),
                                     on_node=on_node if self.on_node is not None else None)
        done = dict(t_torn=t_torn, excluded_nodes=self.decision.exclude_nodes,
                    replacements=tuple(_replacement(rank, info, prepared) for rank, info
                                       in enumerate(self.group.info) if rank in self.respawn))
        log.info("replacement processes: %s", done["replacements"])
        if not missing:
            return self._outcome(**done)
        remaining = self.group.world_size - len(missing)
        if in_job.min_workers is None or remaining < in_job.min_workers:
            return self._outcome(**done, error=InsufficientResourcesError(
                "InJobConfig.replacement_timeout_s", in_job.replacement_timeout_s,
                self.scaling.bundle, self.group.available_resources(),
                f"no capacity for replacement ranks {missing}; set InJobConfig.min_workers "
                f"(now {in_job.min_workers}) to continue with fewer ranks, or add nodes."))
        log.warning("continuing with %d ranks: no capacity for ranks %s", remaining, missing)
        return self._outcome(**done, dropped=tuple(missing))

    def _outcome(self, **fields: Any) -> RepairOutcome:
        return RepairOutcome(respawned=tuple(sorted(self.respawn)),
                             outcomes=tuple(self.outcomes), **fields)

    def _teardown(self, futures: Mapping[Any, int]) -> BaseException | None:
        group, cfg = self.group, self.cfg
        for rank in self.respawn:
            group.kill(rank)  # a stuck or dead rank is killed before it is replaced
        keep = {ref: rank for ref, rank in futures.items() if rank not in self.respawn}
        timeout = cfg.in_process.interrupt_timeout_s if cfg.in_process else 10.0
        group.interrupt(list(keep.values()), self.attempt,
                        stacks_after_s=max(timeout - STACKS_BEFORE_KILL_S, timeout / 2))
        stuck = self._wait_unwound(keep, timeout)
        unhealthy = self._health_checks(stuck)
        if unhealthy and cfg.in_job is None:
            return WorkerDiedError(sorted(unhealthy), self.attempt, f"failed health checks: "
                                   f"{unhealthy}; set InJobConfig to replace them")
        self.respawn.update(unhealthy)
        if stuck:
            if cfg.in_job is None:
                return HangError(stuck, self.attempt, timeout,
                                 "InProcessConfig.interrupt_timeout_s", timeout)
            log.warning("ranks %s did not unwind within %.1f s: respawning them (the stacks "
                        "of their threads before the kill are in their worker logs' stderr)",
                        format_ranks(stuck), timeout)
            for rank in stuck:
                group.kill(rank)
            self.respawn.update(stuck)
        return None

    def _health_checks(self, stuck: list[int]) -> dict[int, str]:
        """Ranks that keep their process are asked for their health (CUDA on GPU)."""
        skip = self.respawn | set(stuck)
        ranks = [r for r in range(self.group.world_size) if r not in skip]
        unhealthy = self.group.health(ranks, HEALTH_TIMEOUT_S) if ranks else {}
        for rank, reason in unhealthy.items():
            log.warning("rank %d is unhealthy (%s): it gets a new process", rank, reason)
            self.group.kill(rank)
        return unhealthy

    def _wait_unwound(self, keep: dict[Any, int], timeout_s: float) -> list[int]:
        """Collects interrupted ranks' outcomes; returns the ranks still stuck at the deadline.

        A rank whose side thread has gone silent for `InJobConfig.heartbeat_timeout_s` (its node
        is gone, its process frozen) is respawned at once instead of waiting out the timeout.
        """
        deadline, in_job = self.clock.monotonic() + timeout_s, self.cfg.in_job
        while keep and self.clock.monotonic() < deadline:
            for ref in self.group.wait(list(keep), 0.05, num_returns=len(keep)):
                rank = keep.pop(ref)
                result = self.group.outcome(ref, rank)
                if isinstance(result, RankLost):
                    self.respawn.add(rank)
                else:
                    self.outcomes.append(result)
            if in_job is None:
                continue
            now, lost = self.clock.monotonic(), []
            for ref, rank in list(keep.items()):
                if self.record.heartbeat_age(rank, now) > in_job.heartbeat_timeout_s:
                    self.group.kill(rank)
                    self.respawn.add(keep.pop(ref))
                    lost.append(rank)
            if lost:
                log.warning("ranks %s are silent for over %.1f s: treating them as lost",
                            format_ranks(lost), in_job.heartbeat_timeout_s)
        return sorted(keep.values())


def _replacement(rank: int, info: dict[str, Any], prepared: set[str]) -> dict[str, Any]:
    """How a respawned rank's process started: `preimported` when it was booted ahead of time
    and had imported torch and the rest before the rank took it (or while the rank waited
    `preimport_wait_s` for it); `node_prepared` when it moved to a node whose checkpoint writers
    were started while it started (`WorkerGroup.replace`'s `on_node`)."""
    pre = info.get("preimport") or {}
    return {"rank": rank, "pid": info.get("pid"),
            "preimported": "ended" in pre and "error" not in pre,
            "preimport_wait_s": pre.get("waited_s", 0.0),
            "node_prepared": info.get("node_id") in prepared}
