"""Copies snapshots off the live tensors without holding the training thread.

Parameters and optimizer state are copied by a background thread while the next forward and
backward run; a pre-hook on `optimizer.step` holds the next step until the copy is done. A tensor
changed in place meanwhile makes the save dropped, never torn (docs/design.md, section 7).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import operator
import queue
import threading
import time
import weakref
from typing import Any

import torch

from ray_resilience._internal.checkpoint.rank.slots import RankSaveStats, Slot
from ray_resilience._internal.checkpoint.rank.state_cache import SaveSource
from ray_resilience._internal.priority import defer_wakeups

logger = logging.getLogger(__name__)
GUARD_WAIT_REPORTED_S = 50e-6
"""Guard waits shorter than this (the lock round trip) are not counted as blocking."""


@dataclasses.dataclass
class CopyJob:
    slot: Slot
    source: SaveSource
    """The save's inputs: live tensors, their holders and names, the addresses to check."""
    which: list[int]
    versions: list[int]
    event: Any = None
    error: str | None = None
    moved: str | None = None
    """The tensor whose storage was found replaced before the copy (the save is dropped)."""

    def changed(self) -> str | None:
        """The first tensor whose version moved since the save, if any."""
        holders = self.source.holders
        for i, version in zip(self.which, self.versions, strict=True):
            if holders[i]._version != version:
                return self.source.names[i]
        return None

    def check_storage(self) -> bool:
        """False (and the plan marked stale) when a tensor's storage was replaced since the plan."""
        self.moved = self.source.moved(self.which)
        if self.moved is not None:
            self.source.on_moved()
        return self.moved is None


_VERSION = operator.attrgetter("_version")


def new_job(slot: Slot, source: SaveSource, which: list[int]) -> CopyJob:
    """Taken on the training thread at `save`: the versions the copy must still see."""
    if which is source.overlap:
        holders = source.overlap_holders
    else:
        holders = [source.holders[i] for i in which]
    return CopyJob(slot, source, which, list(map(_VERSION, holders)))


class Copier:
    """The background copies of one rank; `done(slot, torn)` is called under the pipeline's
    condition when a slot's copy is complete."""

    def __init__(self, *, rank: int, cond: threading.Condition, stats: RankSaveStats, done: Any,
                 delay_s: float = 0.0) -> None:
        self.rank, self._cond, self._stats = rank, cond, stats
        self._done, self._delay_s = done, delay_s
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        """One token per job: a C-level queue, so waking the copier runs no Python `notify`."""
        self._jobs: collections.deque[CopyJob] = collections.deque()
        self._running = 0
        self._gpu_jobs: list[CopyJob] = []
        self._stream: Any = None
        self._hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._unreported_wait_s = 0.0
        self.guard_wait_total_s = 0.0
        """Every guard wait so far (read by the local tier's schedule)."""
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"rr-ckpt-copy-r{rank}", daemon=True)
        self._thread.start()


    def submit(self, job: CopyJob) -> None:
        """Starts the copy of `job` (caller holds the condition; the slot is COPYING)."""
        tensors = job.source.tensors
        if job.which and tensors[job.which[0]].is_cuda:
            if not job.check_storage():  # no copy thread: checked here, before queueing
                self._finish(job)
                return
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            job.event = job.slot.buffers.copy_on_stream(tensors, job.which, self._stream)
            job.slot.event = job.event
            self._gpu_jobs.append(job)
            # A GPU job is settled by the rounds thread (or the guard): it must hear of it now.
            self._cond.notify_all()
            return
        self._jobs.append(job)
        self._wake.put(None)  # the copy thread alone; its completion wakes the rounds thread

    def guard(self, optimizer: torch.optim.Optimizer) -> None:
        """Makes `optimizer.step` wait for copies in flight (once per optimizer)."""
        if optimizer not in self._hooks:
            self._hooks[optimizer] = optimizer.register_step_pre_hook(self._before_step)

    def unguard_all(self) -> None:
        for handle in list(self._hooks.values()):
            handle.remove()
        self._hooks.clear()

    def take_guard_wait_s(self) -> float:
        """Seconds optimizer steps waited for copies since the last call."""
        with self._cond:
            waited, self._unreported_wait_s = self._unreported_wait_s, 0.0
        return waited

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        start = time.perf_counter()
        with self._cond:
            for job in self._gpu_jobs:  # the step's kernels queue behind the copies: no CPU wait
                torch.cuda.current_stream().wait_event(job.event)
                self._finish(job)
            self._gpu_jobs.clear()
            while (self._jobs or self._running) and not self._closed:
                self._cond.wait()
            waited = time.perf_counter() - start
            if waited > GUARD_WAIT_REPORTED_S:
                self._stats.guard_wait_s.append(waited)
                self._unreported_wait_s += waited
                self.guard_wait_total_s += waited


    def settle_gpu(self, slot: Slot) -> None:
        """Waits for `slot`'s device-to-host copies if the guard has not (caller holds the
        condition)."""
        for job in [j for j in self._gpu_jobs if j.slot is slot]:
            job.event.synchronize()
            self._gpu_jobs.remove(job)
            self._finish(job)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._wake.put(None)
        self._thread.join(timeout=30)
        self.unguard_all()

    @property
    def running(self) -> bool:
        """Whether its thread is still alive (`close` gave up waiting for it)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        defer_wakeups()  # woken from inside `save`: never preempt the training thread there
        while True:
            self._wake.get()
            with self._cond:
                if self._closed:
                    return
                if not self._jobs:  # defensive: tokens and jobs are one to one
                    continue
                job = self._jobs.popleft()
                self._running += 1
            try:
                if self._delay_s:
                    time.sleep(self._delay_s)  # tests widen the window the guard must cover
                if job.check_storage():
                    cpu = time.thread_time()
                    job.slot.buffers.copy_now(job.source.tensors, job.which)
                    job.slot.copy_cpu_s = time.thread_time() - cpu
            except Exception as exc:  # noqa: BLE001 - a failed copy loses this save only
                job.error = f"the copy failed: {type(exc).__name__}: {exc}"
            with self._cond:
                self._running -= 1
                self._finish(job)
                self._cond.notify_all()

    def _finish(self, job: CopyJob) -> None:
        torn = None
        if job.error:
            torn = job.error
            logger.warning("rank %d: checkpoint of step %s dropped: %s", self.rank, job.slot.step,
                           job.error)
        elif job.moved is not None:
            torn = f"the storage of tensor {job.moved!r} was replaced"
            logger.warning(
                "rank %d: checkpoint of step %s dropped: the storage of tensor %r was replaced "
                "(`.data = ...` or `set_()`) since the save plan was built; the next save rebuilds "
                "its plan and checks storage at every save from then on.", self.rank, job.slot.step,
                job.moved)
        elif (changed := job.changed()) is not None:
            torn = f"tensor {changed!r} changed while copied"
            logger.warning(
                "rank %d: checkpoint of step %s dropped: tensor %r changed while it was being "
                "copied (the copy overlaps the next forward and backward; only optimizer.step() "
                "waits for it). Set CheckpointConfig.snapshot='sync' if the loop changes "
                "parameters or optimizer state outside optimizer.step().", self.rank, job.slot.step,
                changed)
        job.source = None  # no reference to the live state outlives the copy
        self._done(job.slot, torn)
