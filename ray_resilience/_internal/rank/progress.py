"""The side thread that forwards a rank's progress: one fire-and-forget RPC per interval, also
when nothing changed (the heartbeat), to its node's agent or else to the supervisor. Each one
carries the activity counter (`liveness.py`): the training thread moved, reported or not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ray_resilience.context import _Session


class ProgressForwarder:
    """Sends `sink.heartbeat(...)` every `interval_s` until stopped (sink: the node agent or
    the supervisor; both take the same call)."""

    def __init__(self, supervisor: Any, session: _Session, *, rank: int, attempt: int,
                 interval_s: float, activity: Callable[[], int | None] = lambda: None) -> None:
        self._supervisor, self._session, self._activity = supervisor, session, activity
        self._rank, self._attempt, self._interval_s = rank, attempt, interval_s
        self._stop = threading.Event()
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
            self._supervisor.heartbeat.remote(
                self._rank, self._attempt, step, step_time, metrics, saves, time.time(), events,
                self._activity())
        except Exception:  # noqa: BLE001 - supervisor gone: the run is being torn down
            pass

    def stop(self) -> tuple[list[dict[str, Any]], int | None, float | None, list, list]:
        """Stops the thread and returns what it had not sent yet (the caller sends it)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        return self._session.drain(final=True)
