"""Delivery of run events to callbacks: queued from any thread, delivered on the state machine's.

Heartbeats arrive on other actor threads than the state machine; their events (steps, saves,
recoveries done) are queued with the state machine's own, and `flush` delivers them all in
order, one hook at a time, so no callback ever runs concurrently with another. A hook that
raises is logged (its first failure with the traceback) and never fails the run.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import Any

from ray_resilience.callbacks import Callback

log = logging.getLogger(__name__)


class Dispatcher:
    """Queues events (`emit`, thread-safe) and delivers them to `callbacks` (`flush`)."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)
        self._queue: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._failures: dict[tuple[int, str], int] = {}

    def emit(self, event: Any) -> None:
        """Queues `event` (a frozen event with a `hook` name); any thread may call it."""
        with self._lock:
            self._queue.append(event)

    def flush(self) -> None:
        """Delivers every queued event; call it from the state machine's thread only."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                event = self._queue.popleft()
            for callback in self.callbacks:
                self._deliver(callback, event)

    def _deliver(self, callback: Callback, event: Any) -> None:
        hook = getattr(callback, event.hook, None)
        if hook is None:  # an internal event the callback does not record
            return
        try:
            hook(event)
        except Exception:  # a callback must never fail the run
            key = (id(callback), event.hook)
            self._failures[key] = self._failures.get(key, 0) + 1
            if self._failures[key] == 1:
                log.exception("callback %s.%s failed (ignored; later failures of this hook are "
                              "counted, not logged)", type(callback).__name__, event.hook)

    def failures(self) -> dict[str, int]:
        """Failed hook calls so far, by "CallbackClass.hook"."""
        names = {id(c): type(c).__name__ for c in self.callbacks}
        return {f"{names.get(cid, '?')}.{hook}": n for (cid, hook), n in self._failures.items()}
