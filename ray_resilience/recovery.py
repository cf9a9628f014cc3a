"""Recovery settings and the small composable parts the supervisor consults.

The recovery ladder (see DESIGN.md): in-process restart first (same processes), respawn of the
failed ranks next, job retry last. `InProcessConfig` and `InJobConfig` turn the first two rungs
on; each part below is a small callable taking a frozen `RecoveryState`, composed with `Compose`.
Policies decide; the supervisor acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ray_resilience.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRecord:
    """One past fault as the parts see it."""

    cause: str
    ranks: tuple[int, ...]
    attempt: int
    step: int | None
    """The newest globally completed step when the fault was detected."""
    respawned: tuple[int, ...] = ()
    """Ranks that got a new process in this fault's recovery (empty for the current fault)."""
    nodes: tuple[str, ...] = ()
    """Node ids of `ranks` when the fault happened."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveryState:
    """Frozen view of the run handed to every part: never mutate, never touch actors."""

    attempt: int
    world_size: int
    faults: tuple[FaultRecord, ...]
    """Every fault so far, the current one last."""
    progress_by_attempt: tuple[int | None, ...]
    """The newest completed step at the end of each attempt (None: no step completed)."""
    rank_nodes: tuple[str | None, ...] = ()
    """The node each rank runs on now."""
    excluded_nodes: frozenset[str] = frozenset()
    """Nodes already excluded from the run."""

    @property
    def current(self) -> FaultRecord:
        return self.faults[-1]


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


#: Fault causes that point at the machine more than at the code: counted per node.
NODE_FAULT_CAUSES = frozenset({"actor_died", "oom", "unresponsive", "stuck", "node_lost", "hang"})


@dataclasses.dataclass(frozen=True)
class NodeExclusion:
    """Nodes on which more than `max_node_faults` faults lost a rank's process or hung it
    (SIGKILL, OOM, segfault, frozen, lost, hung; exceptions are the code's, not the node's).
    Returns node ids to exclude; the ranks there move to other nodes."""

    max_node_faults: int

    def __call__(self, state: RecoveryState) -> list[str]:
        counts: dict[str, int] = {}
        for fault in state.faults:
            if fault.cause in NODE_FAULT_CAUSES:
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


def _check(field: str, value: Any, minimum: float, fix: str, *, integer: bool = False) -> None:
    bad_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad_type or value < minimum:
        raise ConfigError(field, value, fix)


@dataclasses.dataclass(kw_only=True)
class InProcessConfig:
    """Rung 1: on an exception or a Python-level hang, every rank keeps its process.

    Ranks abort their process groups, unwind the train function, agree on a new attempt and
    re-enter it; the function reloads the newest checkpoint. The hang ("soft") timeouts live in
    `ResilienceConfig.step_timeout_s` / `first_step_timeout_s`.
    """

    max_restarts: int = 20
    """In-process restarts allowed in one run."""
    max_attempts_without_progress: int = 3
    """Stop when this many attempts in a row complete no new step (restart storm)."""
    interrupt_timeout_s: float = 10.0
    """Hard timeout: how long an interrupted rank may take to unwind before it is respawned."""
    barrier_timeout_s: float = 60.0
    """How long the new attempt's rendezvous may take."""
    health_check: Callable[[RecoveryState], Sequence[int]] = dataclasses.field(
        default_factory=lambda: Compose(FaultCounter()))
    """Ranks that must not keep their process (they are respawned when InJobConfig allows)."""
    retry_limit: Callable[[RecoveryState], Sequence[tuple[str, int]]] | None = None
    """Reasons to stop; default: MaxAttempts(max_restarts) + NoProgressLimit(...)."""

    def __post_init__(self) -> None:
        _check("InProcessConfig.max_restarts", self.max_restarts, 0,
               "must be an integer >= 0 (0 turns in-process restart off).", integer=True)
        _check("InProcessConfig.max_attempts_without_progress", self.max_attempts_without_progress,
               1, "must be an integer >= 1.", integer=True)
        _check("InProcessConfig.interrupt_timeout_s", self.interrupt_timeout_s, 0.1,
               "must be >= 0.1 s: ranks need time to unwind after an abort.")
        _check("InProcessConfig.barrier_timeout_s", self.barrier_timeout_s, 1.0, "must be >= 1 s.")
        if self.retry_limit is None:
            self.retry_limit = Compose(
                MaxAttempts(self.max_restarts),
                NoProgressLimit(self.max_attempts_without_progress))


