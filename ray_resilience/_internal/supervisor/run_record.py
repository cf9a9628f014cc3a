"""The supervisor's record of the run: rank statuses, global steps, saves, recent metrics.

Everything here is fed from progress batches (`ProgressBatch`: a node agent's, or one rank's
heartbeat or attempt outcome) and from the supervisor's own detections. Memory is bounded: the
full per-step record goes to the run's metrics log; only rank 0's newest reports and a bounded
list of timed phases stay here. What happened is also emitted as events (steps, saves, recoveries
done) for the callbacks. Thread-safe: batches arrive on other actor threads than the state machine.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from ray_resilience._internal.attempt import AttemptOutcome
from ray_resilience._internal.control.batch import BatchOrder, ProgressBatch, ProgressFolder
from ray_resilience._internal.control.metrics_log import MetricsLog
from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.recorders import RecoveryPhase
from ray_resilience._internal.supervisor.state import DetectedFault
from ray_resilience.callbacks import CheckpointSaved, RecoveryDone, StepCompleted

RECENT_REPORTS = 1_000
"""Rank 0's newest metric dicts the supervisor keeps (the status display, `Result.metrics`)."""
MAX_PHASES_KEPT = 10_000
"""Newest timed phases and checkpoint loads kept (`Result.checkpoint`'s phases and loads)."""


class Clock:
    """The supervisor's time: `time()` stamps events, `monotonic()` measures silences and
    deadlines. Unit tests pass one they advance themselves."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


_TIER_DISTANCE = (None, "local", "memory", "replica", "storage")
"""The timeline's checkpoint tiers from the nearest to the farthest (None: nothing loaded)."""


def tier_read(load: dict[str, Any]) -> str | None:
    """The tier a rank's load read: "replica" for a memory load from another writer's copy."""
    tier = load.get("tier")
    if tier == "memory" and load.get("replica"):
        return "replica"
    return tier


def _distance(tier: str | None) -> int:
    """How far `tier` is (a tier this record does not know counts as the farthest)."""
    return _TIER_DISTANCE.index(tier) if tier in _TIER_DISTANCE else len(_TIER_DISTANCE)


