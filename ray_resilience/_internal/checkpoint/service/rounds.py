"""Save rounds: which step every rank hands to its writer.

A rank votes ready once its snapshot is complete and its writer idle; a round is claimed when
every rank of the session voted ready, and only then does every rank hand the step off. A rank
votes in step order and may pass over rounds it gave up (one call for a run of them): its vote in
a later round counts as "not ready" in every earlier round it did not vote in, open or opened
later.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MAX_ROUNDS_KEPT = 256
"""Resolved rounds remembered per session (ranks fetch their result right after resolution)."""


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What one rank learns about one round."""

    claimed: bool
    reason: str
    """"claimed", "not ready: ranks [..]", "rank r gave up: ..", "session ended", "plan unknown"."""
    owned: tuple[bool, ...] | None = None
    """When claimed: for each of the asking rank's items, whether it writes that item."""
    not_ready: tuple[int, ...] = ()
    """When ranks voted not ready: which (each of them reports why it dropped the save)."""


@dataclasses.dataclass
class _Round:
    votes: dict[int, tuple[bool, str]] = dataclasses.field(default_factory=dict)
    """rank -> (ready, plan id)."""
    outcome: tuple[bool, str] | None = None
    owners: list[list[bool]] | None = None
    not_ready: tuple[int, ...] = ()


class RoundTable:
    """The rounds of the current session."""

    def __init__(self) -> None:
        self.session: str | None = None
        self.world_size = 0
        self._rounds: dict[int, _Round] = {}
        self._plans: dict[int, dict[str, list[tuple[str, int]]]] = {}
        self._owners: dict[tuple[str, ...], list[list[bool]]] = {}
        self._latest: dict[int, int] = {}
        """rank -> the newest step it voted in this session."""

    def begin(self, session: str, world_size: int) -> None:
        """A new attempt: every round of the previous session ends unclaimed."""
        self.session, self.world_size = session, world_size
        self._rounds, self._plans, self._owners, self._latest = {}, {}, {}, {}

    def vote(self, session: str, step: int, rank: int, *, ready: bool, plan_id: str,
             keys: list[tuple[str, int]] | None) -> None:
        """Records `rank`'s vote in round `step`; `keys` travel once per plan and session."""
        if session != self.session:
            return
        if keys is not None:
            self._plans.setdefault(rank, {})[plan_id] = list(keys)
        self._latest[rank] = max(step, self._latest.get(rank, step))
        for earlier, rnd in self._rounds.items():
            if earlier < step and rnd.outcome is None and rank not in rnd.votes:
                self._passed_over(rnd, rank)
                if len(rnd.votes) >= self.world_size:
                    self._resolve(rnd)
        rnd = self._rounds.setdefault(step, _Round())
        if rnd.outcome is None:
            rnd.votes[rank] = (bool(ready), plan_id)
            for other, latest in self._latest.items():
                if latest > step and other not in rnd.votes:
                    self._passed_over(rnd, other)
            if len(rnd.votes) >= self.world_size:
                self._resolve(rnd)
        self._forget_old()

    def _passed_over(self, rnd: _Round, rank: int) -> None:
        """`rank` voted in a later round without voting in `rnd`: it gave that step up (and says
        why itself)."""
        rnd.votes[rank] = (False, "")

    def vote_many(self, session: str, step: int,
                  votes: dict[int, tuple[bool, str, list[tuple[str, int]] | None]]) -> None:
        """The votes of one node's ranks in round `step`: rank -> (ready, plan id, keys)."""
        for rank, (ready, plan_id, keys) in sorted(votes.items()):
            self.vote(session, step, rank, ready=ready, plan_id=plan_id, keys=keys)

    def withdraw(self, session: str, step: int, rank: int, why: str) -> None:
        """`rank` gave up waiting on round `step`: if still open, it ends unclaimed."""
        rnd = self._rounds.get(step) if session == self.session else None
        if rnd is not None and rnd.outcome is None:
            rnd.outcome = (False, f"rank {rank} gave up: {why}")

    def result(self, session: str, step: int, rank: int) -> RoundResult | None:
        """The round's outcome for `rank`; None while it is open."""
        if session != self.session:
            return RoundResult(False, "session ended")
        rnd = self._rounds.get(step)
        if rnd is None:
            return RoundResult(False, "round unknown (forgotten or never opened)")
        if rnd.outcome is None:
            return None
        claimed, reason = rnd.outcome
        if not claimed:
            return RoundResult(False, reason, not_ready=rnd.not_ready)
        return RoundResult(True, reason, tuple(rnd.owners[rank]))

    def waiting_for(self, session: str, step: int) -> list[int]:
        """Ranks that have not voted in an open round (for the waiting ranks' warnings)."""
        rnd = self._rounds.get(step) if session == self.session else None
        if rnd is None or rnd.outcome is not None:
            return []
        return [r for r in range(self.world_size) if r not in rnd.votes]

    def _resolve(self, rnd: _Round) -> None:
        not_ready = sorted(r for r, (ready, _) in rnd.votes.items() if not ready)
        if not_ready:
            rnd.outcome, rnd.not_ready = (False, f"not ready: ranks {not_ready}"), tuple(not_ready)
            return
        plan_ids = tuple(rnd.votes[r][1] for r in range(self.world_size))
        owners = self._owners.get(plan_ids)
        if owners is None:
            try:
                keys = [self._plans[r][pid] for r, pid in enumerate(plan_ids)]
            except KeyError:
                rnd.outcome = (False, "plan unknown")
                return
            owners = self._owners[plan_ids] = assign_owners(keys)
        rnd.owners, rnd.outcome = owners, (True, "claimed")

    def _forget_old(self) -> None:
        while len(self._rounds) > MAX_ROUNDS_KEPT:
            self._rounds.pop(min(self._rounds))

    def open_rounds(self) -> dict[int, Any]:
        """Open rounds and who voted, for `stats()`."""
        return {step: sorted(r.votes) for step, r in self._rounds.items() if r.outcome is None}


def assign_owners(keys_by_rank: list[list[tuple[str, int]]]) -> list[list[bool]]:
    """Which rank writes each item: an item held by several ranks goes to the holder with the
    fewest bytes so far (ties: the lowest rank); deterministic on every rank."""
    holders: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    for rank, keys in enumerate(keys_by_rank):
        for key, nbytes in keys:
            holders.setdefault(key, []).append(rank)
            sizes[key] = nbytes
    load = [0] * len(keys_by_rank)
    owner: dict[str, int] = {}
    for key in sorted(holders, key=lambda k: (len(holders[k]) > 1, -sizes[k], k)):
        chosen = min(holders[key], key=lambda r: (load[r], r))
        owner[key] = chosen
        load[chosen] += sizes[key]
    return [[owner[key] == rank for key, _ in keys] for rank, keys in enumerate(keys_by_rank)]
