"""`CheckpointWriter`: the node-local writer actor.

It takes a rank's snapshot over in shared memory (`shm.py`: it adopts the rank's shared staging
slot, no copy, and gives the memory back to the rank once nothing here uses it, so the same
buffers serve save after save), persists it in a thread, reports durability to the
coordinator, keeps the newest committed shard as the memory tier, and holds replicas of other
writers' shards (`hold_replica`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray

from ray_resilience._internal.checkpoint.format import commit, layout
from ray_resilience._internal.checkpoint.format.lease import Fence
from ray_resilience._internal.checkpoint.format.local_roots import RootLock, node_root
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage, retrying
from ray_resilience._internal.checkpoint.service.intake import SnapshotIntake
from ray_resilience._internal.checkpoint.service.replica_pull import pull_replica
from ray_resilience._internal.checkpoint.service.warm_import import WarmImport, dumps
from ray_resilience._internal.checkpoint.shm import BufferHandle, Lease
from ray_resilience._internal.checkpoint.wire import (
    NEED_PLAN,
    FilledPayload,
    MemoryEntry,
    SaveTicket,
    ShardOutcome,
    ShardPayload,
    ShardReport,
)
from ray_resilience._internal.constants import checkpoint_call_timeout_s
from ray_resilience._internal.priority import lower_process
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import CheckpointStorageError

logger = logging.getLogger(__name__)
Key = tuple[str, int, int]  # (session, step, rank)
MAX_PLANS = 256
"""Save plans a writer keeps (a plan changes only when a rank's state changes structure)."""


@dataclasses.dataclass
class _Shard:
    ticket: SaveTicket
    boxed: list[Any]
    """The snapshot: its `ShardPayload` in this writer's shared memory, or an object it owns."""
    nbytes: int
    durable: bool = False
    report: tuple[str, float, bytes] | None = None
    """What `shard_durable` was sent (sent again to a restarted coordinator)."""


class CheckpointWriter:
    """Persists shards handed over by the ranks of its node; the coordinator wraps it with
    `ray.remote`. At most one shard per rank is in flight."""

    def __init__(self, *, writer_id: str, storage: CheckpointStorage, config: CheckpointConfig,
                 coordinator: Any, memory_budget_bytes: int | None,
                 local_root: str | None = None) -> None:
        self.writer_id, self.storage, self.config = writer_id, storage, config
        self._coordinator, self._budget = coordinator, memory_budget_bytes
        self._cond = threading.Condition()
        self._shards: dict[Key, _Shard] = {}
        self._outcomes: dict[Key, ShardOutcome] = {}
        self._memory: dict[int, MemoryEntry] = {}
        self._plans: dict[tuple[int, str], tuple[list, dict]] = {}
        """(rank, plan id) -> (items, planner data) of the plans ranks sent, newest last."""
        self._replicas: dict[int, MemoryEntry] = {}
        """Other writers' ranks' shards of the newest commit, held as replicas."""
        self._commit_seq = 0
        """The newest commit heard of: threaded calls may run out of order."""
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"rr-writer-{writer_id}")
        self._node_id = ray.get_runtime_context().get_node_id()
        self._lent: dict[str, tuple[ShardPayload, float]] = {}
        """Memory-tier payloads a loading rank is reading, by token, until when at the latest."""
        self._counts = {"received": 0, "adopted": 0, "pulled": 0, "filled": 0, "copied": 0,
                        "unmapped": 0, "durable": 0, "failed": 0, "retries": 0,
                        "replicas_sent": 0, "replicas_held": 0, "replicas_refused": 0,
                        "memory_mapped": 0, "memory_objects": 0, "spares_given": 0,
                        "spares_refused": 0, "superseded": 0}
        """How snapshots came in: adopted (the rank's shared slot, its memory taken over, no
        copy), pulled (copied here from the rank's shared slot, which could not be adopted),
        filled (the rank copied into a buffer lent to it), copied (an object put by a rank,
        copied here), unmapped (the rank could not map the buffer lent to it and returned an
        object); memory_mapped / memory_objects: memory-tier shards lent to a loader on this
        node / copied into an object for one elsewhere; spares_given / spares_refused: adopted
        memory given back to its rank / kept here because the rank did not take it; superseded:
        unfinished shards dropped for a newer save of the same rank (answered as not saved)."""
        self._intake = SnapshotIntake(writer_id=writer_id, node_id=self._node_id,
                                      executor=self._pool, cond=self._cond, counts=self._counts)
        self._buffers = self._intake.buffers
        """The shared memory snapshots are handed over in and the memory tier is kept in."""
        self._last_error: str | None = None
        self._local = RootLock(node_root(local_root)) if local_root is not None else None
        """Holds the run's local-tier folder on this node (removed when the run ends)."""
        # DCP is imported once `warm` is called (after the run's first step, not beside the
        # ranks' own start-up, unless the node has idle cores: worker_group/imports.py) or the
        # first message needs it, at the ranks' priority (its thread is kept out of the
        # lowering below): no commit is made before it is done.
        # With no periodic saves (local tier only) nothing may ever arrive: nothing to import.
        self._warm = (WarmImport("ray_resilience._internal.checkpoint.format.shard_io",
                                 "ray_resilience._internal.checkpoint.format.dcp_metadata")
                      if config.interval_steps else WarmImport())
        self.priority = lower_process(config.writer_priority_now, keep=(self._warm.thread_id,))

    def ping(self) -> dict[str, Any]:
        return {"writer_id": self.writer_id, "pid": os.getpid(), "priority": self.priority,
                "node_id": self._node_id, "dcp_import": self._warm.state}

    def remove_local_root(self) -> None:
        """The run ended: removes the local-tier snapshots of this node's ranks."""
        if self._local is not None:
            self._local.remove()

    def warm(self) -> bool:
        """Starts the background import of DCP (the first write needs it); returns at once."""
        self._warm.start()
        return True

    def ready(self) -> bool:
        """Returns once the background import of DCP is done (starting it if need be)."""
        self._warm.wait()
        return True

    def receive(self, message: bytes, boxed: list[Any], source: tuple[Any, str] | None = None,
                staged: tuple[BufferHandle, FilledPayload] | None = None) -> str | None:
        """Takes a rank's pickled `SaveTicket` and its snapshot (`intake.SnapshotIntake`), and
        queues the write. The snapshot is in the rank's slot, which `staged` says where to find:
        its memory adopted (where it cannot be opened here, copied into a buffer of ours); else
        it is `source`'s (the rank's actor and an export id): asked
        for here, the rank copies it into a buffer this writer lends (or, where it cannot map
        it, returns it as an object this writer owns, kept as it is); else the object in `boxed`,
        which the rank owns and which is copied into a buffer of ours (it would vanish with the
        rank). The rank keeps the slot as it is until this returns. Returns None when taken,
        `NEED_PLAN` (taking nothing) when the ticket names an unknown plan, else why the
        snapshot could not be taken."""
        ticket: SaveTicket = self._warm.loads(message)
        plan_key = (ticket.rank, ticket.plan_id)
        with self._cond:
            if ticket.items is not None:
                self._plans.pop(plan_key, None)  # re-inserted last: the newest plans stay
                self._plans[plan_key] = (ticket.items, ticket.planner_data)
                while len(self._plans) > MAX_PLANS:
                    del self._plans[next(iter(self._plans))]
            elif plan_key in self._plans:
                ticket.items, ticket.planner_data = self._plans[plan_key]
            else:
                return NEED_PLAN
        self._expire_lent()
        took = self._intake.take(ticket, boxed, source, staged)
        del boxed
        if isinstance(took, str):
            return took
        own, nbytes = took
        with self._cond:
            for key in [k for k in self._outcomes if k[2] == ticket.rank]:
                del self._outcomes[key]  # answers of this rank's older saves: nobody asks now
            for key in [k for k in self._shards
                        if k[2] == ticket.rank and not self._shards[k].durable]:
                # An older unfinished save of this rank (its rank restarted or stopped waiting):
                # dropped, with an answer for whoever still waits on it. A write already under
                # way ends as it would (the coordinator may still commit it), unrecorded here.
                del self._shards[key]
                if key != ticket.key:  # the same save sent again is answered by its new write
                    self._outcomes[key] = ShardOutcome(
                        key[0], key[1], False, f"superseded by the same rank's save of step "
                        f"{ticket.step} before it was durable")
                    self._counts["superseded"] += 1
            self._shards[ticket.key] = _Shard(ticket, [own], nbytes)
            self._counts["received"] += 1
            self._cond.notify_all()
        self._pool.submit(self._persist, ticket.key)
        return None

    def _persist(self, key: Key) -> None:
        with self._cond:
            shard = self._shards.get(key)
        if shard is None:
            return
        ticket, start = shard.ticket, time.time()
        from ray_resilience._internal.checkpoint.format.shard_io import (  # noqa: PLC0415 - imported by self._warm
            skip_zip_crc,
            write_shard,
        )

        skip_zip_crc()

        try:
            payload = _payload_of(shard.boxed[0])
            files, written, infos = self._retrying(
                lambda: write_shard(self.storage, ticket, payload,
                                    direct=self.config.direct_io),
                f"writing rank {ticket.rank}'s shard of step {ticket.step}")
        except Exception as exc:  # noqa: BLE001 - any failure loses this shard only
            self._fail(key, ticket, exc, time.time() - start)
            return
        report = ShardReport(
            session=ticket.session, step=ticket.step, rank=ticket.rank,
            world_size=ticket.world_size, writer_id=self.writer_id, files=files,
            written_items=written, storage_infos=infos,
            planner_data=ticket.planner_data, staged_at=ticket.staged_at, durable_at=time.time(),
            nbytes=shard.nbytes)
        with self._cond:
            shard.durable = True
            shard.report = (self.writer_id, ticket.staged_at, dumps(report))
            if not self.config.memory_tier:
                shard.boxed.clear()
            held = self._shards.get(key) is shard
        self._coordinator.shard_durable.remote(
            ticket.session, ticket.step, ticket.rank, ticket.world_size, shard.report)
        self._finish(key, ShardOutcome(ticket.session, ticket.step, True,
                                       write_s=time.time() - start), answer=held)

    def resend_durable(self) -> int:
        """Reports again every durable shard not yet committed (the coordinator restarted and
        lost the reports it had); returns how many."""
        with self._cond:
            held = [s for s in self._shards.values() if s.durable and s.report is not None]
        for shard in held:
            ticket = shard.ticket
            self._coordinator.shard_durable.remote(ticket.session, ticket.step, ticket.rank,
                                                   ticket.world_size, shard.report)
        return len(held)

    def commit_step(self, session: str, step: int, reports: dict[int, bytes],
                    fence: Fence | None = None) -> None:
        """Builds DCP's `.metadata` from every rank's `ShardReport` and writes it and the commit
        manifest, retried like shard writes, the run's lease checked right before the manifest;
        raises when the step could not be committed (LeaseLostError: this job lost the run)."""
        # DCP: imported by the WarmImport thread, never at this module's import.
        from ray_resilience._internal.checkpoint.format.dcp_metadata import (  # noqa: PLC0415 - see above
            build_metadata,
            dumps_metadata,
        )

        ordered: list[ShardReport] = [self._warm.loads(reports[r]) for r in sorted(reports)]
        step_dir = layout.StepDir(step, session)
        metadata = dumps_metadata(build_metadata(
            [(r.written_items, r.storage_infos) for r in ordered],
            planner_data=ordered[0].planner_data, checkpoint_id=self.storage.display(step_dir.name),
            save_id=step_dir.name))
        files = {name: digest for r in ordered for name, digest in r.files.items()}
        self._retrying(lambda: commit.commit_step(self.storage, step_dir, world_size=len(ordered),
                                                  metadata=metadata, files=files,
                                                  fence=None if fence is None else fence.check),
                       f"committing step {step}")

    def _retrying(self, fn: Any, what: str) -> Any:
        """`fn()` retried on storage errors as configured; every retry counted in `stats`."""
        return retrying(fn, what=what, num_retries=self.config.num_storage_retries,
                        backoff_s=self.config.storage_retry_backoff_s,
                        max_backoff_s=self.config.storage_retry_max_backoff_s,
                        on_retry=self._on_retry)

    def _on_retry(self, err: CheckpointStorageError, delay_s: float) -> None:
        self._counts["retries"] += 1
        self._last_error = str(err)

    def _fail(self, key: Key, ticket: SaveTicket, exc: BaseException, write_s: float) -> None:
        message = f"{type(exc).__name__}: {exc}"
        logger.warning("writer %s: rank %d's shard of checkpoint step %d was not written: %s",
                       self.writer_id, ticket.rank, ticket.step, message)
        self._last_error = message
        with self._cond:
            held = self._shards.get(key) is not None and self._shards[key].ticket is ticket
            if held:
                del self._shards[key]
        self._coordinator.shard_failed.remote(ticket.session, ticket.step, ticket.rank, message)
        self._finish(key, ShardOutcome(ticket.session, ticket.step, False, message, write_s),
                     answer=held)

    def _finish(self, key: Key, outcome: ShardOutcome, *, answer: bool) -> None:
        """Counts a write's end; `answer`: it is the key's answer to a waiter (False for a shard
        superseded while it was written: `receive` answered for it)."""
        with self._cond:
            self._counts["durable" if outcome.ok else "failed"] += 1
            if answer:
                self._outcomes[key] = outcome
                self._cond.notify_all()

    def wait(self, key: Key, timeout_s: float) -> ShardOutcome | None:
        """The outcome of a shard once it is durable or given up; None if still writing."""
        key = tuple(key)
        with self._cond:
            self._cond.wait_for(lambda: key in self._outcomes, timeout=timeout_s)
            return self._outcomes.pop(key, None)

    def on_commit(self, session: str, step: int, seq: int = 0,
                  replica_holders: dict[int, list[Any]] | None = None) -> None:
        """The coordinator's `seq`-th commit: its shards become the memory tier, older ones are
        dropped, and each goes to the writers `replica_holders` names."""
        promoted: list[tuple[int, MemoryEntry]] = []
        with self._cond:
            if seq < self._commit_seq:
                return  # a newer commit was applied first
            self._commit_seq = seq
            # First, so the budget counts only what stays.
            for held in (self._memory, self._replicas):
                for rank, entry in list(held.items()):
                    if (entry.session, entry.step) != (session, step):
                        del held[rank]
            for key, shard in list(self._shards.items()):
                if (key[0], key[1]) == (session, step) and shard.durable:
                    del self._shards[key]
                    entry = self._promote(shard)
                    if entry is not None:
                        promoted.append((shard.ticket.rank, entry))
                elif shard.durable and (key[0] != session or key[1] < step):
                    del self._shards[key]
        me = ray.get_runtime_context().current_actor if promoted and replica_holders else None
        for rank, entry in promoted:
            for holder in (replica_holders or {}).get(rank, ()):
                holder.hold_replica.remote(rank, session, step, seq, dumps(entry.items), me,
                                           entry.nbytes)
                self._counts["replicas_sent"] += 1

    def _promote(self, shard: _Shard) -> MemoryEntry | None:
        if not self.config.memory_tier or not shard.boxed:
            return None
        rank = shard.ticket.rank
        if not self._fits(rank, shard.nbytes, self._memory):
            self._over_budget(f"rank {rank}'s shard of step {shard.ticket.step}", shard.nbytes)
            return None
        entry = self._memory[rank] = MemoryEntry(shard.ticket.session, shard.ticket.step,
                                                 shard.ticket.items, shard.boxed, shard.nbytes)
        return entry

    def _fits(self, rank: int, nbytes: int, into: dict[int, MemoryEntry]) -> bool:
        """Whether `nbytes` more (replacing `rank`'s entry in `into`) stay within the budget."""
        if self._budget is None:
            return True
        return self._held_bytes(rank, into) + nbytes <= self._budget

    def _held_bytes(self, rank: int, into: dict[int, MemoryEntry]) -> int:
        return sum(e.nbytes for held in (self._memory, self._replicas)
                   for r, e in held.items() if not (held is into and r == rank))

    def _over_budget(self, what: str, nbytes: int) -> None:
        """Says once per writer, with the numbers, that the budget keeps a shard out."""
        self._counts["over_budget"] = self._counts.get("over_budget", 0) + 1
        log = logger.warning if self._counts["over_budget"] == 1 else logger.debug
        log("writer %s: %s (%.2f GB) is not kept in memory: this writer already holds %.2f GB "
            "and its share of CheckpointConfig.memory_budget_bytes=%s is %.2f GB (the node's "
            "budget, the node's object store size when it is None, over writers_per_node=%d); "
            "ranks without a copy in memory restore from storage. Raise memory_budget_bytes "
            "(within the node's memory) or lower memory_replicas.", self.writer_id, what,
            nbytes / 1e9,
            sum(e.nbytes for h in (self._memory, self._replicas) for e in h.values()) / 1e9,
            self.config.memory_budget_bytes, (self._budget or 0) / 1e9,
            self.config.writers_per_node)

    def hold_replica(self, rank: int, session: str, step: int, seq: int, items: bytes,
                     source: Any, nbytes: int) -> bool:
        """Keeps a copy of `rank`'s committed shard that writer `source` holds, pulled in
        chunks at `CheckpointConfig.replica_bytes_per_s`; False when a newer commit came first,
        the budget is full or the source is gone."""
        with self._cond:
            if seq < self._commit_seq or not self._fits(rank, nbytes, self._replicas):
                if seq >= self._commit_seq:
                    self._over_budget(f"the replica of rank {rank}'s step {step}", nbytes)
                self._counts["replicas_refused"] += 1
                return False
        leases: list[Lease] = []

        def allocate(nbytes: int) -> np.ndarray:
            leases.append(self._buffers.take(("replica", rank), nbytes))
            return leases[-1].array

        try:
            entry_items = self._warm.loads(items)
            payload = pull_replica(source, rank, session, step,
                                   rate=self.config.replica_bytes_per_s, allocate=allocate)
        except Exception as exc:  # noqa: BLE001 - storage remains the fallback
            logger.warning("writer %s: no replica of rank %d's step %d (%s: %s)", self.writer_id,
                           rank, step, type(exc).__name__, exc)
            payload = None
        if payload is None:
            self._counts["replicas_refused"] += 1
            return False
        payload.keep = leases[0]
        own = payload
        del payload
        leases.clear()
        with self._cond:
            if seq < self._commit_seq or not self._fits(rank, nbytes, self._replicas):
                self._counts["replicas_refused"] += 1
                return False
            self._commit_seq = seq  # this commit's broadcast may not have run here yet
            self._replicas[rank] = MemoryEntry(session, step, entry_items, [own], nbytes)
            self._counts["replicas_held"] += 1
        return True

    def replica_part(self, rank: int, session: str, step: int, offset: int | None,
                     length: int = 0) -> Any:
        """A part of `rank`'s shard of (session, step) from this writer's memory tier: its
        layout (spans, byte items, extra state, data length) when `offset` is None, else
        `length` bytes of its tensor data; None when the shard is no longer held."""
        with self._cond:
            entry = self._memory.get(rank)
            if entry is None or (entry.session, entry.step) != (session, step):
                return None
            held = entry.boxed[0]
        payload = _payload_of(held)
        if offset is None:
            return payload.spans, payload.blobs, payload.extra, len(payload.data)
        return payload.data[offset:offset + length]

    def memory_entry(self, rank: int, session: str, step: int,
                     node_id: str | None = None) -> MemoryEntry | None:
        """`rank`'s shard of committed (session, step) if held in memory (own or replica), for a
        rank on node `node_id` to load: on this node, where in this writer's shared memory it
        is (lent until `return_lent` or a timeout, so no save reuses it meanwhile); elsewhere,
        in an object (a copy)."""
        with self._cond:
            for held in (self._memory, self._replicas):
                entry = held.get(rank)
                if entry is not None and (entry.session, entry.step) == (session, step):
                    break
            else:
                return None
        payload = entry.boxed[0]
        if not isinstance(payload, ShardPayload):  # an object-store object
            return entry
        rest = FilledPayload(payload.spans, payload.blobs, payload.extra)
        if node_id == self._node_id and isinstance(payload.keep, Lease):
            token = uuid.uuid4().hex
            with self._cond:
                self._lent[token] = (payload, time.monotonic() + 4 * checkpoint_call_timeout_s())
                self._counts["memory_mapped"] += 1
            return dataclasses.replace(entry, boxed=[], shm=(payload.keep.handle, rest),
                                       lent=token)
        copy = ShardPayload(payload.data, rest.spans, rest.blobs, rest.extra)
        with self._cond:
            self._counts["memory_objects"] += 1
        return dataclasses.replace(entry, boxed=[ray.put(copy)])

    def return_lent(self, token: str) -> None:
        """A loading rank has read the memory-tier shard `memory_entry` lent it."""
        with self._cond:
            self._lent.pop(token, None)

    def _expire_lent(self) -> None:
        now = time.monotonic()
        with self._cond:
            expired = [t for t, (_, until) in self._lent.items() if until < now]
            gone = [self._lent.pop(t) for t in expired]
        del gone  # outside the condition: a buffer given back takes the pool's lock

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "writer_id": self.writer_id, **self._counts, "last_error": self._last_error,
                "memory_tier_bytes": sum(e.nbytes for e in self._memory.values()),
                "replica_bytes": sum(e.nbytes for e in self._replicas.values()),
                "in_flight_bytes": sum(s.nbytes for s in self._shards.values() if s.boxed),
                "buffers": self._buffers.stats(), "lent": len(self._lent),
                "memory_tier_steps": {r: e.step for r, e in self._memory.items()},
                "replica_steps": {r: e.step for r, e in self._replicas.items()},
                "in_flight": sorted([list(k) for k in self._shards]),
                "dcp_import": self._warm.state, "dcp_import_started_at": self._warm.started_at,
            }


def _payload_of(held: Any) -> ShardPayload:
    """A held snapshot's payload: itself (in this writer's shared memory) or its object's."""
    return held if isinstance(held, ShardPayload) else ray.get(held)
