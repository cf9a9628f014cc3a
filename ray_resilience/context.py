"""What the train function calls: `get_context()`, `report()`, `load_checkpoint()`, `phase()`.
`report` only appends to an in-process queue; a side thread forwards progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainContext:
    """Where this rank stands. Frozen: a new attempt gets a new context."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    attempt: int
    """Restart attempt: 0 for the first run, +1 for each in-process restart or respawn."""
    device: torch.device
    run_name: str
    run_dir: str
    """The run's folder (`<storage_path>/<name>`), a local path or URI."""

    def get_world_rank(self) -> int:  # Ray Train spelling
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank


@dataclasses.dataclass
class CheckpointState:
    """What to save with a step: the (FSDP2-sharded) model and optimizer plus `extra` (JSON-safe
    values and tensors: data position, RNG states). Snapshotted on checkpoint steps only."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Session:
    """Per-attempt state of the rank, installed by the worker before the train function runs."""

    def __init__(self, context: TrainContext, checkpointer: Any = None, faults: Any = None) -> None:
        self.context = context
        self.checkpointer = checkpointer
        self.faults = faults  # callable(phase, step) firing injected faults due there
        self.phase: str | None = None
        """The user-marked phase the rank is in (`ray_resilience.phase`), e.g. "validation"."""
        self.phase_started: float | None = None
        self.lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []
        self.step: int | None = None
        self.step_time: float | None = None
        self.checkpoint_blocking_s: list[tuple[int, float, str | None, float]] = []
        """(step, blocking seconds, tier, when the save returned): stamped with its own time so
        the timeline charges it to the step interval it happened in."""
        self.open_save: tuple[int, float, float, str | None] | None = None
        """The newest save or local snapshot (step, blocking, when, tier), recorded once the
        optimizer step after it ran (its wait for the copy blocks too)."""
        self.events: list[dict[str, Any]] = []

    def close_save(self) -> None:
        """Records the open save with the optimizer-step wait that followed it."""
        if self.open_save is None:
            return
        step, blocked, t_saved, tier = self.open_save
        waited = self.checkpointer.take_guard_wait_s() if self.checkpointer is not None else 0.0
        with self.lock:
            self.checkpoint_blocking_s.append((step, blocked + waited, tier, t_saved))
            self.open_save = None

    def add_checkpointer_events(self) -> None:
        """The local tier's decisions (its interval) go to the supervisor with the events."""
        events = self.checkpointer.take_events() if self.checkpointer is not None else []
        if events:
            with self.lock:
                self.events.extend(events)

    def drain(self, *, final: bool = False
              ) -> tuple[list[dict[str, Any]], int | None, float | None, list, list]:
        """What was recorded since the last call: (metrics, step, step time, saves, events)."""
        if final:
            self.close_save()
        with self.lock:
            pending, self.pending = self.pending, []
            saves, self.checkpoint_blocking_s = self.checkpoint_blocking_s, []
            events, self.events = self.events, []
            if self.phase is not None:  # tells the supervisor which timeout applies now
                events.append({"phase": "in_phase", "name": self.phase,
                               "t_start": self.phase_started})
            return pending, self.step, self.step_time, saves, events


_session: _Session | None = None


def _set_session(session: _Session | None) -> None:
    global _session
    _session = session


def _require_session(what: str) -> _Session:
    if _session is None:
        raise RuntimeError(
            f"ray_resilience.{what}() was called outside a training function; call it from the "
            "train_loop_per_worker passed to ResilientTrainer.")
    return _session


def get_context() -> TrainContext:
    """This rank's context (rank, world size, device, restart attempt)."""
    return _require_session("get_context").context


def report(metrics: dict[str, Any], *, step: int,
           checkpoint: CheckpointState | None = None) -> None:
    """Records that `step` completed with `metrics`, once per step after the optimizer step; saves
    a checkpoint on checkpoint steps (see `CheckpointConfig.snapshot` for what it waits for)."""
    session = _require_session("report")
    now = time.time()
    record = {**metrics, "step": int(step), "rank": session.context.world_rank, "time": now}
    if session.checkpointer is not None:
        session.close_save()  # the previous save's optimizer-step wait is known by now
    if checkpoint is not None and session.checkpointer is not None:
        blocked = session.checkpointer.maybe_save(
            int(step), model=checkpoint.model, optimizer=checkpoint.optimizer,
            extra=checkpoint.extra)
        t_saved = time.time()
        for local_step, local_blocked in session.checkpointer.take_local_blocking():
            session.open_save = (local_step, local_blocked, t_saved, "local")
        if blocked is not None:
            session.open_save = (int(step), blocked, t_saved, None)
            if session.faults is not None:
                session.faults("checkpoint_save", int(step))
        session.add_checkpointer_events()
    with session.lock:
        session.pending.append(record)
        session.step, session.step_time = int(step), now
    if session.faults is not None:
        session.faults("step", int(step))


def load_checkpoint(*, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> Any:
    """Restores the newest checkpoint into freshly built objects, on every rank. Returns a
    `LoadedCheckpoint` (`.step`, `.extra`, `.tier`), or None when there is none yet."""
    session = _require_session("load_checkpoint")
    if session.checkpointer is None:
        return None
    t0 = time.time()
    loaded = session.checkpointer.load(model=model, optimizer=optimizer)
    session.add_checkpointer_events()
    with session.lock:
        session.events.append({"phase": "checkpoint_load", "t_start": t0, "t_end": time.time(),
                               "rank": session.context.world_rank,
                               "tier": getattr(loaded, "tier", None),
                               "replica": getattr(loaded, "replica", False),
                               "step": getattr(loaded, "step", None)})
    if session.faults is not None:
        session.faults("checkpoint_load", None)
    return loaded


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks a non-training phase, e.g. `with phase("validation"):`: inside it the supervisor
    applies `ResilienceConfig.phase_timeouts_s[name]` instead of the step timeout."""
    session = _require_session("phase")
    if not name or not isinstance(name, str):
        raise ValueError(f"phase name={name!r} must be a non-empty string, e.g. 'validation'")
    with session.lock:
        outer = (session.phase, session.phase_started)
        session.phase, session.phase_started = name, time.time()
    try:
        if session.faults is not None:
            session.faults(name, session.step)
        yield
    finally:
        t_end = time.time()
        with session.lock:
            session.events.append({"phase": name, "t_start": session.phase_started, "t_end": t_end,
                                   "rank": session.context.world_rank})
            session.phase, session.phase_started = outer
