"""Writes staged snapshots to the local tier on a thread of its own, so a local step costs the
training thread what a committed save does: the overlapped copy into a staging slot. On GPU it
first waits (off the pipeline's lock) for the slot's device-to-host copies. On CPU a local-only
step's slot is the mapping of the file it goes to (`direct_slot`): the copy is the write, and
this thread adds the byte items, the extra state and the checksummed header.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots
from ray_resilience._internal.checkpoint.rank.slots import Slot, SlotPool, SlotState
from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers
from ray_resilience._internal.priority import defer_wakeups

logger = logging.getLogger(__name__)


class LocalWriter:
    """One rank's local-tier writes, one at a time, in step order. `written(slot)` is called
    under the pipeline's lock once a slot's write is over (done, failed or skipped)."""

    def __init__(self, *, rank: int, lock: Any, store: LocalSnapshots, schedule: Any,
                 written: Callable[[Slot], None], settle_gpu: Callable[[Slot], None]) -> None:
        self.rank, self.store, self._schedule = rank, store, schedule
        self._written, self._settle_gpu = written, settle_gpu
        self._cond = threading.Condition(lock)
        self._queue: collections.deque[Slot] = collections.deque()
        self._gpu: collections.deque[Slot] = collections.deque()
        """Slots whose device-to-host copy this thread settles (no round may do it)."""
        self._writing: Slot | None = None
        self._closed = False
        self.write_s: collections.deque[float] = collections.deque(maxlen=1000)
        self._length: tuple[Any, int] = (None, 0)
        """(save plan items, the length of their buffers): the last direct step's layout."""
        self._thread = threading.Thread(target=self._run, name=f"rr-ckpt-local-r{rank}",
                                        daemon=True)
        self._thread.start()

    def submit(self, slot: Slot) -> None:
        """Queues `slot` (now LOCAL) for writing; the caller holds the lock."""
        self._queue.append(slot)
        self._cond.notify_all()

    def watch_gpu(self, slot: Slot) -> None:
        """`slot` is COPYING on a CUDA stream: this thread settles it (caller holds the lock)."""
        self._gpu.append(slot)
        self._cond.notify_all()

    def busy(self) -> bool:
        """Caller holds the lock."""
        return bool(self._queue or self._gpu or self._writing is not None)

    def direct_slot(self, pool: SlotPool, source: Any) -> Slot | None:
        """A slot over the file the local-only snapshot of `source` goes to, once every local
        snapshot staged before it is on file (the file must not be the one a pending write
        completes); None until then, or when the tier is off. Caller holds the lock."""
        if self.store.disabled is not None or any(s.local is not None for s in pool.slots):
            return None
        if self._length[0] is not source.items:  # the plan changed: lay its buffers out again
            self._length = (source.items, StagingBuffers.length(source.items))
        target = self.store.begin_direct(self._length[1], sum(map(len, source.blobs)))
        if target is None:
            return None
        return pool.acquire_direct(source.items, source.tensors, *target)

    @staticmethod
    def can_go_direct(source: Any) -> bool:
        """Whether a local-only snapshot of `source` may be copied straight into its file (CPU
        tensors; on GPU the copy goes to pinned staging memory)."""
        return not any(t.is_cuda for t in source.tensors)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def running(self) -> bool:
        """Whether its thread is still alive (`close` gave up waiting for it)."""
        return self._thread.is_alive()

    def _run(self) -> None:
        defer_wakeups()  # woken from inside `save`: never preempt the training thread there
        while True:
            with self._cond:
                while not self._closed and not self._queue and not self._gpu:
                    self._cond.wait()
                if self._closed:
                    return
                if not self._queue:
                    watched = self._gpu.popleft()
                    event = watched.event if watched.state is SlotState.COPYING else None
                else:
                    watched, event = None, None
                    slot = self._writing = self._queue.popleft()
            if watched is not None:
                self._settle(watched, event)
                continue
            self._write(slot)

    def _settle(self, slot: Slot, event: Any) -> None:
        if event is not None:
            event.synchronize()  # outside the lock: the training thread's guard never waits on it
        with self._cond:
            if slot.state is SlotState.COPYING and slot.event is event:
                self._settle_gpu(slot)
            self._cond.notify_all()

    def _write(self, slot: Slot) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        target = slot.local
        try:
            slot.wait_copied()
            if slot.direct is not None:
                ok = self.store.finish_direct(target, slot.direct, slot.buffers.data,
                                              StagingBuffers.ALIGN, slot.blobs,
                                              slot.extra.encode())
            else:
                tensors = slot.buffers.payload([], b"").arrays
                ok = self.store.write(target, tensors, slot.blobs, slot.extra.encode())
        except Exception as exc:  # noqa: BLE001 - the tier goes off; training goes on
            self.store.disable(f"encoding step {target.step} failed: {type(exc).__name__}: "
                               f"{exc}", warn=True)
            ok = False
        if ok:
            self.write_s.append(time.perf_counter() - started)
            self._schedule.record_write(target.step, time.thread_time() - cpu + slot.copy_cpu_s,
                                        wall_s=time.perf_counter() - started)
        with self._cond:
            self._writing = None
            self._written(slot)
            self._cond.notify_all()
