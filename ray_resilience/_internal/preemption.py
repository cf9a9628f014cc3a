"""Preemption: a node hosting ranks is being drained (its `ray start` got SIGTERM, as when
Kubernetes evicts the pod on a spot reclaim or a scale-down; or the autoscaler drains it), or a
rank's own process got SIGTERM. Every rank then saves one agreed step, waits until it is
durable and leaves its train function; the supervisor moves the drained node's ranks elsewhere
and the run resumes from that step, with no step trained twice.

The agreed step is a little ahead of the newest step any rank reported, so that every rank
hears of it before reaching it (ranks are at most a step apart: they meet in collectives).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
"""How often the supervisor asks the GCS which nodes are draining."""
NOTICE_LATENCY_S = 1.0
"""Time allowed for the stop request to reach every rank; the agreed step leaves this much."""
DEFAULT_GRACE_S = 30.0
"""Deadline of a notice that came without one (Ray's own SIGTERM drain waits 30 s)."""


@dataclasses.dataclass(frozen=True)
class Notice:
    """One preemption being handled: where, which ranks, the step they save, the deadline."""

    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    """Ranks that must move (on the draining nodes, or whose process got SIGTERM)."""
    step: int
    """Every rank saves this step and stops after it."""
    deadline: float
    """Wall time by which the save must be durable (the drain's deadline)."""
    t_notice: float
    attempt: int


def stop_step(newest_step: int, step_time_s: float | None) -> int:
    """The step every rank can still reach after hearing of the stop: the newest reported step
    plus the steps that fit in `NOTICE_LATENCY_S`, plus one (ranks are a step apart)."""
    ahead = math.ceil(NOTICE_LATENCY_S / step_time_s) if step_time_s else 1
    return newest_step + 1 + max(1, ahead)


class PreemptionWatch:
    """Turns drain notices (polled from the GCS) and ranks' SIGTERMs into one `Notice` at a
    time; `stopped` collects the ranks that saved the step and left their train function."""

    def __init__(self, poll_interval_s: float = POLL_INTERVAL_S) -> None:
        self.poll_interval_s = poll_interval_s
        self.notice: Notice | None = None
        self.stopped: set[int] = set()
        self._next_poll = 0.0
        self._sigterm: dict[int, float] = {}
        """Ranks whose process got SIGTERM -> when; handled at the next check."""

    def rank_terminated(self, rank: int) -> None:
        """A rank's process got SIGTERM (a control call: any thread)."""
        self._sigterm.setdefault(rank, time.time())

    def check(self, group: Any, attempt: int, newest_step: int,
              step_time_s: float | None) -> Notice | None:
        """A new notice when a node hosting ranks started draining or a rank got SIGTERM (the
        caller then asks the ranks to stop at `notice.step`); None otherwise."""
        if self.notice is not None:
            return None
        now = time.monotonic()
        draining: dict[str, float] = {}
        if now >= self._next_poll:
            self._next_poll = now + self.poll_interval_s
            draining = group.draining_nodes()
        if not draining and not self._sigterm:
            return None  # the common case, every monitor interval: nothing scanned per rank
        rank_nodes = {r: group.node_of_rank(r) for r in range(group.world_size)}
        nodes = sorted({n for n in rank_nodes.values() if n in draining})
        ranks = sorted({r for r, n in rank_nodes.items() if n in draining} | set(self._sigterm))
        if not ranks:
            return None
        t = time.time()
        deadlines = [draining[n] for n in nodes if draining[n]] or [t + DEFAULT_GRACE_S]
        self.notice = Notice(nodes=tuple(nodes), ranks=tuple(ranks),
                             step=stop_step(newest_step, step_time_s), deadline=min(deadlines),
                             t_notice=t, attempt=attempt)
        self.stopped.clear()
        log.warning("preemption: nodes %s draining, ranks %s terminating (deadline in %.0f s): "
                    "every rank saves step %d and stops", nodes, ranks,
                    self.notice.deadline - t, self.notice.step)
        return self.notice

    def note_outcomes(self, outcomes: Iterable[Any]) -> None:
        self.stopped.update(o.rank for o in outcomes if o.status == "preempted")

    def take(self) -> Notice | None:
        """The notice, once the ranks stopped for it (the repair starts); clears it."""
        notice, self.notice = self.notice, None
        if notice is not None:
            for rank in notice.ranks:
                self._sigterm.pop(rank, None)
        return notice
