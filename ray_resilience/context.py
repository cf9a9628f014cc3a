"""What the train function calls: `get_context()`, `report()`, `load_checkpoint()`, `phase()`,
`get_dataset_shard()`. `report` only appends to an in-process queue; a side thread forwards
progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from ray_resilience._internal.data.shard import POSITION_KEY, DatasetShard

log = logging.getLogger(__name__)


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

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank


class PreemptionStop(BaseException):
    """Raised by `report` at the step every rank agreed to stop at (a node is being drained);
    a BaseException so that the train function's `except Exception` does not catch it."""

    def __init__(self, step: int, durable: bool) -> None:
        super().__init__(step, durable)
        self.step, self.durable = step, durable


@dataclasses.dataclass
class CheckpointState:
    """What to save with a step: the (FSDP2-sharded) model and optimizer plus `extra` (JSON-safe
    values and tensors: data position, RNG states). Snapshotted on checkpoint steps only."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Session:
    """Per-attempt state of the rank, installed by the worker before the train function runs."""

    def __init__(self, context: TrainContext, checkpointer: Any = None, faults: Any = None,
                 datasets: dict[str, Any] | None = None) -> None:
        self.context = context
        self.datasets = {
            name: DatasetShard(name, source, rank=context.world_rank,
                               world_size=context.world_size, device=context.device)
            for name, source in (datasets or {}).items()}
        """This rank's shard of each of the run's datasets (`get_dataset_shard`)."""
        self.checkpointer = checkpointer
        self.faults = faults  # callable(phase, step) firing injected faults due there
        self.phase: str | None = None
        """The user-marked phase the rank is in (`ray_resilience.phase`), e.g. "validation"."""
        self.phase_started: float | None = None
        self.lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []
        self.step: int | None = None
        self.step_time: float | None = None
        self.restored_step: int | None = None
        """The step `load_checkpoint` restored: `report()` without a step counts on from it."""
        self.checkpoint_blocking_s: list[tuple[int, float, str | None, float]] = []
        """(step, blocking seconds, tier, when the save returned): stamped with its own time so
        the timeline charges it to the step interval it happened in."""
        self.open_save: tuple[int, float, float, str | None] | None = None
        """The newest save or local snapshot (step, blocking, when, tier), recorded once the
        optimizer step after it ran (its wait for the copy blocks too)."""
        self.events: list[dict[str, Any]] = []
        self.stop_at: tuple[int, float] | None = None
        """(step, deadline): save that step, wait until it is durable, stop (preemption)."""

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


def report(metrics: dict[str, Any], *, step: int | None = None,
           checkpoint: CheckpointState | None = None) -> None:
    """Records that `step` completed with `metrics`, once per step after the optimizer step; saves
    a checkpoint on checkpoint steps (see `CheckpointConfig.snapshot` for what it waits for).

    Without `step`, this rank counts calls: the step after the one it reported last, or after
    the step `load_checkpoint` restored, or 1. Checkpoint steps must be the same on every rank,
    so ranks that report at different cadences pass `step` explicitly."""
    session = _require_session("report")
    if step is None:
        last = session.step if session.step is not None else session.restored_step
        step = (last or 0) + 1
    if checkpoint is not None:
        _say_if_not_saved(session, int(step))
    now = time.time()
    record = {**metrics, "step": int(step), "rank": session.context.world_rank, "time": now}
    if session.checkpointer is not None:
        session.close_save()  # the previous save's optimizer-step wait is known by now
    if checkpoint is not None and session.checkpointer is not None:
        extra = checkpoint.extra
        if session.datasets:  # the data position travels with every checkpoint
            extra = {**extra, POSITION_KEY: {
                name: shard.position.to_dict() for name, shard in session.datasets.items()}}
        if _stopping(session, int(step)):
            _stop(session, record, durable=_save_now(session, int(step), checkpoint, extra))
        blocked = session.checkpointer.maybe_save(
            int(step), model=checkpoint.model, optimizer=checkpoint.optimizer, extra=extra)
        t_saved = time.time()
        for local_step, local_blocked in session.checkpointer.take_local_blocking():
            session.open_save = (local_step, local_blocked, t_saved, "local")
        if blocked is not None:
            session.open_save = (int(step), blocked, t_saved, None)
            if session.faults is not None:
                session.faults("checkpoint_save", int(step))
        session.add_checkpointer_events()
    if _stopping(session, int(step)):
        _stop(session, record, durable=False)  # no checkpoint given at this step
    with session.lock:
        session.pending.append(record)
        session.step, session.step_time = int(step), now
    if session.faults is not None:
        session.faults("step", int(step))


def _say_if_not_saved(session: _Session, step: int) -> None:
    """Logs once per process when a checkpoint passed to `report` is not saved at this step."""
    checkpointer = session.checkpointer
    if checkpointer is None:
        key, why = "off", ("report(checkpoint=...) saves nothing: checkpointing is off "
                           "(ResilienceConfig.checkpoint=None)")
    elif checkpointer.config.is_save_step(step):
        return
    else:
        config = checkpointer.config
        every = (f"commits only steps divisible by {config.interval_steps}"
                 if config.interval_steps else "commits nothing to storage")
        every_local = config.local_interval_steps
        local = ("; the local tier keeps steps on this node at the interval its measured cost "
                 "allows" if every_local == "auto" else
                 f"; the local tier keeps every {every_local} step(s) on this node"
                 if every_local else "")
        key, why = "interval", (
            f"report(checkpoint=...) at step {step} is not committed to storage: "
            f"CheckpointConfig.interval_steps={config.interval_steps} {every}{local}. Passing "
            "the state at every step is fine: the interval picks the steps")
    if key not in _said:
        _said.add(key)
        log.warning("%s (said once per process).", why)


_said: set[str] = set()
"""What `_say_if_not_saved` has logged in this process."""


def _stopping(session: _Session, step: int) -> bool:
    return session.stop_at is not None and step >= session.stop_at[0]


def _save_now(session: _Session, step: int, checkpoint: CheckpointState,
              extra: dict[str, Any]) -> bool:
    """Saves `step` on this rank (every rank does, at the same step) and waits until it is
    durable or the preemption's deadline passed; True when durable."""
    checkpointer, deadline = session.checkpointer, session.stop_at[1]
    checkpointer.wait_idle(max(deadline - time.time(), 0.1))  # an older save out of the way
    checkpointer.save(step, model=checkpoint.model, optimizer=checkpoint.optimizer, extra=extra)
    return checkpointer.wait_idle(max(deadline - time.time(), 0.1))