RESPAWN_POLICIES = ("replace-failed", "all")


@dataclasses.dataclass(kw_only=True)
class InJobConfig:
    """Rung 2: dead or stuck ranks get new actors in the same placement group.

    `replace-failed` replaces only the failed ranks (survivors restart in-process);
    `all` replaces every rank (what NVRx's ft_launcher does).
    """

    policy: str = "replace-failed"
    """"replace-failed" | "all"."""
    max_restarts: int = 10
    """Respawns allowed in one run."""
    max_attempts_without_progress: int = 3
    """Stop when this many respawns in a row complete no new step (a rank that dies every time)."""
    num_spares: int = 0
    """Warm spare actors started ahead of time, so a replacement skips process start-up (a
    used spare is replaced once the recovery has completed a step; it is warm 4-5 s later on a
    small CPU node). Size it to the faults expected within that time."""
    num_prestarted_workers: int = 1
    """Ray worker processes kept booted on each node hosting ranks, for rank respawns without a
    spare: they hold no resources and no rank state, and import torch, DTensor, DCP and FSDP2's
    dynamo hooks in the background at idle CPU priority (they only take CPU nothing else on the
    node wants), so a respawned rank skips its process boot and imports (2.5-3.5 s of the 4 s a
    SIGKILL cost here). Asked for once the run completed its first step, and one more right after
    each respawn; each holds torch's memory (about 0.4 GB here). More than one rarely helps: Ray
    hands a new actor the most recently booted idle worker, which after a respawn is the one
    still importing. 0: off (a respawned rank boots and imports in a new process)."""
    heartbeat_timeout_s: float = 10.0
    """A rank whose side thread sent nothing for this long is treated as dead (frozen, node lost)."""
    replacement_timeout_s: float = 300.0
    """How long to wait for capacity for a replacement (a lost node coming back)."""
    min_workers: int | None = None
    """Continue with fewer ranks (down to this many) when replacements find no capacity in time;
    ranks above a gap shift down and the checkpoint is loaded resharded. None: never shrink."""
    max_node_faults: int | None = None
    """Exclude a node once more than this many faults lost or hung a rank's process on it: its
    ranks move to other nodes (waiting up to replacement_timeout_s for room). None: never."""

    def __post_init__(self) -> None:
        if self.policy not in RESPAWN_POLICIES:
            raise ConfigError("InJobConfig.policy", self.policy, f"must be one of {RESPAWN_POLICIES}.")
        _check("InJobConfig.max_restarts", self.max_restarts, 0, "must be an integer >= 0.",
               integer=True)
        _check("InJobConfig.max_attempts_without_progress", self.max_attempts_without_progress, 1,
               "must be an integer >= 1.", integer=True)
        _check("InJobConfig.num_spares", self.num_spares, 0, "must be an integer >= 0.", integer=True)
        _check("InJobConfig.num_prestarted_workers", self.num_prestarted_workers, 0,
               "must be an integer >= 0 (0: no prestarted worker processes).", integer=True)
        _check("InJobConfig.heartbeat_timeout_s", self.heartbeat_timeout_s, 0.5,
               "must be >= 0.5 s (several progress intervals).")
        _check("InJobConfig.replacement_timeout_s", self.replacement_timeout_s, 1.0, "must be >= 1 s.")
        if self.min_workers is not None:
            _check("InJobConfig.min_workers", self.min_workers, 1,
                   "must be an integer >= 1, or None to never shrink the world.", integer=True)
        if self.max_node_faults is not None:
            _check("InJobConfig.max_node_faults", self.max_node_faults, 1,
                   "must be an integer >= 1 (faults a node may host before it is excluded), "
                   "or None to never exclude nodes.", integer=True)
