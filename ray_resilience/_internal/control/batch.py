"""Folding ranks' heartbeats into one `ProgressBatch`, the message the supervisor handles.

A heartbeat carries one rank's liveness (attempt, step, phase, activity counter) and what it
recorded since the last one (metric dicts, save timings, timed phases). The folder keeps per rank
only its newest liveness, turns metric dicts into JSONL bytes for the run's log (the supervisor
writes them without parsing), groups step completions per (attempt, step), and reduces step and
phase intervals to (count, worst) per name for the learned timeouts. The supervisor's work per
batch is then one small tuple per rank plus one entry per step, not one dict per report.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

from ray_resilience._internal.attempt import PROCESS_PHASES

UNTIMED_PHASES = ("release_groups", "init_process_group")
"""Phases whose length depends on peers and restarts, not on the workload: never learned."""


@dataclasses.dataclass(frozen=True)
class Beat:
    """One rank's newest liveness in a batch."""

    rank: int
    attempt: int
    step: int | None
    step_time: float | None
    sent_at: float
    """Worker wall time the heartbeat was sent (orders phase reports)."""
    phase: str | None
    """The user-marked phase the rank is inside, or None."""
    activity: int | None
    """Counter the rank's side thread bumps when its training thread moved; None: not sampled."""
    age: float = 0.0
    """Seconds the beat waited in its node agent before the batch left: the supervisor dates it
    that much earlier, so batching delays neither hang nor heartbeat detection."""


@dataclasses.dataclass
class ProgressBatch:
    """What one node's ranks sent during one interval."""

    node: str
    beats: list[Beat] = dataclasses.field(default_factory=list)
    steps: dict[tuple[int, int], tuple[list[int], float]] = dataclasses.field(default_factory=dict)
    """(attempt, step) -> ranks that reported it, newest report time."""
    reached: dict[int, int] = dataclasses.field(default_factory=dict)
    """attempt -> newest step any rank reported."""
    rank0: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Rank 0's metric dicts (with "attempt"): the supervisor's window and `Result.metrics`."""
    log: bytes = b""
    """Every metric dict as JSONL, for the run's metrics log."""
    num_reports: int = 0
    intervals: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    """Timeout name -> (observations, worst seconds) for `LearnedTimeouts`."""
    events: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    """(attempt, timed phase) as ranks reported them."""
    saves: list[tuple[int, list, float]] = dataclasses.field(default_factory=list)
    """(attempt, save timings, report time) per heartbeat that carried any."""
    source: str = ""
    """The node agent (one id per agent process) that sent it; "" for one folded in place."""
    seq: int = 0
    """Its place among the batches `source` sent, from 1 (`BatchOrder`)."""

    def __bool__(self) -> bool:
        return bool(self.beats or self.events or self.saves or self.num_reports)


PARK_LIMIT_S = 1.0
"""How long a batch waits for an earlier one of its agent before it is folded without it (the
earlier one is then folded late, when it comes, as before `BatchOrder` existed)."""


class BatchOrder:
    """Hands each agent's batches on in the order the agent sent them. The supervisor is a
    threaded actor: two batches of one agent can run on two of its threads, and the later one
    can take the record's lock first. Folded out of order, a recovery's first completed step
    arrives before the reports of the steps and the checkpoint load that came before it, and
    the fault's record names the wrong step resumed from. Not thread-safe: the record calls it
    under its lock."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        """source -> the seq it is owed next"""
        self._parked: dict[str, dict[int, tuple[ProgressBatch, float]]] = {}
        """source -> batches that came early, with when they came"""

    def arrive(self, batch: ProgressBatch, now: float) -> list[ProgressBatch]:
        """The batches to fold now, in order: `batch` and any it was holding up, or nothing
        while an earlier batch of its agent is missing (at most PARK_LIMIT_S)."""
        if not batch.source:
            return [batch]
        owed = self._next.setdefault(batch.source, 1)
        if batch.seq < owed:  # given up on by a release: late, folded as it comes
            return [batch]
        parked = self._parked.setdefault(batch.source, {})
        parked[batch.seq] = (batch, now)
        out = []
        while owed in parked:
            out.append(parked.pop(owed)[0])
            owed += 1
        self._next[batch.source] = owed
        if parked and now - min(t for _, t in parked.values()) >= PARK_LIMIT_S:
            out += self._release(batch.source)
        return out

    def release(self) -> list[ProgressBatch]:
        """Every parked batch, in each agent's order (a drain: what is not here now is lost)."""
        return [b for source in list(self._parked) for b in self._release(source)]

    def _release(self, source: str) -> list[ProgressBatch]:
        parked = self._parked.pop(source, {})
        if parked:
            self._next[source] = max(parked) + 1
        return [parked[seq][0] for seq in sorted(parked)]


