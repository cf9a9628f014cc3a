"""The two restart rungs' configs: `InProcessConfig` (same processes) and `InJobConfig` (new
actors for dead or stuck ranks). Validated on construction, like every config."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ray_resilience import _validate as check
from ray_resilience.policy.parts import Compose, FaultCounter, MaxAttempts, NoProgressLimit
from ray_resilience.policy.state import RecoveryState

RESPAWN_POLICIES = ("replace-failed", "all")


@dataclasses.dataclass(kw_only=True)
class InProcessConfig:
    """Rung 1: on an exception or a Python-level hang, every rank keeps its process and the
    train function is re-entered from the newest checkpoint."""

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
        check.integer("InProcessConfig.max_restarts", self.max_restarts, minimum=0,
                      fix="0 turns in-process restart off.")
        check.integer("InProcessConfig.max_attempts_without_progress",
                      self.max_attempts_without_progress, minimum=1)
        check.seconds("InProcessConfig.interrupt_timeout_s", self.interrupt_timeout_s,
                      minimum=0.1, fix="Ranks need time to unwind after an abort.")
        check.seconds("InProcessConfig.barrier_timeout_s", self.barrier_timeout_s, minimum=1.0)
        check.callable_("InProcessConfig.health_check", self.health_check,
                        fix="Give a function of a RecoveryState returning ranks, e.g. "
                            "Compose(FaultCounter()).")
        check.callable_("InProcessConfig.retry_limit", self.retry_limit, optional=True,
                        fix="Give a function of a RecoveryState returning (setting, limit) "
                            "reasons to stop, or None for the default.")
        if self.retry_limit is None:
            self.retry_limit = Compose(
                MaxAttempts(self.max_restarts),
                NoProgressLimit(self.max_attempts_without_progress))


@dataclasses.dataclass(kw_only=True)
class InJobConfig:
    """Rung 2: dead or stuck ranks get new actors in the same placement group;
    `replace-failed` replaces only them, `all` every rank."""

    policy: str = "replace-failed"
    """"replace-failed" | "all"."""
    max_restarts: int = 10
    """Respawns allowed in one run."""
    max_attempts_without_progress: int = 3
    """Stop when this many respawns in a row complete no new step."""
    num_spares: int = 0
    """Warm spare actors started ahead of time; a replacement then skips process start-up."""
    num_prestarted_workers: int = 1
    """Ray worker processes kept booted (and importing torch at idle priority) on each node
    hosting ranks, for respawns without a spare; about 0.4 GB each. 0: off."""
    heartbeat_timeout_s: float = 10.0
    """A rank whose side thread sent nothing for this long is dead (frozen, node lost)."""
    replacement_timeout_s: float = 300.0
    """How long to wait for capacity for a replacement."""
    min_workers: int | None = None
    """Continue with fewer ranks (down to this many) when replacements find no capacity
    in time; the checkpoint is loaded resharded. None: never shrink."""
    max_node_faults: int | None = None
    """Exclude a node after more than this many faults lost or hung a rank's process on it;
    its ranks move elsewhere. None: never."""

    def __post_init__(self) -> None:
        check.choice("InJobConfig.policy", self.policy, RESPAWN_POLICIES)
        check.integer("InJobConfig.max_restarts", self.max_restarts, minimum=0)
        check.integer("InJobConfig.max_attempts_without_progress",
                      self.max_attempts_without_progress, minimum=1)
        check.integer("InJobConfig.num_spares", self.num_spares, minimum=0)
        check.integer("InJobConfig.num_prestarted_workers", self.num_prestarted_workers,
                      minimum=0, fix="0: no prestarted worker processes.")
        check.seconds("InJobConfig.heartbeat_timeout_s", self.heartbeat_timeout_s, minimum=0.5,
                      fix="Allow several progress intervals.")
        check.seconds("InJobConfig.replacement_timeout_s", self.replacement_timeout_s,
                      minimum=1.0)
        check.optional_integer("InJobConfig.min_workers", self.min_workers, minimum=1,
                               fix="Or None to never shrink the world.")
        check.optional_integer("InJobConfig.max_node_faults", self.max_node_faults, minimum=1,
                               fix="Faults a node may host before it is excluded, or None to "
                                   "never exclude nodes.")
