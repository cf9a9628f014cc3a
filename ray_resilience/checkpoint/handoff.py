"""Per-rank save pipeline: at most one pending snapshot and one being written.

The training thread stages snapshots (see `RankCheckpointer.save`); a background thread hands
the pending one to the node-local writer when the previous one is durable: `ray.put` of the
staging buffers (the rank's object), `writer.receive` (the writer copies it into an object it
owns, so it outlives this process), then `writer.wait` until the shard is durable or given up.
The training thread never waits for any of this unless the policy is `block`.

`ray.put` gets numpy views of the staging buffers, which Ray copies into the object store (torch
tensors would be copied too, unless RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 made the object alias
them). That copy runs here, off the training thread, and frees the buffers for the next save.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.snapshot import StagingBuffers
from ray_resilience.checkpoint.types import SaveTicket, ShardOutcome, ShardPayload

logger = logging.getLogger(__name__)
_POLL_S = 2.0
MAX_BUFFER_SETS = 2


@dataclasses.dataclass
class Staged:
    ticket: SaveTicket
    buffers: StagingBuffers
    blobs: list[bytes]
    extra: bytes


class RankSaveStats:
    """Counters and recent timings of one rank's saves."""

    def __init__(self) -> None:
        self.counts = collections.Counter()
        self.blocking_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.durable_latency_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.last_error: str | None = None
        self.last_durable_step: int | None = None
        self.phases: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=10_000))

    def phase(self, name: str, since: float) -> None:
        """Records how long a part of the training thread's save took (from `since` until now)."""
        self.phases[name].append(time.perf_counter() - since)

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.counts), "blocking_s": list(self.blocking_s),
                "phases_s": {k: list(v) for k, v in self.phases.items()},
                "durable_latency_s": list(self.durable_latency_s),
                "last_error": self.last_error, "last_durable_step": self.last_durable_step}


class WriterLink:
    """This rank's current writer; replaced through the coordinator when it dies."""

    def __init__(self, *, rank: int, writer: Any, writer_id: str, coordinator: Any) -> None:
        self.rank, self.handle, self.writer_id, self._coordinator = rank, writer, writer_id, coordinator

    def replace(self) -> None:
        dead = self.writer_id
        self.handle, self.writer_id = ray.get(self._coordinator.replace_writer.remote(self.rank, dead))
        logger.warning("rank %d: checkpoint writer %s died; now using %s", self.rank, dead, self.writer_id)


