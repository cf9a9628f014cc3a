"""The side thread that forwards a rank's progress: one fire-and-forget RPC per interval, also
when nothing changed (the heartbeat), to its node's agent or else to the supervisor. Each one
carries the activity counter (`liveness.py`): the training thread moved, reported or not.

Fire-and-forget while the attempt runs, but not past its end: `stop()` waits until the sink has
taken every beat sent, so what a rank reported (its steps, saves, start-up phases) is in its
agent before the attempt's outcome reaches the supervisor, whose final drain then finds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ray_resilience._internal.calls import unfinished, wait_finished
from ray_resilience.context import _Session

STOP_FLUSH_TIMEOUT_S = 2.0
"""How long `stop()` waits for beats in flight to reach the sink (a dead sink answers at once
with an error; a live one takes milliseconds)."""


class ProgressForwarder:
    """Sends `sink.heartbeat(...)` every `interval_s` until stopped (sink: the node agent or
    the supervisor; both take the same call)."""

    def __init__(self, supervisor: Any, session: _Session, *, rank: int, attempt: int,
                 interval_s: float, activity: Callable[[], int | None] = lambda: None) -> None:
        self._supervisor, self._session, self._activity = supervisor, session, activity
        self._rank, self._attempt, self._interval_s = rank, attempt, interval_s
        self._stop = threading.Event()
        self._in_flight: list[Any] = []
        self._thread = threading.Thread(
            target=self._loop, name=f"rr-progress-r{rank}-a{attempt}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.send()

    def send(self) -> None:
        metrics, step, step_time, saves, events = self._session.drain()
        try:
            ref = self._supervisor.heartbeat.remote(
                self._rank, self._attempt, step, step_time, metrics, saves, time.time(), events,
                self._activity())
        except Exception:  # noqa: BLE001 - supervisor gone: the run is being torn down
            return
        self._in_flight = [*unfinished(self._in_flight), ref]

    def stop(self) -> tuple[list[dict[str, Any]], int | None, float | None, list, list]:
        """Stops the thread, waits (up to STOP_FLUSH_TIMEOUT_S) until the sink has taken the
        beats already sent, and returns what was not sent yet (the caller sends it)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        wait_finished(self._in_flight, STOP_FLUSH_TIMEOUT_S)
        self._in_flight = []
        return self._session.drain(final=True)
