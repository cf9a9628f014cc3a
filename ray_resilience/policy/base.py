"""The recovery-policy interface: a fault and a frozen view of the run in, a `Decision` out.

A policy decides; the supervisor acts. Pass your own as `ResilienceConfig(recovery_policy=...)`;
`DefaultRecoveryPolicy` (policy/ladder.py) is the ladder used otherwise.
"""

from __future__ import annotations

import abc
import dataclasses
import enum

from ray_resilience.policy.state import FaultRecord, RecoveryState


class Action(enum.StrEnum):
    """What the supervisor does about a fault."""

    RESTART = "restart"
    """New attempt; every rank keeps its process (in-process restart)."""
    RESPAWN = "respawn"
    """The `respawn` ranks get new processes (needs `InJobConfig`); the rest restart in-process."""
    FAIL = "fail"
    """The run ends with `error`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    """A policy's answer. Build it with `restart()`, `respawn(...)` or `fail(...)`."""

    action: Action
    respawn: tuple[int, ...] = ()
    """Ranks that get a new process (RESPAWN only)."""
    exclude_nodes: tuple[str, ...] = ()
    """Nodes to exclude from now on; every rank on them must be in `respawn` (RESPAWN only)."""
    error: BaseException | None = None
    """What the run fails with (FAIL only; None: the fault's own error)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))
        if (self.action is Action.RESPAWN) != bool(self.respawn):
            raise ValueError(f"Decision(action={self.action.value!r}, respawn={self.respawn}): "
                             "respawn lists ranks exactly when the action is RESPAWN.")
        if self.exclude_nodes and self.action is not Action.RESPAWN:
            raise ValueError("Decision.exclude_nodes needs action RESPAWN (their ranks move).")

    @classmethod
    def restart(cls) -> Decision:
        return cls(action=Action.RESTART)

    @classmethod
    def respawn_ranks(cls, ranks: tuple[int, ...], exclude_nodes: tuple[str, ...] = ()) -> Decision:
        return cls(action=Action.RESPAWN, respawn=tuple(sorted(ranks)),
                   exclude_nodes=tuple(exclude_nodes))

    @classmethod
    def fail(cls, error: BaseException | None) -> Decision:
        return cls(action=Action.FAIL, error=error)


class RecoveryPolicy(abc.ABC):
    """Decides what to do about each fault. Subclass it and pass an instance as
    `ResilienceConfig(recovery_policy=...)`.

    `decide` runs in the supervisor actor (so the instance must pickle), once per fault, on the
    supervisor's state-machine thread. It gets the current fault (also `state.faults[-1]`) and a
    frozen view of the run; it must not block, touch actors or keep references to the state.
    An exception it raises fails the run with that exception.
    """

    @abc.abstractmethod
    def decide(self, fault: FaultRecord, state: RecoveryState) -> Decision:
        """The supervisor's next move for `fault`."""
