"""How a claimed snapshot gets from a rank to its checkpoint writer.

The writer pulls it. The rank offers the staged snapshot under an export id and sends the writer
its ticket (`Writer.receive`); the writer asks the rank's actor for the snapshot
(`export_snapshot`), which returns `SnapshotExports.export(export_id)`. An actor call's return
value is owned by the caller, so the object is the writer's from the start: it outlives the rank
(a Ray object dies with its owner) and the writer keeps it as it is, with no second copy of the
state in the object store. The slot holding the snapshot stays busy until the writer took it.

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
from ray.exceptions import GetTimeoutError, RayActorError

from ray_resilience._internal.checkpoint.rank.slots import Slot
from ray_resilience._internal.checkpoint.rank.writer_link import WriterLink
from ray_resilience._internal.checkpoint.service.warm_import import dumps
from ray_resilience._internal.checkpoint.wire import (
    NEED_PLAN,
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
                 exporter: Any, replace_writer: Callable[[], None]) -> None:
        self.link, self.config = link, config
        self.exporter = exporter
        """The actor whose `export_snapshot(export_id)` returns `export(export_id)`: this rank's
        (None: the rank puts snapshots in the object store itself and the writer copies them)."""
        self._cond = cond
        self._replace_writer = replace_writer
        self._offered: dict[str, ShardPayload] = {}
        """Snapshots offered to the writer until it takes them (`export`), by export id."""
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
        return self.exporter, export_id

    def send(self, ticket: SaveTicket, slot: Slot, boxed: list,
             source: Source | None) -> ShardOutcome | None:
        """Gives the writer the ticket and the snapshot (`box`, `offer`); None when it took it,
        else the failed outcome. An offer ends here, taken or not, and frees its slot."""
        try:
            return self._receive(ticket, boxed, source)
        finally:
            if source is not None:
                with self._cond:  # taken (the object is the writer's) or given up: free the slot
                    self._offered.pop(source[1], None)
                    slot.release()
                    self._cond.notify_all()

    def export(self, export_id: str) -> ShardPayload | None:
        """The snapshot offered under `export_id` (the writer's call, through the rank actor;
        what this returns becomes an object the writer owns); None when it was given up."""
        with self._cond:
            return self._offered.pop(export_id, None)

    def _receive(self, ticket: SaveTicket, boxed: list,
                 source: Source | None) -> ShardOutcome | None:
        """`Writer.receive`. The plan goes to a writer once; later tickets name it by id."""
        writer_id = self.link.writer_id
        plan = (writer_id, ticket.plan_id)
        try:
            answer = NEED_PLAN
            if plan in self._writer_plans:
                lean = dataclasses.replace(ticket, items=None, planner_data=None)
                answer = ray.get(self.link.handle.receive.remote(dumps(lean), boxed,
                                                                 source=source),
                                 timeout=self.config.write_timeout_s)
            if answer == NEED_PLAN:
                answer = ray.get(self.link.handle.receive.remote(dumps(ticket), boxed,
                                                                 source=source),
                                 timeout=self.config.write_timeout_s)
                self._writer_plans.add(plan)
            if answer is not None and answer != NEED_PLAN:
                return ShardOutcome(ticket.session, ticket.step, False, str(answer))
            return None
        except (RayActorError, GetTimeoutError) as exc:
            return writer_failed(ticket, writer_id, exc, self._replace_writer)
        finally:
            boxed.clear()  # the writer holds its own object now (or the save is lost): free ours


def writer_failed(ticket: SaveTicket, writer_id: str, exc: Exception,
                  replace_writer: Callable[[], None]) -> ShardOutcome:
    """The failed outcome of a save whose call to its writer raised `exc` (RayActorError: the
    writer died and is replaced; GetTimeoutError: it did not answer)."""
    if isinstance(exc, RayActorError):
        replace_writer()
        return ShardOutcome(ticket.session, ticket.step, False,
                            f"writer {writer_id} died during the save ({type(exc).__name__})")
    return ShardOutcome(ticket.session, ticket.step, False, f"writer {writer_id} did not answer")
