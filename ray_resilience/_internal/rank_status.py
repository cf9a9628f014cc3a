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
    done: bool = False

    def reset(self, attempt: int) -> None:
        now = time.monotonic()
        self.attempt, self.progress_at, self.heartbeat_at, self.done = attempt, now, now, False
        self.step = None

    def observe(self, attempt: int, step: int | None, step_time: float | None) -> None:
        if attempt != self.attempt:
            return  # a late heartbeat from an earlier attempt
        now = time.monotonic()
        self.heartbeat_at = now
        if step is not None and step != self.step:
            self.step, self.step_time, self.progress_at = step, step_time, now

    def silent_for(self, now: float) -> float:
        return now - self.progress_at
