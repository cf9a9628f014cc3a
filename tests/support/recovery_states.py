"""Frozen recovery states and fault events for policy tests, built in one line each."""

from __future__ import annotations

from ray_resilience._internal.supervisor.state import FaultEvent
from ray_resilience.policy import FaultRecord, RecoveryState


def fault(cause: str, *ranks: int, attempt: int = 0,
          respawned: tuple[int, ...] = ()) -> FaultRecord:
    return FaultRecord(cause=cause, ranks=ranks, attempt=attempt, step=None, respawned=respawned)


def state(*faults: FaultRecord, progress: tuple = (), world_size: int = 2) -> RecoveryState:
    return RecoveryState(attempt=len(faults), world_size=world_size, faults=faults,
                         progress_by_attempt=progress
                         or tuple(range(10, 10 * (len(faults) + 1), 10)))


def event(cause: str, *ranks: int) -> FaultEvent:
    return FaultEvent(cause=cause, ranks=list(ranks), attempt=0, t_detect=0.0)
