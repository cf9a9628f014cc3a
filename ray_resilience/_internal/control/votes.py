"""Gathering one node's save-round votes into one `vote_many` call to the commit coordinator.

The first rank of the node to vote in a round waits up to `GATHER_S` for its node's other ranks
(the ranks the agent has heard from in the newest attempt), then sends every vote gathered so
far in one call and hands each rank its own outcome. A rank that votes after the call left
starts the next gathering. The coordinator's calls and waiting threads then grow with nodes.
"""

from __future__ import annotations

import threading
from typing import Any

import ray

GATHER_S = 0.05
"""Longest a node's first voter waits for the node's other ranks before sending."""


class _Gathering:
    def __init__(self) -> None:
        self.votes: dict[int, tuple[bool, str, Any]] = {}
        self.sent = False
        self.full = threading.Event()
        self.done = threading.Event()
        self.results: dict[int, Any] = {}
        self.error: BaseException | None = None
        self.world_size: int | None = None


class VoteGatherer:
    """Thread-safe: one call per voting rank, each blocking until its outcome (or None: open)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], _Gathering] = {}
        self._ranks: dict[int, int] = {}
        """rank -> the newest attempt it sent a heartbeat in."""

    def seen(self, rank: int, attempt: int) -> None:
        self._ranks[rank] = max(attempt, self._ranks.get(rank, attempt))

    def _expected(self) -> int:
        newest = max(self._ranks.values(), default=0)
        return max(1, sum(1 for a in self._ranks.values() if a == newest))

    def vote(self, coordinator: Any, session: str, step: int, rank: int, ready: bool,
             plan_id: str, keys: Any, wait_s: float, timeout_s: float,
             world_size: int | None = None) -> Any:
        key = (session, step)
        with self._lock:
            gathering = self._open.get(key)
            leader = gathering is None
            if leader:
                gathering = self._open[key] = _Gathering()
            gathering.votes[rank] = (ready, plan_id, keys)
            gathering.world_size = world_size
            if len(gathering.votes) >= self._expected():
                gathering.full.set()
        if leader:
            self._send(coordinator, key, gathering, wait_s, timeout_s)
        elif not gathering.done.wait(timeout_s + wait_s):
            raise TimeoutError(f"no outcome for the node's votes in round {step}")
        if gathering.error is not None:
            raise gathering.error
        return gathering.results.get(rank)

    def _send(self, coordinator: Any, key: tuple[str, int], gathering: _Gathering,
              wait_s: float, timeout_s: float) -> None:
        gathering.full.wait(GATHER_S)
        with self._lock:
            gathering.sent = True
            if self._open.get(key) is gathering:
                del self._open[key]  # later voters start the next gathering
            votes = dict(gathering.votes)
        try:
            gathering.results = ray.get(coordinator.vote_many.remote(
                key[0], key[1], votes, wait_s, gathering.world_size), timeout=timeout_s)
        except BaseException as exc:  # noqa: BLE001 - every voter of this call sees it
            gathering.error = exc
        finally:
            gathering.done.set()
