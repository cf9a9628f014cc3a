"""The default recovery policy: in-process restart, then respawn of failed ranks, then fail.

Pure: it reads a frozen `RecoveryState` and the configs and returns a `Decision`; it never
touches actors. `create_recovery_policy` is what the supervisor calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ray_resilience.errors import RestartLimitError
from ray_resilience.policy.base import Decision, RecoveryPolicy
from ray_resilience.policy.parts import NodeExclusion, NoProgressLimit
from ray_resilience.policy.state import FaultRecord, RecoveryState

if TYPE_CHECKING:  # config imports the policy parts
    from ray_resilience.config import InJobConfig, InProcessConfig, ResilienceConfig


class DefaultRecoveryPolicy(RecoveryPolicy):
    """The ladder. An exception or hang restarts in-process (`in_process`, within its retry
    limit); a lost process, an unhealthy rank or an excluded node's ranks are respawned
    (`in_job`, within its limits); anything else fails the run."""

    def __init__(self, in_process: InProcessConfig | None, in_job: InJobConfig | None) -> None:
        self.in_process, self.in_job = in_process, in_job

    def decide(self, fault: FaultRecord, state: RecoveryState) -> Decision:
        in_process, in_job = self.in_process, self.in_job
        lost = fault.cause.process_lost
        if (lost and in_job is None) or (in_process is None and in_job is None):
            return Decision.fail(fault.error)
        if in_process is not None and not lost:
            reasons = list(in_process.retry_limit(state))
            if reasons:
                return Decision.fail(_limit_error(reasons, state, fault))
        respawn: set[int] = set(fault.ranks) if lost else set()
        if in_process is not None and in_job is not None:
            respawn |= set(in_process.health_check(state))
        exclude: list[str] = []
        if in_job is not None and in_job.max_node_faults is not None:
            exclude = NodeExclusion(in_job.max_node_faults)(state)
            respawn |= {r for r, node in enumerate(state.rank_nodes) if node in exclude}
        if in_job is None or not (respawn or in_process is None):
            return Decision.restart()
        return self._respawn(fault, state, respawn, exclude)

    def _respawn(self, fault: FaultRecord, state: RecoveryState, respawn: set[int],
                 exclude: list[str]) -> Decision:
        in_job = self.in_job
        assert in_job is not None
        if self.in_process is None:
            respawn |= set(fault.ranks)
        if in_job.policy == "all":
            respawn = set(range(state.world_size))
        if state.num_respawns + 1 > in_job.max_restarts:
            return Decision.fail(_limit_error(
                [("InJobConfig.max_restarts", in_job.max_restarts)], state, fault))
        stalled = NoProgressLimit(in_job.max_attempts_without_progress,
                                  "InJobConfig.max_attempts_without_progress")(state)
        if stalled:
            return Decision.fail(_limit_error(stalled, state, fault))
        return Decision.respawn_ranks(tuple(respawn), tuple(exclude))


def _limit_error(reasons: list[tuple[str, int]], state: RecoveryState,
                 fault: FaultRecord) -> RestartLimitError:
    setting, limit = reasons[0]
    return RestartLimitError(
        setting=setting, limit=limit, causes=[f.cause.value for f in state.faults],
        ranks=[r for f in state.faults for r in f.ranks], last_error=fault.error)


def create_recovery_policy(cfg: ResilienceConfig) -> RecoveryPolicy:
    """The user's `cfg.recovery_policy`, else the ladder over `cfg.in_process` / `cfg.in_job`."""
    if cfg.recovery_policy is not None:
        return cfg.recovery_policy
    return DefaultRecoveryPolicy(cfg.in_process, cfg.in_job)
