"""Built-in callbacks: the goodput timeline and the recent events the driver's display shows.

Two events only these recorders need (the timeline's recovery phases and a fault's revised step)
are internal: they carry a `hook` no public `Callback` defines, so user callbacks never see them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any, ClassVar

from ray_resilience.callbacks import (
    Callback,
    CheckpointCommitted,
    CheckpointDropped,
    CheckpointSaved,
    FaultDetected,
    RecoveryDone,
    RunStarted,
    StateChanged,
    StepCompleted,
)
from ray_resilience.errors import format_ranks
from ray_resilience.goodput import GoodputReport, RunTimeline, compute_goodput

log = logging.getLogger(__name__)

RECENT_EVENTS = 50
"""How many recent events `RecentEvents` keeps for the driver."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveryPhase:
    """One timed phase of a fault's recovery (teardown, rendezvous, checkpoint_load)."""

    hook: ClassVar[str] = "on_recovery_phase"
    fault_id: str
    phase: str
    t_start: float
    t_end: float
    tier: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultStepRevised:
    """Steps completed before the fault reached the supervisor late: its step is at least `step`."""

    hook: ClassVar[str] = "on_fault_step_revised"
    fault_id: str
    step: int


class TimelineRecorder(Callback):
    """Feeds the run's `RunTimeline` (goodput accounting) from the event stream."""

    def __init__(self) -> None:
        self.timeline = RunTimeline()

    def on_run_start(self, event: RunStarted) -> None:
        self.timeline.run_started(event.t, event.world_size, start_step=event.start_step)

    def on_step_completed(self, event: StepCompleted) -> None:
        self.timeline.step_completed(event.step, event.t, event.world_size)

    def on_checkpoint_saved(self, event: CheckpointSaved) -> None:
        self.timeline.checkpoint_saved(event.step, event.t, event.blocking_s, tier=event.tier)

    def on_checkpoint_committed(self, event: CheckpointCommitted) -> None:
        self.timeline.checkpoint_committed(event.step, event.t)

    def on_fault_detected(self, event: FaultDetected) -> None:
        t_fault = event.t_fault or event.t_detect
        self.timeline.fault_detected(
            event.fault_id, t_fault=t_fault, t_detect=max(event.t_detect, t_fault),
            step_at_fault=event.step or 0, rank=event.ranks[0], cause=event.cause.value,
            kind=event.kind)

    def on_recovery_phase(self, event: RecoveryPhase) -> None:
        self.timeline.recovery_phase(event.fault_id, event.phase, event.t_start, event.t_end,
                                     tier=event.tier)

    def on_fault_step_revised(self, event: FaultStepRevised) -> None:
        self.timeline.step_at_fault_is(event.fault_id, event.step)

    def on_recovery_done(self, event: RecoveryDone) -> None:
        self.timeline.recovery_done(event.fault_id, event.t, event.resumed_from_step)

    def close(self, t_end: float, final_step: int) -> GoodputReport | None:
        """Ends the timeline and computes the run's goodput (None when it cannot be computed)."""
        if self.timeline.t_start is None:
            return None  # the run ended before its ranks started
        try:
            self.timeline.run_finished(t_end, final_step)
            return compute_goodput(self.timeline)
        except Exception:  # accounting must never fail a finished run
            log.exception("goodput accounting failed")
            return None


class RecentEvents(Callback):
    """The last `RECENT_EVENTS` faults, recoveries, commits and state changes, numbered, as
    short lines for `Supervisor.status()` (read from other actor threads: guarded by a lock)."""

    def __init__(self, maxlen: int = RECENT_EVENTS) -> None:
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)
        self._seq = 0
        self._lock = threading.Lock()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def _add(self, t: float, text: str) -> None:
        with self._lock:
            self._seq += 1
            self._events.append({"seq": self._seq, "t": t, "text": text})

    def on_state_change(self, event: StateChanged) -> None:
        self._add(event.t, f"{event.previous} -> {event.state} (attempt {event.attempt})")

    def on_fault_detected(self, event: FaultDetected) -> None:
        error = str(event.error).splitlines()[0] if event.error else ""
        ranks = format_ranks(event.ranks)
        self._add(event.t_detect, f"fault: {event.cause.value} on ranks {ranks} "
                                  f"at step {event.step or 0} (attempt {event.attempt}) {error}")

    def on_recovery_done(self, event: RecoveryDone) -> None:
        redone = "" if event.rollback_steps is None else f", {event.rollback_steps} steps redone"
        self._add(event.t, f"recovered from {event.cause.value} by {event.mechanism} in "
                           f"{event.recovery_s:.2f} s{redone}")

    def on_checkpoint_committed(self, event: CheckpointCommitted) -> None:
        self._add(event.t, f"checkpoint of step {event.step} committed")

    def on_checkpoint_dropped(self, event: CheckpointDropped) -> None:
        who = "" if event.rank is None else f" (rank {event.rank})"
        self._add(event.t, f"checkpoint of step {event.step} dropped{who}: {event.kind}")
