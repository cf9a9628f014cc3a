"""What a recovery policy sees: a frozen view of the run and its faults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRecord:
    """One past fault as the parts see it."""

    cause: str
    ranks: tuple[int, ...]
    attempt: int
    step: int | None
    """The newest globally completed step when the fault was detected."""
    respawned: tuple[int, ...] = ()
    """Ranks that got a new process in this fault's recovery (empty for the current fault)."""
    nodes: tuple[str, ...] = ()
    """Node ids of `ranks` when the fault happened."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveryState:
    """Frozen view of the run handed to every part: never mutate, never touch actors."""

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

    @property
    def current(self) -> FaultRecord:
        return self.faults[-1]
