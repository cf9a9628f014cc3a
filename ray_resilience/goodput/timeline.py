"""The run timeline: what happened when, on the supervisor's one monotonic clock. The recorder
only validates and stores; interpretation lives in `report.py`.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Any

RECOVERY_PHASES: tuple[str, ...] = (
    "detect", "teardown", "rendezvous", "checkpoint_load", "first_step",
)
CHECKPOINT_TIERS: tuple[str | None, ...] = ("local", "memory", "replica", "storage", None)
"""Where a recovery's checkpoint_load read from ("replica": another writer's copy of a shard)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepEvent:
    """Global step `step` completed at `t` with `world_size` ranks training."""

    step: int
    t: float
    world_size: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointEvent:
    """A save of `step` returned to training at `t` (blocking_s > 0) or was committed at `t`."""

    step: int
    t: float
    blocking_s: float = 0.0
    tier: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseEvent:
    """One recovery phase of one fault, [t_start, t_end]."""

    phase: str
    t_start: float
    t_end: float
    tier: str | None = None


@dataclasses.dataclass(kw_only=True)
class FaultEvent:
    """A fault and its recovery, filled in as the recovery proceeds."""

    fault_id: str
    t_fault: float
    t_detect: float
    step_at_fault: int
    rank: int | None
    cause: str
    kind: str | None
    phases: list[PhaseEvent] = dataclasses.field(default_factory=list)
    t_first_step: float | None = None
    resumed_from_step: int | None = None


