"""The coordinator's record of saves asked for and never committed, with why: ranks report what
they drop (torn, skipped, coalesced, a failed write), the coordinator what it cannot commit. The
supervisor reads it incrementally (`since`)."""

from __future__ import annotations

import collections
import threading
import time

from ray_resilience.callbacks import CheckpointDropped

MAX_KEPT = 1000
"""Entries kept per run; later ones are only counted (`total`)."""
MAX_KEYS = 10_000
"""(session, step, rank) keys remembered to report each save once."""


class DroppedSaves:
    """Thread-safe, bounded, in arrival order."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._lock = threading.Lock()
        self._entries: list[CheckpointDropped] = []
        self._seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self._max_kept = max_kept
        self.total = 0

    def add(self, session: str | None, step: int, rank: int | None, kind: str,
            reason: str) -> bool:
        """Records one lost save; False when (session, step, rank) was already recorded, or
        when the whole step was (rank None)."""
        with self._lock:
            if (session, step, rank) in self._seen or (session, step, None) in self._seen:
                return False
            self._seen[(session, step, rank)] = None
            while len(self._seen) > MAX_KEYS:
                self._seen.popitem(last=False)
            self.total += 1
            if len(self._entries) < self._max_kept:
                self._entries.append(CheckpointDropped(step=step, rank=rank, kind=kind,
                                                       reason=reason, t=time.time()))
            return True

    def since(self, cursor: int) -> tuple[list[CheckpointDropped], int, int]:
        """(entries from `cursor` on, the next cursor, the total so far)."""
        with self._lock:
            return self._entries[cursor:], len(self._entries), self.total

    def describe(self) -> list[dict[str, object]]:
        with self._lock:
            return [e.describe() for e in self._entries]
