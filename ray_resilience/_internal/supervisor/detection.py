"""Fault detection for the supervisor: the three signals, each timed.

1. An exception reported by a rank (its run future returns a failed outcome).
2. Actor death: the rank's run future fails within milliseconds of the process dying (SIGKILL,
   OOM killer, segfault) or of Ray declaring its node dead; no polling involved.
3. Silence: progress that stops advancing for longer than the phase's timeout (hang), or a
   side thread that stops sending heartbeats at all (frozen process, lost node).

Detection reads what it is given and returns what it found; the supervisor records and acts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ray_resilience._internal.attempt import AttemptOutcome, RankLost
from ray_resilience._internal.constants import (
    DEFAULT_ERROR_GRACE_S,
    ERROR_GRACE_ENV_VAR,
    env_float,
)
from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.run_record import Clock
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.config import ResilienceConfig
from ray_resilience.errors import HangError, WorkerDiedError, WorkerError
from ray_resilience.policy.state import FaultCause
from ray_resilience.timeouts import LearnedTimeouts

log = logging.getLogger(__name__)

HANG_GRACE_S = 1.0
"""Ranks this close to their limit are reported with a hung one: a hung rank's peers block in
their next collective a moment before or after it stops moving."""
SILENCE_SCAN_PER_RANK_S = 250e-6
SILENCE_SCAN_MAX_S = 0.25
"""The silence scan is linear in ranks (~3 us each with the statuses' copy): above 200 ranks it
runs every `world x SILENCE_SCAN_PER_RANK_S` (at most every SILENCE_SCAN_MAX_S) instead of
every monitor interval, which bounds its cost to a few % of a core and adds at most that much to
a hang's detection (the limits are seconds). Deaths still come every monitor interval."""


class RunFutures(Protocol):
    """The worker group's side of detection (`WorkerGroup` through `RankCalls`)."""

    def wait(self, refs: list[Any], timeout_s: float, *, num_returns: int = 1) -> list[Any]: ...

    def outcome(self, ref: Any, rank: int) -> AttemptOutcome | RankLost: ...


@dataclasses.dataclass(frozen=True)
class Collected:
    """What one poll of the run futures found: the outcomes to record, the futures that are
    done (to drop), and the fault they revealed, if any."""

    outcomes: tuple[AttemptOutcome, ...] = ()
    done: tuple[Any, ...] = ()
    fault: DetectedFault | None = None


class FaultDetector:
    """Turns run futures and rank statuses into faults, for one run's configs and timeouts."""

    def __init__(self, group: RunFutures, cfg: ResilienceConfig, timeouts: LearnedTimeouts,
                 clock: Clock) -> None:
        self._group, self._cfg, self._timeouts, self._clock = group, cfg, timeouts, clock
        self._scanned_at = float("-inf")

    def silence_due(self, world_size: int) -> bool:
        """Whether the silence scan runs in this monitor interval (see SILENCE_SCAN_PER_RANK_S)."""
        every = min(SILENCE_SCAN_MAX_S, world_size * SILENCE_SCAN_PER_RANK_S)
        now = self._clock.monotonic()
        if every > self._cfg.monitor_interval_s and now - self._scanned_at < every:
            return False
        self._scanned_at = now
        return True

    def collect(self, futures: Mapping[Any, int], attempt: int) -> Collected:
        """Waits up to one monitor interval for a run future; returns what the done ones hold."""
        refs = list(futures)
        ready = self._group.wait(refs, self._cfg.monitor_interval_s)
        if ready:  # take everything that is done now, so simultaneous errors are grouped
            ready = self._group.wait(refs, 0, num_returns=len(refs))
        outcomes, lost = self._read(futures, ready)
        errors = [o for o in outcomes if o.error is not None]
        done, taken = list(ready), set(ready)
        rest = [ref for ref in refs if ref not in taken]
        if (lost or any(o.in_distributed for o in errors)) and rest:
            # A rank that dies, or whose collective fails, may be seeing a peer's failure (a
            # closed connection) before that peer's own outcome is here: a short grace lets the
            # root cause be the one reported. An error raised in the train function's own code
            # is the cause: no wait.
            more = self._group.wait(rest, env_float(ERROR_GRACE_ENV_VAR, DEFAULT_ERROR_GRACE_S),
                                    num_returns=len(rest))
            more_outcomes, more_lost = self._read(futures, more)
            outcomes, lost, done = outcomes + more_outcomes, lost + more_lost, done + list(more)
            errors = [o for o in outcomes if o.error is not None]
        fault = self._fault_of(errors, lost, attempt)
        return Collected(outcomes=tuple(outcomes), done=tuple(done), fault=fault)

    def _read(self, futures: Mapping[Any, int], ready: list[Any],
              ) -> tuple[list[AttemptOutcome], list[RankLost]]:
        outcomes: list[AttemptOutcome] = []
        lost: list[RankLost] = []
        for ref in ready:
            result = self._group.outcome(ref, futures[ref])
            if isinstance(result, RankLost):
                log.warning("rank %d died%s: %s", result.rank,
                            " with its node" if result.node_lost else "", result.detail)
                lost.append(result)
            else:
                outcomes.append(result)
        return outcomes, lost

    def _fault_of(self, errors: list[AttemptOutcome], lost: list[RankLost],
                  attempt: int) -> DetectedFault | None:
        now = self._clock.time()
        if lost:
            ranks = tuple(sorted(r.rank for r in lost))
            node_lost = any(r.node_lost for r in lost)
            why = "Ray declared its node dead" if node_lost else "the actor process exited"
            return DetectedFault(
                cause=FaultCause.NODE_LOST if node_lost else FaultCause.ACTOR_DIED, ranks=ranks,
                attempt=attempt, t_detect=now, error=WorkerDiedError(list(ranks), attempt, why))
        if errors:
            ordered = [o.error for o in sorted(errors, key=lambda o: o.failed_at or 0.0)]
            grouped = group_errors(ordered)
            return DetectedFault(cause=FaultCause.EXCEPTION, ranks=tuple(grouped.ranks),
                                 attempt=attempt, t_detect=now, error=grouped)
        return None

    def silence(self, statuses: Mapping[int, RankStatus], attempt: int) -> DetectedFault | None:
        """Hangs (no progress within the phase's timeout) and lost heartbeats."""
        now, in_job = self._clock.monotonic(), self._cfg.in_job
        pending = [s for s in statuses.values() if not s.done]
        lost = [s.rank for s in pending if in_job is not None and s.beating
                and now - s.heartbeat_at > in_job.heartbeat_timeout_s]
        if lost:
            assert in_job is not None
            err = HangError(lost, attempt, max(now - statuses[r].heartbeat_at for r in lost),
                            "InJobConfig.heartbeat_timeout_s", in_job.heartbeat_timeout_s)
            return DetectedFault(cause=FaultCause.UNRESPONSIVE, ranks=tuple(lost), attempt=attempt,
                                 t_detect=self._clock.time(), error=err)
        # Peers of a rank inside a long phase (validation) wait for it in their next collective:
        # while any rank is in a phase, the longest limit in force applies to every rank.
        # Linear in ranks (it runs up to every monitor interval): one limit per distinct phase.
        phases = {s.rank: _phase_of(s) for s in pending}
        limits = {p: (self._timeouts.limit(p[0]), p[1]) for p in set(phases.values())}
        group = max(limits.values(), default=(0.0, ""))
        in_phase = any(s.phase for s in pending)
        hung, near = [], []
        for s in pending:
            limit, setting = group if in_phase else limits[phases[s.rank]]
            silent = s.silent_for(now)
            if silent > limit - min(HANG_GRACE_S, limit / 2):
                (hung if silent > limit else near).append((s.rank, silent, setting, limit))
        if not hung:
            return None
        hung = sorted(hung + near)
        err = HangError([h[0] for h in hung], attempt, max(h[1] for h in hung),
                        hung[0][2], hung[0][3])
        return DetectedFault(cause=FaultCause.HANG, ranks=tuple(h[0] for h in hung),
                             attempt=attempt, t_detect=self._clock.time(), error=err)


def _phase_of(status: RankStatus) -> tuple[str, str]:
    """(timeout name, the setting that controls it) for where a rank is now."""
    if status.phase is not None:
        return status.phase, f"ResilienceConfig.phase_timeouts_s[{status.phase!r}]"
    if status.step is None:
        return "first_step", "ResilienceConfig.first_step_timeout_s"
    return "step", "ResilienceConfig.step_timeout_s"


def group_errors(errors: list[WorkerError]) -> WorkerError:
    """The earliest error, with the ranks of every identical error folded into it."""
    first = errors[0]
    ranks = sorted({r for e in errors if e.same_failure(first) for r in e.ranks})
    return WorkerError(ranks=ranks, attempt=first.attempt, exc_type=first.exc_type,
                       message=first.message, traceback=first.traceback, cause=first.cause)
