"""How a checkpoint writer takes a rank's snapshot over, and gives adopted memory back.

In order of preference: it adopts the rank's shared staging slot (`shm.BufferPool.adopt`, no
copy; the rank then drops the slot), or maps the slot and copies it into a buffer of its own;
for a slot that is not shared (pinned memory on GPU) it lends the rank a buffer to fill; for a
rank built without an exporter it copies the object the rank put. Adopted memory that nothing
in the writer uses any more (written, and with the memory tier a newer commit replaced it) goes
back to its rank (`take_spare`), which stages its next save into it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from typing import Any

import numpy as np
import ray

from ray_resilience._internal.checkpoint.shm import MAPS, BufferHandle, BufferPool
from ray_resilience._internal.checkpoint.wire import FilledPayload, SaveTicket, ShardPayload
from ray_resilience._internal.constants import checkpoint_call_timeout_s


class SnapshotIntake:
    """One writer's intake of snapshots; counts each way a snapshot came in (`counts`, shared
    with the writer's stats, under `cond`)."""

    def __init__(self, *, writer_id: str, node_id: str, executor: Executor,
                 cond: threading.Condition, counts: dict[str, int]) -> None:
        self._writer_id, self._executor = writer_id, executor
        self._cond, self._counts = cond, counts
        self.buffers = BufferPool(node_id, on_idle=self._offer_spare)
        """The shared memory snapshots are handed over in (and the memory tier is kept in)."""
        self._homes: dict[int, Any] = {}
        """The actor of each rank whose slot memory this writer adopted: where that memory goes
        back to once nothing here uses it (`_give_spare`)."""

    def take(self, ticket: SaveTicket, boxed: list[Any], source: tuple[Any, str] | None,
             staged: tuple[BufferHandle, FilledPayload] | None) -> tuple[Any, int] | str:
        """The snapshot, held by this writer now, and its size in bytes; else why it could not
        be taken (see `CheckpointWriter.receive` for `boxed`, `source` and `staged`)."""
        adopted = slot = None
        if staged is not None and source is not None:
            adopted = self.buffers.adopt(ticket.rank, staged[0])
            if adopted is None:
                slot = MAPS.array(staged[0], writable=False)
        if adopted is not None or slot is not None:
            rank_actor, export_id = source
            if adopted is not None:
                rest = staged[1]
                own = ShardPayload(adopted.array, rest.spans, rest.blobs, rest.extra,
                                   keep=adopted)
            else:
                own = self._copied(ticket.rank, slot, staged[1])
            del slot
            try:
                taken = ray.get(rank_actor.snapshot_taken.remote(export_id, adopted is not None),
                                timeout=checkpoint_call_timeout_s())
            except Exception as exc:  # noqa: BLE001 - this save is lost, the rank is told why
                taken, why = False, (f"writer {self._writer_id} could not take rank "
                                     f"{ticket.rank}'s snapshot of step {ticket.step}: "
                                     f"{type(exc).__name__}: {exc}")
            else:
                why = (f"rank {ticket.rank} gave the snapshot of step {ticket.step} up while "
                       f"writer {self._writer_id} took it")
            if not taken:
                if adopted is not None:  # the rank may still use that memory: never ours
                    adopted.discard()
                return why
            payload = None
            with self._cond:
                self._counts["adopted" if adopted is not None else "pulled"] += 1
                if adopted is not None:
                    self._homes[ticket.rank] = rank_actor
        elif source is not None:
            rank_actor, export_id = source
            lease = self.buffers.take(ticket.rank, ticket.data_nbytes)
            answer = rank_actor.export_snapshot.remote(export_id, lease.handle)
            try:
                got = ray.get(answer, timeout=checkpoint_call_timeout_s())
            except Exception as exc:  # noqa: BLE001 - this save is lost, the rank is told why
                return (f"writer {self._writer_id} could not take rank {ticket.rank}'s snapshot "
                        f"of step {ticket.step}: {type(exc).__name__}: {exc}")
            if got is None:
                return (f"rank {ticket.rank} gave the snapshot of step {ticket.step} up before "
                        f"writer {self._writer_id} took it")
            if isinstance(got, FilledPayload):
                own = ShardPayload(lease.array, got.spans, got.blobs, got.extra, keep=lease)
                with self._cond:
                    self._counts["filled"] += 1
            else:  # the rank could not map our buffer: the returned object is ours, kept as is
                own = answer
                with self._cond:
                    self._counts["unmapped"] += 1
            payload = got
        else:
            payload = ray.get(boxed[0])
            own = self._copied(ticket.rank, payload.data, payload)
            with self._cond:
                self._counts["copied"] += 1
        nbytes = own.nbytes if isinstance(own, ShardPayload) else payload.nbytes
        return own, nbytes

    def _offer_spare(self, key: Any) -> None:
        """The pool has an idle buffer of `key` (called wherever a lease was let go: must not
        block): a rank whose slot memory this writer adopts gets it back, on a pool thread."""
        home = self._homes.get(key) if isinstance(key, int) else None
        if home is None:
            return
        try:
            self._executor.submit(self._give_spare, key, home)
        except RuntimeError:  # the writer is shutting down
            pass

    def _give_spare(self, rank: int, home: Any) -> None:
        """Gives an idle buffer of `rank`'s back to its actor, which adopts it for its next
        snapshot slot: that save then touches no new memory and this writer holds one buffer
        less. Kept here (reused for a save that cannot be adopted) when the rank refuses; closed
        here when it does not answer (it may have taken it)."""
        buffer = self.buffers.claim(rank)
        if buffer is None:
            return
        try:
            given = bool(ray.get(home.take_spare.remote(buffer.handle),
                                 timeout=checkpoint_call_timeout_s()))
            unknown = False
        except Exception:  # noqa: BLE001 - a rank gone or slow to answer
            given, unknown = False, True
        with self._cond:
            self._counts["spares_given" if given else "spares_refused"] += 1
        # No answer: the rank may have adopted it all the same, so it is never reused here.
        self.buffers.settle(rank, buffer, given=given or unknown)

    def _copied(self, rank: int, data: np.ndarray,
                rest: FilledPayload | ShardPayload) -> ShardPayload:
        """`data` copied into a buffer of this writer's pool (the GIL is released meanwhile),
        as a payload with `rest`'s spans, byte items and extra state."""
        lease = self.buffers.take(rank, data.nbytes)
        np.copyto(lease.array, data)
        return ShardPayload(lease.array, rest.spans, rest.blobs, rest.extra, keep=lease)