class ProgressFolder:
    """Builds batches from heartbeats; thread-safe. Keeps each rank's last step or phase end
    across batches, to measure the next interval."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._batch = ProgressBatch(node)
        self._beats: dict[int, tuple[Beat, float]] = {}
        """Each rank's newest beat and when it arrived here (monotonic)."""
        self._lines: list[str] = []
        self._last_mark: dict[tuple[int, int], float] = {}
        self._attempt = 0

    def add(self, rank: int, attempt: int, step: int | None, step_time: float | None,
            metrics: list[dict[str, Any]], saves: list, sent_at: float,
            events: list[dict[str, Any]], activity: int | None = None) -> None:
        """Folds one heartbeat in (the arguments of `Supervisor.heartbeat`)."""
        inside = [e["name"] for e in events if e.get("phase") == "in_phase"]
        beat = Beat(rank, attempt, step, step_time, sent_at, inside[-1] if inside else None,
                    activity)
        with self._lock:
            if attempt > self._attempt:  # marks of older attempts measure nothing any more
                self._attempt = attempt
                self._last_mark = {k: v for k, v in self._last_mark.items() if k[0] >= attempt}
            batch, old = self._batch, self._beats.get(rank)
            if old is None or (old[0].attempt, old[0].sent_at) <= (attempt, sent_at):
                self._beats[rank] = (beat, time.monotonic())
            for ev in events:
                if ev.get("phase") == "in_phase":
                    continue  # "still inside a phase": the supervisor's status, not a record
                batch.events.append((attempt, ev))
                if ev.get("phase") != "local_tier":  # a tier decision, not a timed phase
                    self._observe_phase(attempt, ev)
            for rec in metrics:
                self._add_report(attempt, rec)
            if saves:
                batch.saves.append((attempt, list(saves), sent_at))

    def add_reports(self, attempt: int, records: list[dict[str, Any]]) -> None:
        """Metric dicts of any ranks, outside a heartbeat (an attempt's outcome)."""
        with self._lock:
            for rec in records:
                self._add_report(attempt, rec)

    def _add_report(self, attempt: int, rec: dict[str, Any]) -> None:
        batch, step, rank = self._batch, rec["step"], rec["rank"]
        t = rec.get("time", 0.0)
        ranks, newest = batch.steps.get((attempt, step), ([], 0.0))
        ranks.append(rank)
        batch.steps[(attempt, step)] = (ranks, max(newest, t))
        batch.reached[attempt] = max(step, batch.reached.get(attempt, step))
        batch.num_reports += 1
        full = {**rec, "attempt": attempt}
        if rank == 0:
            batch.rank0.append(full)
        self._lines.append(json.dumps(full, default=str))
        key, last = (attempt, rank), self._last_mark.get((attempt, rank))
        if last is not None and t > last:
            self._interval("step", t - last)
        self._last_mark[key] = max(t, last or 0.0)

    def _observe_phase(self, attempt: int, ev: dict[str, Any]) -> None:
        if ev.get("t_end") is None or ev.get("t_start") is None:
            return
        if ev["phase"] in PROCESS_PHASES or ev["phase"] in UNTIMED_PHASES:
            return  # before the train function: neither a hang timeout nor a step's start
        self._interval(ev["phase"], ev["t_end"] - ev["t_start"])
        rank = ev.get("rank")
        # Time inside phases is not step time. A load is followed by the attempt's first step,
        # which has a timeout of its own: it starts no step interval.
        if rank is not None and ev["phase"] != "checkpoint_load":
            key = (attempt, rank)
            self._last_mark[key] = max(self._last_mark.get(key, 0.0), ev["t_end"])

    def _interval(self, name: str, seconds: float) -> None:
        count, worst = self._batch.intervals.get(name, (0, 0.0))
        self._batch.intervals[name] = (count + 1, max(worst, seconds))

    def take(self) -> ProgressBatch:
        """The batch so far (empty if nothing arrived); the next one starts empty."""
        with self._lock:
            batch, self._batch = self._batch, ProgressBatch(self.node)
            now = time.monotonic()
            batch.beats = [dataclasses.replace(b, age=now - t) for b, t in self._beats.values()]
            self._beats = {}
            if self._lines:
                batch.log = ("\n".join(self._lines) + "\n").encode()
                self._lines = []
            return batch
