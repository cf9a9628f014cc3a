"""A rank's saves that will never be committed, reported to the commit coordinator with why (what
`Result.checkpoint["dropped"]` lists); `flush` waits for the reports before the run ends."""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

logger = logging.getLogger(__name__)
PRUNE_AT = 16
"""Pending reports checked for completion once there are this many."""


class DropReporter:
    """Fire-and-forget reports from the rank's checkpoint threads (never the training thread's
    time: a report is one queued call)."""

    def __init__(self, rank: int, coordinator: Any) -> None:
        self.rank, self._coordinator = rank, coordinator
        self._lock = threading.Lock()
        self._pending: list[Any] = []

    def report(self, session: str, step: int, kind: str, reason: str) -> None:
        # Info: what caused it was warned about where it happened; the driver sums them up.
        logger.info("rank %d: checkpoint of step %d will not be committed (%s): %s", self.rank,
                    step, kind, reason)
        try:
            ref = self._coordinator.save_dropped.remote(session, step, self.rank, kind, reason)
        except Exception as exc:  # noqa: BLE001 - the coordinator is gone: the run is ending
            logger.warning("rank %d: could not report it (%s)", self.rank, exc)
            return
        with self._lock:
            self._pending.append(ref)
            if len(self._pending) >= PRUNE_AT:
                _, self._pending = ray.wait(self._pending, num_returns=len(self._pending),
                                            timeout=0)

    def flush(self, timeout_s: float) -> bool:
        """Waits until the coordinator has every report; False on timeout."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return True
        _, left = ray.wait(pending, num_returns=len(pending), timeout=max(timeout_s, 0.0))
        with self._lock:
            self._pending = left + self._pending
        return not left
