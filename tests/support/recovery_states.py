"""Frozen recovery states for policy tests, built in one line each, and the default decision."""

from __future__ import annotations

import dataclasses

from ray_resilience.config import ResilienceConfig
from ray_resilience.policy import DefaultRecoveryPolicy, FaultRecord, RecoveryState


def fault(cause: str, *ranks: int, attempt: int = 0,
          respawned: tuple[int, ...] = ()) -> FaultRecord:
    return FaultRecord(cause=cause, ranks=ranks, attempt=attempt, step=None, respawned=respawned)


def state(*faults: FaultRecord, progress: tuple = (), world_size: int = 2) -> RecoveryState:
    return RecoveryState(attempt=len(faults), world_size=world_size, faults=faults,
                         progress_by_attempt=progress
                         or tuple(range(10, 10 * (len(faults) + 1), 10)))


def decide(current: RecoveryState, cfg: ResilienceConfig, num_respawns: int):
    """The default policy's decision on the last fault of `current`."""
    policy = DefaultRecoveryPolicy(cfg.in_process, cfg.in_job)
    return policy.decide(current.current, dataclasses.replace(current, num_respawns=num_respawns))
