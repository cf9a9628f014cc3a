"""How a claimed snapshot gets from a rank to its checkpoint writer.

The writer takes it without a copy: it adopts the slot's shared memory (`shm.py`: opens the
rank's buffer through a file of its own, so the snapshot outlives the rank), and gives the memory
back to the rank once a newer commit replaced it in the memory tier (`take_spare`), so a save
touches no new memory once the first two exist. The rank offers the staged snapshot under an
export id and sends the writer its ticket (`Writer.receive`) with where its slot lies in shared
memory (`staged`); once the writer holds the memory it says so (`taken(export_id, kept=True)`)
and the rank drops the slot. Where it cannot adopt it, it maps the slot and copies it. A slot
that is not shared (pinned memory on GPU) or that the writer cannot map: the writer lends the
rank a buffer and asks the rank's actor to fill it
(`export_snapshot`, which runs `SnapshotExports.export(export_id, into)`); where the rank cannot
map that buffer either (another node), `export` returns the whole snapshot: an actor call's
return value is owned by the caller, so that object is the writer's from the start. The slot
holding the snapshot stays busy until the writer took it.

A pipeline built without an exporter (no rank actor to ask) puts the snapshot in the object store
itself and frees the slot at once; the writer copies that object into one of its own, which
costs the second copy (docs/design.md, "Writers").
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from ray_resilience._internal.calls import ACTOR_GONE
from ray_resilience._internal.checkpoint.rank.slots import RankSaveStats, Slot, SlotPool
from ray_resilience._internal.checkpoint.rank.writer_link import WriterLink
from ray_resilience._internal.checkpoint.service.warm_import import dumps
from ray_resilience._internal.checkpoint.shm import MAPS, BufferHandle, SharedBuffer
from ray_resilience._internal.checkpoint.wire import (
    NEED_PLAN,
    FilledPayload,
    SaveTicket,
    ShardOutcome,
    ShardPayload,
)
from ray_resilience.checkpoint.config import CheckpointConfig

Source = tuple[Any, str]
"""Where the writer takes a snapshot from: the rank's actor and the export id to ask it for."""


