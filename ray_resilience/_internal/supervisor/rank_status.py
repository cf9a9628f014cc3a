"""Per-rank progress as the supervisor sees it (heartbeats and attempt outcomes)."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class RankStatus:
    rank: int
    attempt: int = 0
    step: int | None = None
    step_time: float | None = None
    """Worker wall time when `step` was reported."""
    progress_at: float = dataclasses.field(default_factory=time.monotonic)
    """Supervisor monotonic time when progress last advanced (or the attempt started)."""
    heartbeat_at: float = dataclasses.field(default_factory=time.monotonic)
    beating: bool = False
    """A heartbeat of this attempt arrived: only then can the heartbeat stop (before it, the
    rank is starting, its node's agent may be too, and the first-step timeout applies)."""
    done: bool = False
    phase: str | None = None
    """User-marked phase the rank reported being in (its timeout applies), or None."""
    phase_seen_at: float = 0.0
    """Supervisor monotonic time when the rank was first seen entering or leaving `phase`."""
    phase_sent_at: float = 0.0
    """Worker send time of the heartbeat `phase` came from: heartbeats are fire-and-forget calls
    into a threaded actor and may be handled out of order; an older one must not undo a newer."""
    activity: int | None = None
    """The rank's activity counter (bumped while its training thread moves), as last reported."""
    active_at: float = 0.0
    """Supervisor monotonic time the activity counter last changed: liveness between reports."""

    def copy(self) -> RankStatus:
        """A shallow copy (detection reads copies without the record's lock); cheaper than
        `dataclasses.replace`, which matters at thousands of ranks every monitor interval."""
        twin = object.__new__(RankStatus)
        twin.__dict__.update(self.__dict__)
        return twin

    def reset(self, attempt: int, now: float) -> None:
        self.attempt, self.progress_at, self.heartbeat_at, self.done = attempt, now, now, False
        self.step, self.beating = None, False
        self.phase, self.phase_sent_at = None, 0.0
        self.activity, self.active_at = None, now

    def excuse(self, now: float) -> None:
        """Silence so far is not the rank's (its heartbeat path was down): clocks start over."""
        self.heartbeat_at = self.active_at = now

    def observe(self, attempt: int, step: int | None, step_time: float | None,
                now: float | None = None, activity: int | None = None) -> None:
        if attempt != self.attempt:
            return  # a late heartbeat from an earlier attempt
        now = time.monotonic() if now is None else now
        # `now` is when the beat reached its node agent: batches of different agents, and a
        # rank's beats after an agent restart, may arrive out of that order.
        self.heartbeat_at, self.beating = max(self.heartbeat_at, now), True
        if activity is not None and activity != self.activity:
            self.activity, self.active_at = activity, max(self.active_at, now)
        # Steps only grow within an attempt (a rollback is a new attempt): a late heartbeat with
        # an older step is neither progress nor a step back.
        if step is not None and (self.step is None or step > self.step):
            self.step, self.step_time, self.progress_at = step, step_time, now

    def set_phase(self, phase: str | None, sent_at: float, now: float | None = None) -> None:
        """The phase a heartbeat sent at `sent_at` (worker clock) reported; older ones are
        ignored."""
        if sent_at < self.phase_sent_at:
            return
        self.phase_sent_at = sent_at
        if phase != self.phase:
            self.phase, self.phase_seen_at = phase, time.monotonic() if now is None else now

    def silent_for(self, now: float) -> float:
        """Time without progress: no new step and a training thread that did not move.
        Entering or leaving a phase restarts the clock too (a rank just out of a long
        validation has a whole step timeout for its next step)."""
        return now - max(self.progress_at, self.phase_seen_at, self.active_at)
