"""When a rank writes the local tier: every `local_interval_steps`, or under "auto" the shortest
interval whose measured cost stays within `local_overhead_budget` of step time.

Every rank must write the same steps (a restore needs a step every rank holds), so the interval
is agreed: at `load` from what the ranks measured in earlier attempts, else after a probe of
`LOCAL_PROBE_STEPS` steps (local writes at its 1st, 3rd and last step) with one small collective
at the same step on every rank. Writes then follow every `interval` steps from the step of the
decision, so a fault after it redoes at most `interval` steps. A write's cost is the training
thread's wait for it, plus on CPU ranks the CPU time of its background copy, checksum and write
(they share the cores). The interval is also never shorter than a write takes (wall time, in
steps): on GPU ranks the background work costs training nothing, but a write still holds its
snapshot slot until done, and the next local step would wait for it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import threading
import time
from typing import Any

from ray_resilience._internal.constants import (
    DEFAULT_LOCAL_PROBE_STEPS,
    LOCAL_PROBE_STEPS_ENV_VAR,
    env_float,
)
from ray_resilience.checkpoint.config import AUTO, CheckpointConfig

WARM_UP_STEPS = 2
"""Steps at the start of an attempt whose time is not taken as step time."""
PROBE_WRITES = (1, 3)
"""Steps of the probe (counted from the attempt's start) that write the local tier besides its
last: the first pays one-time allocations, the others are what later writes cost."""


@dataclasses.dataclass
class _Write:
    blocking_s: float = 0.0
    slot_wait_s: float = 0.0
    """The training thread's wait for the previous write to free a slot: not this write's
    cost (an interval that covers a write's wall time leaves none)."""
    background_s: float | None = None
    """CPU seconds of the copy, checksum and write (None until the write is done)."""
    wall_s: float = 0.0
    """Wall seconds from the write's start (its wait for the device copy included) to its end."""


class LocalSchedule:
    """One rank's local-tier schedule. Called from the training thread; `record_write` from the
    pipeline's threads."""

    def __init__(self, config: CheckpointConfig, *, rank: int) -> None:
        self.rank, self.budget = rank, config.local_overhead_budget
        self.fixed = None if config.local_interval_steps == AUTO else config.local_interval_steps
        self.interval: int | None = self.fixed
        """Steps between two local writes (0: off); None while an "auto" attempt probes."""
        self.off: str | None = None
        """Why this rank turned the tier off (agreed by every rank at the next decision)."""
        self.on_cpu = True
        self.state_bytes: int | None = None
        self._probe_steps = int(env_float(LOCAL_PROBE_STEPS_ENV_VAR, DEFAULT_LOCAL_PROBE_STEPS))
        self._start: int | None = None
        self._anchor = 0
        """Writes fall on `anchor + k * interval` (the step the interval was decided at)."""
        self._lock = threading.Lock()
        self._writes: dict[int, _Write] = {}
        self._step_s: collections.deque[float] = collections.deque(maxlen=64)
        self._last: tuple[int, float] | None = None
        self._seen = 0
        """Steps seen in this attempt."""
        self._events: list[dict[str, Any]] = []

    def begin_attempt(self, agreement: Any, resumed: int | None) -> None:
        """At `load`, on every rank: agrees on the interval from earlier attempts' costs (a
        respawned rank has none: its peers' count), else probes again from `resumed`."""
        self._start, self._last, self._seen = resumed, None, 0
        if self.fixed == 0:
            return
        gathered = agreement.gather((self._proposal(), self.off))
        off = next((why for _, why in gathered if why), None)
        proposals = [p for p, _ in gathered if p]
        if off is not None:
            self._decide(0, resumed, off=off)
        elif self.fixed is not None:
            self._decide(self.fixed, resumed)
        elif proposals:
            self._decide(max(proposals), resumed)
        else:
            self.interval = None

    def is_local_step(self, step: int) -> bool:
        if self.interval is not None:
            return self.interval > 0 and step > self._anchor \
                and (step - self._anchor) % self.interval == 0
        if self._start is None:
            self._start = step - 1
        into = step - self._start
        return (into in PROBE_WRITES or into == self._probe_steps) and self.off is None

    def after_step(self, step: int, *, agreement: Any, wait_idle: Any) -> None:
        """Records the step's wall time; at the end of a probe, agrees on the interval."""
        now = time.perf_counter()
        self._seen += 1
        # An attempt's first steps pay one-time costs (allocations, lazy imports); a step that
        # overlaps a write is slower by at most that write's cost, which the budget bounds.
        if self._last is not None and self._seen > WARM_UP_STEPS:
            self._step_s.append((now - self._last[1]) / max(1, step - self._last[0]))
        self._last = (step, now)
        if self.interval is None and self._start is not None \
                and step >= self._start + self._probe_steps:
            wait_idle()  # the probe's writes: their cost is the measurement
            gathered = agreement.gather((self._proposal(), self.off))
            off = next((why for _, why in gathered if why), None)
            proposals = [p for p, _ in gathered if p]
            self._decide(0 if off else max(proposals, default=self._probe_steps), step, off=off)

    def turn_off(self, why: str) -> None:
        """This rank cannot keep the tier (no room): it stops now, its peers at the next
        decision."""
        if self.off is None:
            self.off = why
        if self.interval is not None and self.fixed is None:
            self.interval = 0

    def record_blocking(self, step: int, seconds: float, *, slot_wait_s: float = 0.0) -> None:
        with self._lock:
            write = self._writes.setdefault(step, _Write())
            write.blocking_s += seconds
            write.slot_wait_s += slot_wait_s

    def record_write(self, step: int, background_s: float, wall_s: float = 0.0) -> None:
        with self._lock:
            write = self._writes.setdefault(step, _Write())
            write.background_s, write.wall_s = background_s, wall_s
            while len(self._writes) > 8:
                del self._writes[min(self._writes)]

    def _newest(self) -> _Write | None:
        with self._lock:
            done = [w for _, w in sorted(self._writes.items()) if w.background_s is not None]
        return done[-1] if done else None

    def cost_s(self) -> float | None:
        """What the newest complete write cost training."""
        newest = self._newest()
        if newest is None:
            return None
        return newest.blocking_s + (newest.background_s if self.on_cpu else 0.0)

    def write_wall_s(self) -> float | None:
        """How long the newest complete write held its slot."""
        newest = self._newest()
        return None if newest is None else newest.wall_s

    def slot_wait_s(self) -> float | None:
        """How long the newest complete write waited for a slot (left out of its cost)."""
        newest = self._newest()
        return None if newest is None else newest.slot_wait_s

    def step_s(self) -> float | None:
        return statistics.median(self._step_s) if self._step_s else None

    def _proposal(self) -> int | None:
        cost, step_s = self.cost_s(), self.step_s()
        if self.fixed is not None or cost is None or not step_s:
            return None
        within_budget = math.ceil(cost / (self.budget * step_s))
        keeps_up = math.ceil((self.write_wall_s() or 0.0) / step_s)
        return max(1, within_budget, keeps_up)

    def _decide(self, interval: int, step: int | None, *, off: str | None = None) -> None:
        self.interval, self.off, self._anchor = interval, off, step or 0
        self._events.append({
            "phase": "local_tier", "t_start": time.time(), "t_end": time.time(),
            "rank": self.rank, "interval_steps": interval,
            "mode": "fixed" if self.fixed is not None else AUTO, "decided_at_step": step,
            "cost_s": self.cost_s(), "write_wall_s": self.write_wall_s(),
            "slot_wait_s": self.slot_wait_s(),
            "step_s": self.step_s(), "budget": self.budget,
            "state_bytes": self.state_bytes, "on_cpu": self.on_cpu, "off": off})

    def take_events(self) -> list[dict[str, Any]]:
        """Decisions since the last call (each a "local_tier" event for the supervisor)."""
        taken, self._events = self._events, []
        return taken