class RunRecord:
    """Aggregates per-rank reports into global steps and emits what they complete."""

    def __init__(self, world_size: int, *, emit: Callable[[Any], None] = lambda event: None,
                 timeouts: Any = None, clock: Clock | None = None,
                 metrics_log: MetricsLog | None = None) -> None:
        self.world_size = world_size
        self.emit = emit
        self.timeouts = timeouts
        """LearnedTimeouts fed with every interval observed, or None."""
        self.clock = clock or Clock()
        self.ranks = {r: self._new_status(r) for r in range(world_size)}
        self.returns: dict[int, bytes | None] = {}
        """What each finished rank's train function returned (pickled)."""
        self.launched_at: dict[int, float] = {}
        self.metrics_log = metrics_log
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_REPORTS)
        """Rank 0's newest metric dicts, with "attempt"."""
        self.num_reports = 0
        self.num_batches = 0
        self._direct = ProgressFolder("direct")
        self._order = BatchOrder()
        """Folds each node agent's batches in the order it sent them."""
        """Folds heartbeats sent straight to the supervisor, and attempt outcomes."""
        self.lock = threading.RLock()
        self._pending: dict[tuple[int, int], tuple[set[int], float]] = {}
        """(attempt, step) -> the ranks that reported it and their newest report time, until
        every rank has."""
        self._saves: dict[tuple[int, int, str | None], tuple[int, float, float]] = {}
        self.global_step: int | None = None
        self.first_step_by_attempt: dict[int, tuple[int, float]] = {}
        self.reached_by_attempt: dict[int, int] = {}
        """The newest step any rank reported per attempt. Progress for restart-storm limits: a
        rank can only finish a step its peers took part in (its collectives), and when a rank
        fails right after a report, its peers' reports of that step may still be in flight."""
        self._recovering: dict[int, tuple[DetectedFault, str]] = {}
        """attempt -> the fault it recovers from and how, until its first step completes."""
        self._recovery_loads: dict[int, list[dict[str, Any]]] = {}
        """attempt -> the loads its ranks reported so far while it recovers, until every rank
        has (or its first step completes): the recovery's load phase spans all of them."""
        self._load_done: set[int] = set()
        self.phases: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PHASES_KEPT)
        """The newest timed phases: the supervisor's start-up phases, each new rank process's
        (process_start, imports, prewarm) and each attempt's (release_groups,
        init_process_group, checkpoint_load, user phases)."""
        self.loads: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PHASES_KEPT)
        """The newest checkpoint loads ranks reported (attempt, rank, tier, step, seconds)."""
        self.local_tier: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=MAX_PHASES_KEPT)
        """The newest local-tier interval decisions ranks reported (`LocalSchedule`)."""

    # --- rank statuses ------------------------------------------------------------------------

    def _new_status(self, rank: int) -> RankStatus:
        now = self.clock.monotonic()
        return RankStatus(rank, progress_at=now, heartbeat_at=now)

    def heartbeat(self, rank: int, attempt: int, step: int | None, step_time: float | None,
                  metrics: list[dict[str, Any]], saves: list, sent_at: float,
                  events: list[dict[str, Any]], activity: int | None = None) -> None:
        """One rank's periodic progress sent straight to the supervisor (no node agent)."""
        with self.lock:
            self._direct.add(rank, attempt, step, step_time, metrics, saves, sent_at, events,
                             activity)
            self.fold(self._direct.take())

    def fold(self, batch: ProgressBatch) -> None:
        """One node's progress of one interval (see `ProgressBatch`), folded after the
        batches its agent sent before it (`BatchOrder`)."""
        with self.lock:
            for ready in self._order.arrive(batch, self.clock.monotonic()):
                self._fold(ready)

    def release_parked(self) -> None:
        """Folds the batches still waiting for an earlier one of their agent (the supervisor's
        drain: the earlier one is not coming before the attempt or the run closes)."""
        with self.lock:
            for batch in self._order.release():
                self._fold(batch)

    def _fold(self, batch: ProgressBatch) -> None:
        with self.lock:
            now = self.clock.monotonic()
            self.num_batches += 1
            for beat in batch.beats:
                status = self.ranks.get(beat.rank)
                if status is None:  # a late beat of a rank the world no longer has
                    continue
                seen = now - beat.age  # when its agent got it
                status.observe(beat.attempt, beat.step, beat.step_time, seen, beat.activity)
                if beat.attempt == status.attempt:
                    status.set_phase(beat.phase, beat.sent_at, seen)
            for name, (count, worst) in batch.intervals.items():
                if self.timeouts is not None:
                    self.timeouts.observe_many(name, count, worst)
            for attempt, ev in batch.events:
                self._add_event(attempt, ev)
            self._add_recent(batch.rank0)
            self.num_reports += batch.num_reports
            if self.metrics_log is not None:
                self.metrics_log.append(batch.log)
            for attempt, step in batch.reached.items():
                self.note_reached(attempt, step)
            for (attempt, step), (ranks, t) in sorted(batch.steps.items()):
                self._add_step_reports(attempt, step, ranks, t)
            for attempt, saves, t in batch.saves:
                self.add_saves(attempt, saves, t)

    def add_outcome(self, outcome: AttemptOutcome) -> None:
        """Folds one rank's attempt outcome in (its last metrics, its return value)."""
        with self.lock:
            status = self.ranks[outcome.rank]
            status.observe(outcome.attempt, outcome.last_step, outcome.last_step_time,
                           self.clock.monotonic())
            status.done = outcome.status == "finished"
            # Its newest step, even if the heartbeat that carried it is still in flight.
            self.note_reached(outcome.attempt, outcome.last_step)
            self._direct.add(outcome.rank, outcome.attempt, None, None, outcome.metrics, [],
                             self.clock.time(), outcome.events)
            self.fold(self._direct.take())
            self.add_saves(outcome.attempt, outcome.checkpoint_saves, self.clock.time())
            if outcome.status == "finished":
                self.returns[outcome.rank] = outcome.return_value

    def add_reports(self, attempt: int, records: list[dict[str, Any]]) -> None:
        """Metric dicts from ranks of `attempt`; a step completes when every rank reported it."""
        with self.lock:
            self._direct.add_reports(attempt, records)
            self.fold(self._direct.take())

    def excuse(self, ranks: list[int]) -> None:
        """`ranks` lost their heartbeat path through no fault of theirs (their node agent
        restarted): their silence clocks start over."""
        with self.lock:
            now = self.clock.monotonic()
            for rank in ranks:
                if rank in self.ranks:
                    self.ranks[rank].excuse(now)

    def heartbeat_age(self, rank: int, now: float) -> float:
        """Seconds since `rank`'s side thread was last heard of (`now`: `clock.monotonic()`)."""
        with self.lock:
            return now - self.ranks[rank].heartbeat_at

    def newest_step(self) -> int:
        """The newest step any rank reported in its current attempt (else the global step);
        read every monitor interval, so without copying the statuses."""
        with self.lock:
            return max((s.step for s in self.ranks.values() if s.step is not None),
                       default=self.global_step or 0)

    def rank_statuses(self) -> dict[int, RankStatus]:
        """Copies of the statuses as of now (detection reads them without the lock)."""
        with self.lock:
            return {r: s.copy() for r, s in self.ranks.items()}

    def start_attempt(self, attempt: int) -> None:
        """Every rank starts `attempt` now: silence clocks restart."""
        with self.lock:
            for status in self.ranks.values():
                status.reset(attempt, self.clock.monotonic())
            self.launched_at[attempt] = self.clock.time()
            # Steps and saves of older attempts that never completed never will.
            self._pending = {k: v for k, v in self._pending.items() if k[0] >= attempt}
            self._saves = {k: v for k, v in self._saves.items() if k[0] >= attempt}
            self._recovery_loads = {a: v for a, v in self._recovery_loads.items() if a >= attempt}

    def resize(self, world_size: int) -> None:
        """The world shrank: ranks are renumbered, so statuses and return values start over."""
        with self.lock:
            self.world_size = world_size
            self.ranks = {r: self._new_status(r) for r in range(world_size)}
            self.returns.clear()

    # --- reports, steps, saves ----------------------------------------------------------------

    def expect_recovery(self, attempt: int, fault: DetectedFault, mechanism: str) -> None:
        """`attempt` recovers from `fault` (by `mechanism`) until its first step completes."""
        with self.lock:
            self._recovering[attempt] = (fault, mechanism)

    def recovering(self, attempt: int) -> bool:
        """Whether `attempt` recovers from a fault and has not completed a step yet: its first
        completed step says where the recovery resumed, so its reports must fold in order."""
        with self.lock:
            return attempt in self._recovering

    def _add_event(self, attempt: int, ev: dict[str, Any]) -> None:
        """A timed phase reported by a rank; the first checkpoint load of a recovery is emitted."""
        if ev.get("phase") == "local_tier":
            self.local_tier.append({**ev, "attempt": attempt})
            return
        self.phases.append({**ev, "attempt": attempt})
        if ev.get("phase") != "checkpoint_load":
            return
        self.loads.append({**ev, "attempt": attempt})
        if attempt not in self._recovering or attempt in self._load_done:
            return
        loads = self._recovery_loads.setdefault(attempt, [])
        loads.append(ev)
        if len({load.get("rank") for load in loads}) >= self.world_size:
            self._emit_recovery_load(attempt)

    def _emit_recovery_load(self, attempt: int) -> None:
        """The recovery's checkpoint_load phase: from the first rank's start to the last
        rank's end (the first step waits for every rank), with the farthest tier any rank
        read ("replica" where it read another writer's copy of its shard)."""
        loads = self._recovery_loads.pop(attempt, None)
        pending = self._recovering.get(attempt)
        if not loads or pending is None:
            return
        self._load_done.add(attempt)
        tiers = [tier_read(load) for load in loads]
        self.emit(RecoveryPhase(fault_id=pending[0].fault_id, phase="checkpoint_load",
                                t_start=min(load["t_start"] for load in loads),
                                t_end=max(load["t_end"] for load in loads),
                                tier=max(tiers, key=_distance)))

    def startup_phase(self, name: str, t_start: float, t_end: float) -> None:
        with self.lock:
            self.phases.append({"phase": name, "t_start": t_start, "t_end": t_end,
                                "attempt": 0, "rank": None})

    def note_reached(self, attempt: int, step: int | None) -> None:
        """A rank reported `step` in `attempt` (see `reached_by_attempt`)."""
        if step is not None:
            with self.lock:
                reached = self.reached_by_attempt.get(attempt, step)
                self.reached_by_attempt[attempt] = max(step, reached)

    def _add_step_reports(self, attempt: int, step: int, ranks: list[int], t: float) -> None:
        """`ranks` reported `step`; it completes globally once every rank has."""
        key = (attempt, step)
        if key not in self._pending and attempt in self.first_step_by_attempt \
                and self.global_step is not None and step <= self.global_step:
            return  # a duplicate of a completed step (a retried call after an agent restart)
        seen, newest = self._pending.get(key, (set(), 0.0))
        seen.update(ranks)
        newest = max(newest, t)
        if len(seen) < self.world_size:
            self._pending[key] = (seen, newest)
            return
        self._pending.pop(key, None)
        self._step_done(attempt, step, newest)

    def close_attempt(self, attempt: int, lost: set[int]) -> list[int]:
        """`attempt` is over and the processes of the `lost` ranks are gone, with the reports
        they had not forwarded yet. A step every other rank reported counts as completed at
        its newest report: a rank of a synchronous job only finishes a step its peers took
        part in. Call it once the surviving ranks' outcomes are recorded. Returns the steps
        it completed."""
        with self.lock:
            survivors = set(range(self.world_size)) - lost
            keys = sorted(k for k in self._pending if k[0] == attempt)
            done = []
            for key in keys:
                ranks, t = self._pending.pop(key)
                step = key[1]
                if not lost or not survivors or not survivors <= ranks \
                        or (self.global_step is not None and step <= self.global_step):
                    continue
                self._step_done(attempt, step, t)
                done.append(step)
            return done

    def _step_done(self, attempt: int, step: int, t: float) -> None:
        self.global_step = step
        if attempt not in self.first_step_by_attempt and self.timeouts is not None \
                and attempt in self.launched_at:
            self.timeouts.observe("first_step", t - self.launched_at[attempt])
        self.first_step_by_attempt.setdefault(attempt, (step, t))
        self.emit(StepCompleted(step=step, attempt=attempt, world_size=self.world_size, t=t))
        self._emit_recovery_load(attempt)  # the loads that came, if some rank's never did
        pending = self._recovering.pop(attempt, None)
        if pending is not None:
            fault, mechanism = pending
            t_fault = fault.t_fault or fault.t_detect
            self.emit(RecoveryDone(
                fault_id=fault.fault_id, cause=fault.cause, mechanism=mechanism, attempt=attempt,
                rank=fault.ranks[0] if len(fault.ranks) == 1 else None, recovery_s=t - t_fault,
                resumed_from_step=step - 1,
                rollback_steps=None if fault.step is None else fault.step - (step - 1), t=t))

    def add_saves(self, attempt: int, saves: list[tuple], t: float) -> None:
        """Checkpoint blocking times of one rank: (step, seconds[, tier[, when it returned]]),
        tier "local" for local snapshots; recorded once every rank saved that step, at the
        latest rank's own time (else `t`, the report's), so its blocking lands in the step
        interval it happened in."""
        with self.lock:
            for step, blocking, *rest in saves:
                tier = rest[0] if rest else None
                t_save = rest[1] if len(rest) > 1 else t
                key = (attempt, step, tier)
                count, worst, t_last = self._saves.get(key, (0, 0.0, t_save))
                count, worst, t_last = count + 1, max(worst, blocking), max(t_last, t_save)
                if count < self.world_size:
                    self._saves[key] = (count, worst, t_last)
                    continue
                self._saves.pop(key, None)
                self.emit(CheckpointSaved(step=step, blocking_s=worst, tier=tier, t=t_last))

    def _add_recent(self, records: list[dict[str, Any]]) -> None:
        """Keeps rank 0's reports in (attempt, step) order: a node agent's batch drained at
        teardown can arrive after the attempt's outcome, which carried the newer ones."""
        for rec in records:
            key = (rec["attempt"], rec["step"])
            if not self.recent or _order(self.recent[-1]) <= key:
                self.recent.append(rec)
                continue
            kept = list(self.recent)
            kept.insert(bisect.bisect_right([_order(r) for r in kept], key), rec)
            self.recent = collections.deque(kept, maxlen=RECENT_REPORTS)

    def recent_history(self) -> list[dict[str, Any]]:
        """Rank 0's newest reports, oldest first."""
        with self.lock:
            return list(self.recent)

    def last_metrics(self) -> dict[str, Any]:
        """Rank 0's newest report ({} before the first)."""
        with self.lock:
            return dict(self.recent[-1]) if self.recent else {}


def _order(rec: dict[str, Any]) -> tuple[int, int]:
    return rec["attempt"], rec["step"]
