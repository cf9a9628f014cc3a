"""The run's fault history as the supervisor keeps it, and the frozen view a policy gets of it."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from ray_resilience._internal.supervisor.repair import RepairOutcome
from ray_resilience._internal.supervisor.run_record import RunRecord
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.callbacks import FaultDetected
from ray_resilience.policy.state import FaultCause, RecoveryState

if TYPE_CHECKING:
    from ray_resilience._internal.worker_group.group import WorkerGroup


class FaultHistory:
    """Every fault of the run in order, the respawns so far, the nodes excluded, and the injected
    faults that fired. Changed by the supervisor's state machine only, except `fault_fired`
    (a control call: guarded by a lock)."""

    def __init__(self) -> None:
        self.faults: list[DetectedFault] = []
        self.num_respawns = 0
        self.excluded_nodes: set[str] = set()
        """Nodes excluded after too many faults (InJobConfig.max_node_faults)."""
        self._fired: dict[str, dict[str, Any]] = {}
        """Injected faults that fired: id -> {rank, attempt, t, step, kind}."""
        self._lock = threading.Lock()

    def fault_fired(self, fault_id: str, info: dict[str, Any]) -> None:
        """A rank is about to fire injected fault `fault_id` (it reports before: a SIGKILL
        would lose the report)."""
        with self._lock:
            self._fired[fault_id] = info

    def fired(self) -> set[str]:
        """Ids of the injected faults that fired (not to be armed again)."""
        with self._lock:
            return set(self._fired)

    def _match_injected(self, ranks: tuple[int, ...],
                        attempt: int) -> tuple[str, dict[str, Any]] | None:
        """The injected fault behind a detected one (same attempt, preferably same rank)."""
        with self._lock:
            candidates = [(fid, info) for fid, info in self._fired.items()
                          if info["attempt"] == attempt and not info.get("matched")]
            # Prefer the rank that was detected; a hung rank's peers often time out first.
            candidates.sort(key=lambda item: item[1]["rank"] not in ranks)
            if not candidates:
                return None
            fault_id, info = candidates[0]
            info["matched"] = True
            return fault_id, info

    @property
    def last(self) -> DetectedFault:
        return self.faults[-1]

    def add(self, fault: DetectedFault, record: RunRecord, group: WorkerGroup) -> DetectedFault:
        """Completes a detected fault (where, the step it hit, the injected fault behind it,
        its id) and appends it; returns it completed."""
        fault = dataclasses.replace(
            fault, step=record.global_step,
            fault_id=f"fault{len(self.faults) + 1}-a{fault.attempt}",
            nodes=tuple(group.node_of_rank(r) for r in fault.ranks if r < group.world_size))
        injected = self._match_injected(fault.ranks, fault.attempt)
        if injected is not None:
            fault_id, info = injected
            # An injected OOM is a SIGKILL like any other: the plan says why.
            cause = FaultCause.OOM if info["kind"] == "oom" else fault.cause
            fault = dataclasses.replace(fault, fault_id=fault_id, t_fault=info["t"],
                                        step=info["step"], kind=info["kind"], cause=cause)
        self.faults.append(fault)
        return fault

    def repaired(self, done: RepairOutcome, *, revised: DetectedFault | None = None) -> None:
        """Notes what the repair of the last fault did (`revised`: the fault as it stands once
        its attempt was closed); the respawned ranks count only when the repair succeeded."""
        fault = dataclasses.replace(revised or self.last, excluded_nodes=done.excluded_nodes,
                                    replacements=done.replacements)
        if done.error is None:
            fault = dataclasses.replace(fault, respawned=done.respawned)
            self.num_respawns += 1 if done.respawned else 0
        self.faults[-1] = fault
        self.excluded_nodes.update(done.excluded_nodes)

    def state(self, attempt: int, world_size: int, record: RunRecord,
              group: WorkerGroup | None) -> RecoveryState:
        """The frozen view of the run a recovery policy decides on."""
        return RecoveryState(
            attempt=attempt, world_size=world_size, faults=tuple(f.record() for f in self.faults),
            progress_by_attempt=tuple(record.reached_by_attempt.get(a) for a in range(attempt + 1)),
            rank_nodes=tuple(group.node_of_rank(r) for r in range(world_size)) if group else (),
            excluded_nodes=frozenset(self.excluded_nodes), num_respawns=self.num_respawns)

    def describe(self) -> list[dict[str, Any]]:
        return [f.describe() for f in self.faults]


def detected_event(fault: DetectedFault) -> FaultDetected:
    """The callbacks' view of a fault."""
    return FaultDetected(
        fault_id=fault.fault_id, cause=fault.cause, ranks=fault.ranks, attempt=fault.attempt,
        step=fault.step, nodes=fault.nodes, kind=fault.kind, t_fault=fault.t_fault,
        t_detect=fault.t_detect, error=fault.error)