def _stop(session: _Session, record: dict[str, Any], *, durable: bool) -> None:
    """Records the step and leaves the train function (see `PreemptionStop`)."""
    with session.lock:
        session.pending.append(record)
        session.step, session.step_time = record["step"], record["time"]
    raise PreemptionStop(record["step"], durable)


def load_checkpoint(*, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> Any:
    """Restores the newest checkpoint into freshly built objects, on every rank. Returns a
    `LoadedCheckpoint` (`.step`, `.extra`, `.tier`), or None when there is none yet."""
    session = _require_session("load_checkpoint")
    if session.checkpointer is None:
        return None
    t0 = time.time()
    loaded = session.checkpointer.load(model=model, optimizer=optimizer)
    session.restored_step = getattr(loaded, "step", None)
    if loaded is not None and POSITION_KEY in loaded.extra:
        extra = dict(loaded.extra)
        for name, saved in extra.pop(POSITION_KEY).items():
            if name in session.datasets:  # a dataset the run no longer has is skipped
                session.datasets[name].restore(saved)
        loaded = dataclasses.replace(loaded, extra=extra)
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


def get_dataset_shard(name: str = "train") -> DatasetShard:
    """This rank's shard of `ResilientTrainer(datasets={name: ...})`: iterate it with
    `iter_torch_batches(batch_size=...)` / `iter_batches`. Its position is saved with every
    checkpoint and restored by `load_checkpoint`, so a resume continues at the next batch."""
    session = _require_session("get_dataset_shard")
    if name not in session.datasets:
        raise KeyError(f"no dataset named {name!r}: ResilientTrainer(datasets=...) has "
                       f"{sorted(session.datasets)}")
    return session.datasets[name]


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
