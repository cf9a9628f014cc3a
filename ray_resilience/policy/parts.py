"""Small composable parts a recovery policy consults: each takes a frozen `RecoveryState`.

Health checks return ranks that must not keep their process; retry limits return reasons to stop
(each naming its setting). `Compose` unions the answers of several parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ray_resilience.policy.state import RecoveryState


class Compose:
    """Applies parts in order and unions what they return (ranks, or reasons to stop)."""

    def __init__(self, *parts: Callable[[RecoveryState], Any]) -> None:
        self.parts = parts

    def __call__(self, state: RecoveryState) -> list:
        out: list = []
        for part in self.parts:
            for item in part(state) or ():
                if item not in out:
                    out.append(item)
        return out


# --- health checks: return ranks that must not keep their process ----------------------------

@dataclasses.dataclass(frozen=True)
class FaultCounter:
    """A rank whose process faulted more than `max_faults_per_rank` times gets a fresh process.

    Faults count per process: a rank that got a new process (respawned after dying, or by this
    counter) starts again from zero, since what the counter catches is a process whose state went
    bad (a corrupted CUDA context, leaked memory), not the rank number. A node that keeps failing
    is `InJobConfig.max_node_faults`' business.
    """

    max_faults_per_rank: int = 3

    def __call__(self, state: RecoveryState) -> list[int]:
        counts: dict[int, int] = {}
        for fault in state.faults:
            for rank in fault.ranks:
                counts[rank] = counts.get(rank, 0) + 1
            for rank in fault.respawned:
                counts[rank] = 0
        return sorted(r for r, n in counts.items() if n > self.max_faults_per_rank)


@dataclasses.dataclass(frozen=True)
class NodeExclusion:
    """Nodes on which more than `max_node_faults` faults lost a rank's process or hung it
    (`FaultCause.node_fault`: exceptions are the code's, not the node's).
    Returns node ids to exclude; the ranks there move to other nodes."""

    max_node_faults: int

    def __call__(self, state: RecoveryState) -> list[str]:
        counts: dict[str, int] = {}
        for fault in state.faults:
            if fault.cause.node_fault:
                for node in set(fault.nodes):
                    counts[node] = counts.get(node, 0) + 1
        return sorted(n for n, c in counts.items()
                      if c > self.max_node_faults and n not in state.excluded_nodes)


# --- retry limits: return reasons to stop (each names the setting) ---------------------------

@dataclasses.dataclass(frozen=True)
class MaxAttempts:
    """Stop after `max_restarts` restarts of this kind."""

    max_restarts: int
    setting: str = "InProcessConfig.max_restarts"

    def __call__(self, state: RecoveryState) -> list[tuple[str, int]]:
        return [(self.setting, self.max_restarts)] if len(state.faults) > self.max_restarts else []


@dataclasses.dataclass(frozen=True)
class NoProgressLimit:
    """Stop when the last `num_attempts` attempts completed no new step (a restart storm)."""

    num_attempts: int
    setting: str = "InProcessConfig.max_attempts_without_progress"

    def __call__(self, state: RecoveryState) -> list[tuple[str, int]]:
        history = state.progress_by_attempt
        if len(history) <= self.num_attempts:
            return []
        before = history[-self.num_attempts - 1]
        recent = [p for p in history[-self.num_attempts:] if p is not None]
        best_recent = max(recent) if recent else None
        stalled = best_recent is None or (before is not None and best_recent <= before)
        return [(self.setting, self.num_attempts)] if stalled else []
