"""What the supervisor did and when: a callback in the supervisor sends the events the
benchmark times (state changes, faults detected, recoveries, steps) to a small `Probe` actor."""

from __future__ import annotations

import threading
from typing import Any

from ray_resilience.callbacks import (
    Callback,
    FaultDetected,
    RecoveryDone,
    StateChanged,
    StepCompleted,
)


class Probe:
    """Holds the events; the benchmark reads them with `since`."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._events.append(event)

    def since(self, index: int) -> list[dict[str, Any]]:
        with self._lock:
            return self._events[index:]


class ProbeCallback(Callback):
    """Forwards events to the probe (fire and forget: the supervisor never waits on it)."""

    def __init__(self, probe: Any) -> None:
        self._probe = probe

    def on_state_change(self, event: StateChanged) -> None:
        self._probe.add.remote({"hook": "state", "state": event.state, "attempt": event.attempt,
                                "t": event.t})

    def on_fault_detected(self, event: FaultDetected) -> None:
        self._probe.add.remote({"hook": "fault", "cause": event.cause.value,
                                "ranks": list(event.ranks)[:8], "t": event.t_detect})

    def on_recovery_done(self, event: RecoveryDone) -> None:
        self._probe.add.remote({"hook": "recovered", "attempt": event.attempt, "t": event.t})

    def on_step_completed(self, event: StepCompleted) -> None:
        self._probe.add.remote({"hook": "step", "step": event.step, "attempt": event.attempt,
                                "t": event.t})
