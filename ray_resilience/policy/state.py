"""What a recovery policy sees: why a fault happened and a frozen view of the run and its faults."""

from __future__ import annotations

import dataclasses
import enum


class FaultCause(enum.StrEnum):
    """Why the supervisor declared a fault. Values are the strings of `Result.faults`."""

    EXCEPTION = "exception"
    """The train function raised on one or more ranks."""
    ACTOR_DIED = "actor_died"
    """A rank's process exited (SIGKILL, segfault, Ray's memory monitor)."""
    OOM = "oom"
    """A rank's process was killed for memory (known when a fault plan says so)."""
    HANG = "hang"
    """A rank made no progress for longer than the timeout of the phase it is in."""
    UNRESPONSIVE = "unresponsive"
    """A rank's side thread sent no heartbeat for `InJobConfig.heartbeat_timeout_s` (frozen)."""
    NODE_LOST = "node_lost"
    """A rank's actor died because Ray declared its node dead."""
    PREEMPTED = "preempted"
    """A node hosting ranks was drained (or a rank got SIGTERM): every rank saved a step and
    stopped; the supervisor moves the ranks without asking the recovery policy."""

    @property
    def process_lost(self) -> bool:
        """The rank's process is gone or cannot be trusted to answer: it needs a new one."""
        return self in _PROCESS_LOST

    @property
    def node_fault(self) -> bool:
        """Points at the machine more than at the code (counted per node for exclusion)."""
        return self not in (FaultCause.EXCEPTION, FaultCause.PREEMPTED)


_PROCESS_LOST = frozenset({FaultCause.ACTOR_DIED, FaultCause.OOM, FaultCause.UNRESPONSIVE,
                           FaultCause.NODE_LOST})


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRecord:
    """One fault as a policy and its parts see it (a plain string cause is converted)."""

    cause: FaultCause
    ranks: tuple[int, ...]
    attempt: int
    step: int | None
    """The newest globally completed step when the fault was detected."""
    respawned: tuple[int, ...] = ()
    """Ranks that got a new process in this fault's recovery (empty for the current fault)."""
    nodes: tuple[str | None, ...] = ()
    """Node ids of `ranks` when the fault happened (None where unknown)."""
    error: BaseException | None = dataclasses.field(default=None, compare=False)
    """The error that revealed the fault (what the run fails with if nothing can be done)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cause", FaultCause(self.cause))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveryState:
    """Frozen view of the run handed to every policy and part: never mutate, never touch actors."""

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
    num_respawns: int = 0
    """Recoveries so far that gave ranks new processes."""

    @property
    def current(self) -> FaultRecord:
        return self.faults[-1]
