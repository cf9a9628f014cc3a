"""Durable-shard reports in, steps committed in the order they became complete.

A report is registered the moment it arrives (from a plain header), so a complete step is never
skipped as older than a commit that overtook it while DCP was still importing.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

Key = tuple[str, int]
"""(session, step)."""


class CommitQueue:
    """Bookkeeping of arrived shards and the FIFO of complete steps; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._arrived: dict[Key, dict[int, Any]] = {}
        self._complete: collections.deque[tuple[Key, dict[int, Any]]] = collections.deque()
        self._committing: Key | None = None

    def arrive(self, session: str, step: int, rank: int, world_size: int, report: Any) -> bool:
        """Registers `rank`'s durable shard of `step`; True when that completed (and queued) it."""
        key = (session, step)
        with self._lock:
            shards = self._arrived.setdefault(key, {})
            shards[rank] = report
            if len(shards) < world_size:
                return False
            del self._arrived[key]
            self._complete.append((key, shards))
            return True

    def drain(self, commit: Callable[[Key, dict[int, Any]], None]) -> None:
        """Commits queued steps from the head until none is left, one thread at a time."""
        with self._commit_lock:
            while True:
                with self._lock:
                    if not self._complete:
                        return
                    key, shards = self._complete.popleft()
                    self._committing = key
                try:
                    commit(key, shards)
                finally:
                    with self._lock:
                        self._committing = None

    def keep_only(self, session: str) -> list[tuple[Key, list[int]]]:
        """A new session began: drops what older sessions reported and has not begun to commit;
        returns the dropped steps with the ranks that had reported."""
        with self._lock:
            dropped = [(k, sorted(v)) for k, v in self._arrived.items() if k[0] != session]
            dropped += [(k, sorted(v)) for k, v in self._complete if k[0] != session]
            self._arrived = {k: v for k, v in self._arrived.items() if k[0] == session}
            self._complete = collections.deque(e for e in self._complete if e[0][0] == session)
            return dropped

    def busy(self) -> bool:
        """A complete step waits for, or is in, its commit."""
        with self._lock:
            return bool(self._complete) or self._committing is not None

    def pending(self) -> dict[str, list[int] | str]:
        """For stats: "session:step" -> the ranks reported so far, or "queued" / "committing"."""
        with self._lock:
            out: dict[str, list[int] | str] = {f"{s}:{st}": sorted(r)
                                               for (s, st), r in self._arrived.items()}
            out.update({f"{s}:{st}": "queued" for (s, st), _ in self._complete})
            if self._committing is not None:
                s, st = self._committing
                out[f"{s}:{st}"] = "committing"
            return out
