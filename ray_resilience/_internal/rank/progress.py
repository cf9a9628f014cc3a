"""The side thread that forwards a rank's progress to the supervisor: one fire-and-forget RPC per
interval, also when nothing changed (the heartbeat).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ray_resilience.context import _Session


class ProgressForwarder:
    """Sends `supervisor.heartbeat(...)` every `interval_s` until stopped."""

    def __init__(self, supervisor: Any, session: _Session, *, rank: int, attempt: int,
                 interval_s: float) -> None:
        self._supervisor, self._session = supervisor, session
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
                self._rank, self._attempt, step, step_time, metrics, saves, time.time(), events)
        except Exception:  # noqa: BLE001 - supervisor gone: the run is being torn down
            pass

    def stop(self) -> tuple[list[dict[str, Any]], int | None, float | None, list, list]:
        """Stops the thread and returns what it had not sent yet (the caller sends it)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        return self._session.drain(final=True)