class RunTimeline:
    """Recorder of one run's events, one method per event, `run_started` first and
    `run_finished` last; thread-safe. Times may arrive slightly out of order; readers sort."""

    def __init__(self) -> None:
        self.t_start: float | None = None
        self.t_end: float | None = None
        self.world_size: int = 0
        self.start_step: int = 0
        self.final_step: int | None = None
        self.steps: list[StepEvent] = []
        self.saves: list[CheckpointEvent] = []
        self.commits: list[CheckpointEvent] = []
        self.faults: dict[str, FaultEvent] = {}
        self._origin = time.monotonic()
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock does not pickle; reports carrying a timeline cross actors
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def snapshot(self) -> RunTimeline:
        """An independent copy, consistent as of now; recording may go on meanwhile."""
        with self._lock:
            return RunTimeline.from_dict(self.to_dict())

    def now(self) -> float:
        """Seconds since this timeline was created, on `time.monotonic` (a ready-made clock)."""
        return time.monotonic() - self._origin

    def run_started(self, t: float, world_size: int, *, start_step: int = 0) -> None:
        """The run began at `t` with the full world size (a job retry: at `start_step`)."""
        _check_time("t", t)
        if world_size < 1:
            raise ValueError(
                f"world_size={world_size} is invalid; pass the configured world size (>= 1)."
            )
        self.t_start, self.world_size, self.start_step = t, world_size, start_step

    def step_completed(self, step: int, t: float, world_size: int) -> None:
        """Global step `step` finished at `t` on `world_size` ranks. A step number seen again
        after a rollback is a redone step; sparse sampling is fine."""
        self._check_started(t)
        with self._lock:
            self.steps.append(StepEvent(step=step, t=t, world_size=world_size))

    def checkpoint_saved(
        self, step: int, t: float, blocking_s: float, tier: str | None = None
    ) -> None:
        """Training resumed at `t` after saving `step`; `blocking_s` is the max over ranks."""
        self._check_started(t)
        _check_tier(tier)
        if not blocking_s >= 0:
            raise ValueError(
                f"blocking_s={blocking_s!r} is invalid; pass the training thread's blocking "
                "time in seconds (>= 0), the maximum over ranks."
            )
        with self._lock:
            self.saves.append(CheckpointEvent(step=step, t=t, blocking_s=blocking_s, tier=tier))

    def checkpoint_committed(self, step: int, t: float) -> None:
        """Checkpoint `step` became durable and loadable (its commit marker exists) at `t`."""
        self._check_started(t)
        with self._lock:
            self.commits.append(CheckpointEvent(step=step, t=t))

    def fault_detected(
        self, fault_id: str, *, t_fault: float, t_detect: float, step_at_fault: int,
        rank: int | None, cause: str, kind: str | None,
    ) -> None:
        """A fault happened at `t_fault` (its recorded wall time) and was noticed at `t_detect`."""
        self._check_started(t_fault)
        if t_detect < t_fault:
            raise ValueError(
                f"t_detect={t_detect} is before t_fault={t_fault} for {fault_id}; "
                "record both on the supervisor's clock."
            )
        with self._lock:
            if fault_id in self.faults:
                raise ValueError(
                    f"fault_id={fault_id!r} was already recorded; give each fault a unique id."
                )
            self.faults[fault_id] = FaultEvent(
                fault_id=fault_id, t_fault=t_fault, t_detect=t_detect,
                step_at_fault=step_at_fault, rank=rank, cause=cause, kind=kind,
            )

    def step_at_fault_is(self, fault_id: str, step: int) -> None:
        """Steps of `fault_id`'s attempt reported late: its step at fault is at least `step`."""
        with self._lock:
            fault = self.faults[fault_id]
            if step > fault.step_at_fault:
                fault.step_at_fault = step

    def recovery_phase(
        self, fault_id: str, phase: str, t_start: float, t_end: float, *, tier: str | None = None
    ) -> None:
        """One recovery phase of `fault_id`; `tier` says where checkpoint_load read from."""
        fault = self._fault(fault_id)
        if phase not in RECOVERY_PHASES:
            raise ValueError(f"phase={phase!r} is invalid; use one of {RECOVERY_PHASES}.")
        _check_tier(tier)
        if t_end < t_start:
            raise ValueError(f"{phase} of {fault_id}: t_end={t_end} is before t_start={t_start}.")
        with self._lock:
            fault.phases.append(PhaseEvent(phase=phase, t_start=t_start, t_end=t_end, tier=tier))

    def recovery_done(self, fault_id: str, t_first_step: float, resumed_from_step: int) -> None:
        """After `fault_id`, training resumed from `resumed_from_step` and completed a step at
        `t_first_step`."""
        fault = self._fault(fault_id)
        _check_time("t_first_step", t_first_step)
        with self._lock:
            fault.t_first_step, fault.resumed_from_step = t_first_step, resumed_from_step

    def run_finished(self, t: float, final_step: int) -> None:
        """The run ended at `t` with `final_step` as the last completed step."""
        self._check_started(t)
        with self._lock:
            self.t_end, self.final_step = t, final_step

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe copy of everything recorded (for results.json and re-plotting)."""
        with self._lock:
            return self._to_dict_locked()

    def _to_dict_locked(self) -> dict[str, Any]:
        return {
            "t_start": self.t_start, "t_end": self.t_end, "world_size": self.world_size,
            "start_step": self.start_step, "final_step": self.final_step,
            "steps": [dataclasses.asdict(e) for e in self.steps],
            "saves": [dataclasses.asdict(e) for e in self.saves],
            "commits": [dataclasses.asdict(e) for e in self.commits],
            "faults": [dataclasses.asdict(f) for f in self.faults.values()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunTimeline:
        """Inverse of `to_dict`."""
        timeline = cls()
        for key in ("t_start", "t_end", "world_size", "start_step", "final_step"):
            setattr(timeline, key, data[key])
        timeline.steps = [StepEvent(**e) for e in data["steps"]]
        timeline.saves = [CheckpointEvent(**e) for e in data["saves"]]
        timeline.commits = [CheckpointEvent(**e) for e in data["commits"]]
        for raw in data["faults"]:
            phases = [PhaseEvent(**p) for p in raw["phases"]]
            timeline.faults[raw["fault_id"]] = FaultEvent(**{**raw, "phases": phases})
        return timeline

    def _check_started(self, t: float) -> None:
        if self.t_start is None:
            raise RuntimeError("RunTimeline.run_started must be called before any other event.")
        _check_time("t", t)

    def _fault(self, fault_id: str) -> FaultEvent:
        with self._lock:
            if fault_id not in self.faults:
                raise ValueError(
                    f"fault_id={fault_id!r} is unknown; call fault_detected for it first."
                )
            return self.faults[fault_id]


def _check_time(name: str, t: float) -> None:
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError(f"{name}={t!r} is invalid; pass seconds on the supervisor's clock.")


def _check_tier(tier: str | None) -> None:
    if tier not in CHECKPOINT_TIERS:
        raise ValueError(f"tier={tier!r} is invalid; use one of {CHECKPOINT_TIERS}.")
