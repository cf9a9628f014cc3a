"""The supervisor's record of the run: metric history, global steps, faults, the timeline.

Everything here is fed from heartbeats and attempt outcomes (worker wall clock, `time.time()`)
and from the supervisor's own detections (same clock). Thread-safe: heartbeats arrive on other
actor threads than the state machine.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ray_resilience.goodput import RunTimeline


class RunRecord:
    """Aggregates per-rank reports into global steps and feeds the goodput timeline."""

    def __init__(self, world_size: int, metrics: Any = None, timeouts: Any = None) -> None:
        self.world_size = world_size
        self.timeouts = timeouts
        """LearnedTimeouts fed with every interval observed, or None."""
        self.launched_at: dict[int, float] = {}
        self._last_mark: dict[tuple[int, int], float] = {}
        self.metrics = metrics
        """RunMetrics exporter (Ray metrics API), or None."""
        self.timeline = RunTimeline()
        self.history: list[dict[str, Any]] = []
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
        self.fired: dict[str, dict[str, Any]] = {}
        """Injected faults that fired: id -> {rank, attempt, t, step, kind}."""
        self._recovering: dict[int, dict[str, Any]] = {}
        """attempt -> the fault it recovers from, until its first step completes."""
        self._load_seen: set[int] = set()
        self.phases: list[dict[str, Any]] = []
        """Every timed phase ranks reported (release_groups, init_process_group, checkpoint_load)."""
        self.loads: list[dict[str, Any]] = []
        """Every checkpoint load a rank reported (attempt, rank, tier, step, seconds)."""

    def expect_recovery(self, attempt: int, fault_id: str, **fault: Any) -> None:
        """`attempt` recovers from `fault_id` (cause, mechanism, t_fault, step) until its first step."""
        with self.lock:
            self._recovering[attempt] = {"fault_id": fault_id, **fault}

    def add_events(self, attempt: int, events: list[dict[str, Any]]) -> None:
        """Timed phases reported by a rank; the first checkpoint load of a recovery is recorded."""
        with self.lock:
            for ev in events:
                if ev.get("phase") == "in_phase":
                    continue  # "still inside a phase": the supervisor's status, not a record
                self.phases.append({**ev, "attempt": attempt})
                self._observe_phase(attempt, ev)
                if ev.get("phase") != "checkpoint_load":
                    continue
                self.loads.append({**ev, "attempt": attempt})
                pending = self._recovering.get(attempt)
                if pending is not None and attempt not in self._load_seen:
                    self._load_seen.add(attempt)
                    self.timeline.recovery_phase(pending["fault_id"], "checkpoint_load", ev["t_start"],
                                                 ev["t_end"], tier=ev.get("tier"))

    def start(self, t: float, start_step: int = 0) -> None:
        self.timeline.run_started(t, self.world_size, start_step=start_step)

    def _observe_phase(self, attempt: int, ev: dict[str, Any]) -> None:
        if ev.get("t_end") is None or ev.get("t_start") is None:
            return
        if self.timeouts is not None and ev["phase"] not in ("release_groups", "init_process_group"):
            self.timeouts.observe(ev["phase"], ev["t_end"] - ev["t_start"])
        rank = ev.get("rank")
        # Time inside phases is not step time. A load is followed by the attempt's first step,
        # which has a timeout of its own: it starts no step interval.
        if rank is not None and ev["phase"] != "checkpoint_load":
            key = (attempt, rank)
            self._last_mark[key] = max(self._last_mark.get(key, 0.0), ev["t_end"])

    def _observe_step(self, attempt: int, rec: dict[str, Any]) -> None:
        key, t = (attempt, rec["rank"]), rec.get("time")
        if t is None:
            return
        last = self._last_mark.get(key)
        if last is not None and t > last and self.timeouts is not None:
            self.timeouts.observe("step", t - last)
        self._last_mark[key] = max(t, last or 0.0)

    def note_reached(self, attempt: int, step: int | None) -> None:
        """A rank reported `step` in `attempt` (see `reached_by_attempt`)."""
        if step is not None:
            with self.lock:
                self.reached_by_attempt[attempt] = max(step, self.reached_by_attempt.get(attempt, step))

    def add_reports(self, attempt: int, records: list[dict[str, Any]]) -> None:
        """Metric dicts from one rank; a step completes globally when every rank reported it."""
        with self.lock:
            for rec in records:
                self.history.append({**rec, "attempt": attempt})
                self._observe_step(attempt, rec)
                self.note_reached(attempt, rec.get("step"))
                key = (attempt, rec["step"])
                ranks, t = self._pending.get(key, (set(), 0.0))
                ranks, t = ranks | {rec["rank"]}, max(t, rec.get("time", time.time()))
                if len(ranks) < self.world_size:
                    self._pending[key] = (ranks, t)
                    continue
                self._pending.pop(key, None)
                self._step_done(attempt, rec["step"], t)

    def close_attempt(self, attempt: int, lost: set[int]) -> list[int]:
        """`attempt` is over and the processes of the `lost` ranks are gone, with the reports
        they had not forwarded yet (every 0.25 s). A step every other rank reported is counted
        as completed at its newest report: a rank of a synchronous job only finishes a step
        its peers took part in (every collective of it). Without this, a fault that came
        before the recovery's first steps reached the supervisor left that recovery without a
        first step, its time extended to the next one's end. Call it once the surviving ranks'
        outcomes (their last reports) are recorded. Returns the steps it completed."""
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
        self.timeline.step_completed(step, t, self.world_size)
        if self.metrics is not None:
            self.metrics.on_step(step)
        pending = self._recovering.pop(attempt, None)
        if pending is not None:
            self.timeline.recovery_done(pending["fault_id"], t, resumed_from_step=step - 1)
            if self.metrics is not None:
                rollback = None if pending.get("step") is None else pending["step"] - (step - 1)
                self.metrics.on_restart(pending.get("cause", "unknown"),
                                        pending.get("mechanism", "unknown"),
                                        t - pending.get("t_fault", t), rollback,
                                        rank=pending.get("rank"))

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
                self.timeline.checkpoint_saved(step, t_last, worst, tier=tier)
                if self.metrics is not None and tier is None:
                    self.metrics.on_checkpoint(step, blocking_s=worst, committed=False)

    def fault_fired(self, fault_id: str, info: dict[str, Any]) -> None:
        with self.lock:
            self.fired[fault_id] = info

    def match_injected(self, ranks: list[int], attempt: int) -> tuple[str, dict[str, Any]] | None:
        """The injected fault behind a detected one (same rank and attempt), if any."""
        with self.lock:
            candidates = [(fid, info) for fid, info in self.fired.items()
                          if info["attempt"] == attempt and not info.get("matched")]
            # Prefer the rank that was detected; a hung rank's peers often time out first.
            candidates.sort(key=lambda item: item[1]["rank"] not in ranks)
            if not candidates:
                return None
            fault_id, info = candidates[0]
            info["matched"] = True
            return fault_id, info

    def sorted_history(self) -> list[dict[str, Any]]:
        with self.lock:
            return sorted(self.history, key=lambda m: (m["attempt"], m["step"], m["rank"]))