class HandoffPipeline:
    """Slots `pending` (staged, not handed off) and `writing` (handed off, not yet durable)."""

    def __init__(self, *, rank: int, config: CheckpointConfig, link: WriterLink,
                 stats: RankSaveStats) -> None:
        self.rank, self.config, self.link, self.stats = rank, config, link, stats
        self.cond = threading.Condition()
        self.pending: Staged | None = None
        self.writing: SaveTicket | None = None
        self._free: list[StagingBuffers] = []
        self._num_buffer_sets = 0
        self.staging_bytes = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"rr-ckpt-handoff-r{rank}", daemon=True)
        self._thread.start()

    # --- training-thread side (callers hold self.cond) -------------------------------------

    def buffers_for(self, items: list, sources: list, *, replace_pending: bool) -> StagingBuffers:
        """A buffer set for a new snapshot: the pending one's (when replacing it), a free one,
        or a new one (at most MAX_BUFFER_SETS exist while the structure stays the same)."""
        if replace_pending and self.pending is not None:
            self._free.append(self.pending.buffers)
            self.pending = None
        for i, buffers in enumerate(self._free):
            if buffers.matches(items):
                return self._free.pop(i)
        while self._free and self._num_buffer_sets >= MAX_BUFFER_SETS:
            self.staging_bytes -= self._free.pop().nbytes  # structure changed: drop a stale set
            self._num_buffer_sets -= 1
        buffers = StagingBuffers(items, sources)
        self._num_buffer_sets += 1
        self.staging_bytes += buffers.nbytes
        return buffers

    def set_pending(self, staged: Staged) -> None:
        self.pending = staged
        self.cond.notify_all()

    def drop_pending(self) -> None:
        """Forgets the pending snapshot (a new attempt starts; it belongs to the old one)."""
        with self.cond:
            if self.pending is not None:
                self._free.append(self.pending.buffers)
                self.pending = None

    def busy(self) -> bool:
        return self.pending is not None or self.writing is not None

    def wait_idle(self, timeout_s: float | None, *, why: str) -> bool:
        """Waits until nothing is pending or being written; warns periodically."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        start = time.monotonic()
        with self.cond:
            while self.busy() and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                wait = self.config.warn_interval_s if left is None else min(left, self.config.warn_interval_s)
                if not self.cond.wait(wait) and self.busy():
                    logger.warning("rank %d: %s; still waiting after %.0f s for step %s to become durable",
                                   self.rank, why, time.monotonic() - start,
                                   self.writing.step if self.writing else self.pending.ticket.step)
            return not self.busy()

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.pending = None
            self.cond.notify_all()
        self._thread.join(timeout=_POLL_S + 5.0)

    # --- background thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self._closed and (self.pending is None or self.writing is not None):
                    self.cond.wait()
                if self._closed:
                    return
                staged, self.pending = self.pending, None
                self.writing = staged.ticket
            try:
                outcome = self._hand_off(staged)
            except Exception as exc:  # noqa: BLE001 - never leave the writing slot taken
                logger.exception("rank %d: checkpoint hand-off of step %d failed", self.rank,
                                 staged.ticket.step)
                outcome = ShardOutcome(staged.ticket.session, staged.ticket.step, False, repr(exc))
            self._record(staged.ticket, outcome)
            with self.cond:
                self.writing = None
                self.cond.notify_all()

    def _hand_off(self, staged: Staged) -> ShardOutcome:
        ticket = staged.ticket
        try:
            staged.buffers.wait_ready()
            ref = ray.put(ShardPayload(staged.buffers.arrays, staged.blobs, staged.extra))
        except Exception as exc:  # noqa: BLE001 - a failed hand-off loses this save only
            return ShardOutcome(ticket.session, ticket.step, False, f"ray.put failed: {exc}")
        finally:
            with self.cond:
                self._free.append(staged.buffers)
        return self._deliver(ticket, [ref])

    def _deliver(self, ticket: SaveTicket, boxed: list) -> ShardOutcome:
        deadline = time.monotonic() + self.config.write_timeout_s
        writer_id = self.link.writer_id
        try:
            ray.get(self.link.handle.receive.remote(ticket, boxed), timeout=self.config.write_timeout_s)
            boxed.clear()  # the writer holds its own copy now; free ours
            next_warning = time.monotonic() + self.config.warn_interval_s
            while True:
                outcome = ray.get(self.link.handle.wait.remote(ticket.key, _POLL_S), timeout=_POLL_S + 60)
                if outcome is not None:
                    return outcome
                now = time.monotonic()
                if self._closed or now > deadline:
                    why = "checkpointer closed" if self._closed else (
                        f"not durable within CheckpointConfig.write_timeout_s={self.config.write_timeout_s}")
                    return ShardOutcome(ticket.session, ticket.step, False, why)
                if now > next_warning:
                    logger.warning("rank %d: checkpoint step %d not durable after %.0f s (writer %s)",
                                   self.rank, ticket.step, now - deadline + self.config.write_timeout_s,
                                   writer_id)
                    next_warning = now + self.config.warn_interval_s
        except RayActorError as exc:
            self._replace_writer()
            return ShardOutcome(ticket.session, ticket.step, False,
                                f"writer {writer_id} died during the save ({type(exc).__name__})")
        except GetTimeoutError:
            return ShardOutcome(ticket.session, ticket.step, False, f"writer {writer_id} did not answer")

    def _replace_writer(self) -> None:
        try:
            self.link.replace()
        except Exception as exc:  # noqa: BLE001 - retried at the next save
            logger.warning("rank %d: could not replace the checkpoint writer: %s", self.rank, exc)

    def _record(self, ticket: SaveTicket, outcome: ShardOutcome) -> None:
        if outcome.ok:
            self.stats.counts["durable"] += 1
            self.stats.last_durable_step = ticket.step
            self.stats.durable_latency_s.append(time.time() - ticket.staged_at)
            return
        self.stats.counts["failed"] += 1
        self.stats.last_error = f"step {ticket.step}: {outcome.error}"
        logger.warning("rank %d: checkpoint of step %d was not saved: %s. Training continues; the "
                       "previous committed checkpoint stays loadable.", self.rank, ticket.step, outcome.error)
