"""The supervisor's states (an enum whose values carry their properties, one small class per state
with its payload) and what detection hands the supervisor: a `DetectedFault`."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ray_resilience.policy.base import Action, Decision
from ray_resilience.policy.state import FaultCause, FaultRecord


class RunState(enum.Enum):
    """label, terminal (the run is over), needs_new_attempt (RUNNING next starts attempt + 1)."""

    SCHEDULING = ("scheduling", False, False)
    """Reserving the placement group of the ranks (and spares)."""
    STARTING = ("starting", False, False)
    """Starting the ranks' actors and the checkpoint service, then launching attempt 0."""
    RUNNING = ("running", False, False)
    RESTARTING = ("restarting", False, True)
    """In-process restart: every rank keeps its process; a new attempt starts."""
    RESPAWNING = ("respawning", False, True)
    """In-job respawn: dead or stuck ranks get new actors; survivors restart in-process."""
    FINISHED = ("finished", True, False)
    FAILED = ("failed", True, False)
    ABORTED = ("aborted", True, False)

    def __init__(self, label: str, terminal: bool, needs_new_attempt: bool) -> None:
        self.label, self.terminal, self.needs_new_attempt = label, terminal, needs_new_attempt


@dataclasses.dataclass(frozen=True)
class DetectedFault:
    """One detected fault: what, where, when (supervisor wall clock), and what it broke."""

    cause: FaultCause
    ranks: tuple[int, ...]
    attempt: int
    t_detect: float
    error: BaseException | None = None
    step: int | None = None
    """The newest globally completed step at the fault (revised when late reports arrive)."""
    t_fault: float | None = None
    """When the fault happened, if known (injected faults report it before firing)."""
    fault_id: str = ""
    """The injected fault's id, else one the supervisor made up (the timeline's key)."""
    kind: str | None = None
    """The injected fault's kind, when a fault plan fired it (None: not injected)."""
    nodes: tuple[str | None, ...] = ()
    respawned: tuple[int, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    replacements: tuple[dict[str, Any], ...] = ()
    """How each respawned rank's new process started (pid, preimported)."""
    t_torn: float | None = None
    """When its repair's teardown ended (every rank unwound or killed)."""

    def record(self) -> FaultRecord:
        """The fault as a recovery policy sees it."""
        return FaultRecord(cause=self.cause, ranks=self.ranks, attempt=self.attempt, step=self.step,
                           respawned=self.respawned, nodes=self.nodes, error=self.error)

    def describe(self) -> dict[str, Any]:
        """JSON-safe summary for `Result.faults` and results.json."""
        return {"cause": self.cause.value, "ranks": list(self.ranks), "attempt": self.attempt,
                "step": self.step, "t_fault": self.t_fault, "t_detect": self.t_detect,
                "fault_id": self.fault_id if self.kind else None, "kind": self.kind,
                "nodes": list(self.nodes),
                "respawned": list(self.respawned), "excluded_nodes": list(self.excluded_nodes),
                "replacements": list(self.replacements),
                "error": str(self.error).splitlines()[0] if self.error else None}


@dataclasses.dataclass(frozen=True)
class State:
    """Base of the state classes: `kind` is the enum value, the fields are its payload."""

    kind: RunState


@dataclasses.dataclass(frozen=True)
class Repairing(State):
    """RESTARTING or RESPAWNING: the fault being repaired and the policy's decision."""

    fault: DetectedFault
    decision: Decision

    @staticmethod
    def of(fault: DetectedFault, decision: Decision) -> Repairing:
        kind = RunState.RESPAWNING if decision.action is Action.RESPAWN else RunState.RESTARTING
        return Repairing(kind, fault, decision)


@dataclasses.dataclass(frozen=True)
class Ended(State):
    """FINISHED, FAILED or ABORTED, with the error that ended the run (None when it finished)."""

    error: BaseException | None = None


SCHEDULING = State(RunState.SCHEDULING)
STARTING = State(RunState.STARTING)
RUNNING = State(RunState.RUNNING)
"""The states without a payload (one instance each: `_set_state` compares by identity)."""