class SnapshotExports:
    """One rank's hand-overs to its writer, and the snapshots offered until the writer takes
    them. Shares the pipeline's condition: an offered snapshot is held in one of its slots."""

    def __init__(self, *, cond: threading.Condition, link: WriterLink, config: CheckpointConfig,
                 exporter: Any, replace_writer: Callable[[], None],
                 pool: SlotPool | None = None, stats: RankSaveStats | None = None) -> None:
        self.link, self.config = link, config
        self._pool, self._stats = pool, stats
        """The rank's slots (spares given back join them) and its counters."""
        self._closed = False
        self.exporter = exporter
        """The actor whose `export_snapshot(export_id)` returns `export(export_id)`: this rank's
        (None: the rank puts snapshots in the object store itself and the writer copies them)."""
        self._cond = cond
        self._replace_writer = replace_writer
        self._offered: dict[str, ShardPayload] = {}
        """Snapshots offered to the writer until it takes them (`export`), by export id."""
        self._slots: dict[str, Slot] = {}
        """The slot each offered snapshot is in, by export id."""
        self._seq = 0
        self._writer_plans: set[tuple[str, str]] = set()
        """(writer id, plan id) of the plans a writer was sent (rounds thread only)."""

    def box(self, payload: ShardPayload) -> list:
        """What the writer is given along with the ticket: without an exporter, the snapshot put
        in the object store by this rank (the writer copies it); else nothing."""
        return [ray.put(payload)] if self.exporter is None else []

    def offer(self, ticket: SaveTicket, slot: Slot, payload: ShardPayload) -> Source | None:
        """Under the condition: offers `slot`'s snapshot for the writer to take; where it takes it
        from. None without an exporter: the snapshot was put (`box`), so the slot is freed now."""
        if self.exporter is None:
            slot.release()
            self._cond.notify_all()
            return None
        self._seq += 1
        export_id = f"{ticket.session}/{ticket.step}/{self._seq}"
        self._offered[export_id] = payload
        self._slots[export_id] = slot
        return self.exporter, export_id

    @staticmethod
    def staged(slot: Slot, payload: ShardPayload,
               source: Source | None) -> tuple[BufferHandle, FilledPayload] | None:
        """Where the writer maps `slot`'s snapshot, and the rest of it (None: the slot is not in
        shared memory, or there is no exporter to keep the slot busy while the writer copies)."""
        handle = slot.buffers.handle
        if handle is None or source is None:
            return None
        return handle, FilledPayload(payload.spans, payload.blobs, payload.extra)

    def send(self, ticket: SaveTicket, slot: Slot, boxed: list, source: Source | None,
             staged: tuple[BufferHandle, FilledPayload] | None = None) -> ShardOutcome | None:
        """Gives the writer the ticket and the snapshot (`box`, `offer`, `staged`); None when it
        took it, else the failed outcome. An offer ends here, taken or not, and frees its slot."""
        try:
            return self._receive(ticket, boxed, source, staged)
        finally:
            if source is not None:
                with self._cond:  # taken (the object is the writer's) or given up: free the slot
                    self._offered.pop(source[1], None)
                    self._slots.pop(source[1], None)
                    slot.release()
                    self._cond.notify_all()

    def export(self, export_id: str,
               into: BufferHandle | None = None) -> ShardPayload | FilledPayload | None:
        """The snapshot offered under `export_id` (the writer's call, through the rank actor);
        None when it was given up. With `into` (a buffer the writer lends) the tensor bytes are
        copied there and the rest is returned; else, or where `into` cannot be mapped here, the
        whole snapshot (what this returns becomes an object the writer owns). The slot stays
        busy until `send` returns, so the bytes do not change while they are copied."""
        with self._cond:
            payload = self._offered.get(export_id)
            if payload is None or into is None or into.nbytes != payload.data.nbytes:
                return self._offered.pop(export_id, None)
        if not MAPS.fill(into, payload.data):
            with self._cond:
                return self._offered.pop(export_id, None)
        with self._cond:  # given up while copying: the slot may have changed under the copy
            return (None if self._offered.pop(export_id, None) is None
                    else FilledPayload(payload.spans, payload.blobs, payload.extra))

    def taken(self, export_id: str, kept: bool = False) -> bool:
        """The writer took the snapshot offered under `export_id` from its shared slot: the offer
        ends; `kept`: it adopted the slot's memory, which this rank then never writes again (the
        slot is dropped once free). False when it was given up first: the slot may have changed
        meanwhile, and the writer throws what it took away."""
        with self._cond:
            slot = self._slots.get(export_id)
            if self._offered.pop(export_id, None) is None:
                return False
            if kept and slot is not None:
                slot.given_away = True
            return True

    def take_spare(self, handle: BufferHandle) -> bool:
        """The writer gives back shared memory it adopted with an earlier save (a newer commit
        replaced it): adopted here for the next new slot of its size. False when not taken (one
        of that size is held, the pipeline closed, or it cannot be opened here): the writer
        keeps it."""
        with self._cond:
            if self._closed or self._pool is None or not self._pool.wants_spare(handle.nbytes):
                return False
        buffer = SharedBuffer.adopted(handle)
        if buffer is None:
            return False
        with self._cond:
            taken = not self._closed and self._pool.add_spare(buffer)
        if not taken:
            buffer.close()
        elif self._stats is not None:
            self._stats.counts["spares_taken"] += 1
        return taken

    def close(self) -> None:
        """No more spares are taken (the pipeline is closing)."""
        with self._cond:
            self._closed = True

    def _receive(self, ticket: SaveTicket, boxed: list, source: Source | None,
                 staged: tuple[BufferHandle, FilledPayload] | None) -> ShardOutcome | None:
        """`Writer.receive`. The plan goes to a writer once; later tickets name it by id."""
        writer_id = self.link.writer_id
        plan = (writer_id, ticket.plan_id)
        try:
            answer = NEED_PLAN
            if plan in self._writer_plans:
                lean = dataclasses.replace(ticket, items=None, planner_data=None)
                answer = ray.get(self.link.handle.receive.remote(dumps(lean), boxed,
                                                                 source=source, staged=staged),
                                 timeout=self.config.write_timeout_s)
            if answer == NEED_PLAN:
                answer = ray.get(self.link.handle.receive.remote(dumps(ticket), boxed,
                                                                 source=source, staged=staged),
                                 timeout=self.config.write_timeout_s)
                self._writer_plans.add(plan)
            if answer is not None and answer != NEED_PLAN:
                return ShardOutcome(ticket.session, ticket.step, False, str(answer))
            return None
        except (*ACTOR_GONE, GetTimeoutError) as exc:
            return writer_failed(ticket, writer_id, exc, self._replace_writer)
        finally:
            boxed.clear()  # the writer holds its own object now (or the save is lost): free ours


def writer_failed(ticket: SaveTicket, writer_id: str, exc: Exception,
                  replace_writer: Callable[[], None]) -> ShardOutcome:
    """The failed outcome of a save whose call to its writer raised `exc` (ACTOR_GONE: the
    writer died or its node is gone, and it is replaced; GetTimeoutError: it did not answer)."""
    if isinstance(exc, ACTOR_GONE):
        replace_writer()
        return ShardOutcome(ticket.session, ticket.step, False,
                            f"writer {writer_id} died during the save ({type(exc).__name__})")
    return ShardOutcome(ticket.session, ticket.step, False, f"writer {writer_id} did not answer")
