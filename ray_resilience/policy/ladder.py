"""The failure policy: given a detected fault and the run's history, decide the next rung.

Pure: it reads a frozen `RecoveryState` and the configs and returns a `Decision`; it never
touches actors. The supervisor acts on the decision.
"""

from __future__ import annotations

import dataclasses

from ray_resilience.config import ResilienceConfig
from ray_resilience.errors import RestartLimitError
from ray_resilience.policy.parts import NodeExclusion, NoProgressLimit
from ray_resilience.policy.state import RecoveryState
from ray_resilience._internal.supervisor.state import FaultEvent

#: Causes after which the rank's process is gone or cannot be trusted to answer.
PROCESS_LOST = frozenset({"actor_died", "oom", "unresponsive", "stuck"})


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    """"restart" (new attempt; `respawn` ranks get new actors first) or "fail"."""
    respawn: tuple[int, ...] = ()
    error: BaseException | None = None
    exclude_nodes: tuple[str, ...] = ()
    """Nodes to exclude from now on (their ranks are in `respawn`)."""


def _limit_error(reasons: list[tuple[str, int]], state: RecoveryState,
                 fault: FaultEvent) -> RestartLimitError:
    setting, limit = reasons[0]
    return RestartLimitError(
        setting=setting, limit=limit, causes=[f.cause for f in state.faults],
        ranks=[r for f in state.faults for r in f.ranks], last_error=fault.error)


def decide(fault: FaultEvent, state: RecoveryState, cfg: ResilienceConfig,
           num_respawns: int) -> Decision:
    """The next rung for `fault` (the last entry of `state.faults`)."""
    in_process, in_job = cfg.in_process, cfg.in_job
    lost = fault.cause in PROCESS_LOST
    if lost and in_job is None:
        return Decision("fail", error=fault.error)
    if not lost and in_process is None and in_job is None:
        return Decision("fail", error=fault.error)
    if in_process is not None and not lost:
        reasons = list(in_process.retry_limit(state))
        if reasons:
            return Decision("fail", error=_limit_error(reasons, state, fault))
    respawn: set[int] = set(fault.ranks) if lost else set()
    if in_process is not None and in_job is not None:
        respawn |= set(in_process.health_check(state))
    exclude: list[str] = []
    if in_job is not None and in_job.max_node_faults is not None:
        exclude = NodeExclusion(in_job.max_node_faults)(state)
        respawn |= {r for r, node in enumerate(state.rank_nodes) if node in exclude}
    if in_job is not None and (respawn or in_process is None):
        if in_process is None:
            respawn |= set(fault.ranks)
        if in_job.policy == "all":
            respawn = set(range(state.world_size))
        if num_respawns + 1 > in_job.max_restarts:
            return Decision("fail", error=_limit_error(
                [("InJobConfig.max_restarts", in_job.max_restarts)], state, fault))
        stalled = NoProgressLimit(in_job.max_attempts_without_progress,
                                  "InJobConfig.max_attempts_without_progress")(state)
        if stalled:
            return Decision("fail", error=_limit_error(stalled, state, fault))
    return Decision("restart", respawn=tuple(sorted(respawn)), exclude_nodes=tuple(exclude))
