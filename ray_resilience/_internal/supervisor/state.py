"""The supervisor's states. Each value says whether it ends the run."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class RunState(enum.Enum):
    STARTING = ("starting", False)
    RUNNING = ("running", False)
    RESTARTING = ("restarting", False)
    """In-process restart: every rank keeps its process; a new attempt starts."""
    RESPAWNING = ("respawning", False)
    """In-job respawn: dead or stuck ranks get new actors; survivors restart in-process."""
    FINISHED = ("finished", True)
    FAILED = ("failed", True)
    ABORTED = ("aborted", True)

    def __init__(self, label: str, terminal: bool) -> None:
        self.label, self.terminal = label, terminal


@dataclasses.dataclass
class FaultEvent:
    """One detected fault: what, where, when (supervisor wall clock), and what it broke."""

    cause: str
    """exception | actor_died | hang | oom | node_lost"""
    ranks: list[int]
    attempt: int
    t_detect: float
    error: BaseException | None = None
    step: int | None = None
    t_fault: float | None = None
    """When the fault happened, if known (injected faults report it before firing)."""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
