"""Per-rank save pipeline: the training thread stages a snapshot; a rounds thread votes in the
step's save round and hands a claimed step to the writer; a waiter thread waits for it to be
durable. The training thread never joins a collective or an RPC to save (docs/design.md, 7).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from ray_resilience._internal.calls import ACTOR_GONE
from ray_resilience._internal.checkpoint.format.extra_codec import ExtraSnapshot
from ray_resilience._internal.checkpoint.rank.copier import Copier, new_job
from ray_resilience._internal.checkpoint.rank.drops import DropReporter
from ray_resilience._internal.checkpoint.rank.export import SnapshotExports, writer_failed
from ray_resilience._internal.checkpoint.rank.local.writer import LocalWriter
from ray_resilience._internal.checkpoint.rank.slots import (
    LocalWrite,
    RankSaveStats,
    Slot,
    SlotPool,
    SlotState,
)
from ray_resilience._internal.checkpoint.rank.state_cache import SaveSource
from ray_resilience._internal.checkpoint.rank.writer_link import WriterLink, writer_poll_s
from ray_resilience._internal.checkpoint.service.rounds import RoundResult
from ray_resilience._internal.checkpoint.shm import MAPS
from ray_resilience._internal.checkpoint.wire import SaveTicket, ShardOutcome
from ray_resilience._internal.constants import (
    DEFAULT_VOTE_WAIT_S,
    VOTE_WAIT_ENV_VAR,
    checkpoint_call_timeout_s,
    env_float,
)
from ray_resilience._internal.priority import defer_wakeups
from ray_resilience.checkpoint.config import CheckpointConfig

logger = logging.getLogger(__name__)


def _vote_wait_s() -> float:
    return env_float(VOTE_WAIT_ENV_VAR, DEFAULT_VOTE_WAIT_S)


@dataclasses.dataclass(eq=False)
class _Round:
    session: str
    step: int
    slot: Slot | None
    plan_id: str
    keys: list[tuple[str, int]]
    why: tuple[str, str] | None = None
    """(kind, reason) once this rank dropped the save before its round (`CheckpointDropped`)."""


class HandoffPipeline:
    """One rank's saves after the training thread let go of them."""

    def __init__(self, *, rank: int, world_size: int, config: CheckpointConfig, link: WriterLink,
                 stats: RankSaveStats, copy_delay_s: float = 0.0, local: Any = None,
                 schedule: Any = None, exporter: Any = None) -> None:
        self.rank, self.world_size, self.config = rank, world_size, config
        self.link, self.stats = link, stats
        self.drops = DropReporter(rank, link.coordinator)
        # One lock, a condition per thread: a save wakes only the thread that has work.
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self._handed_cond = threading.Condition(lock)
        self.pool = SlotPool()
        self.copier = Copier(rank=rank, cond=self.cond, stats=stats, done=self._copied,
                             delay_s=copy_delay_s)
        self.local = None if local is None else LocalWriter(
            rank=rank, lock=lock, store=local, schedule=schedule, written=self._local_written,
            settle_gpu=self.copier.settle_gpu)
        self.session: str | None = None
        self.writing: SaveTicket | None = None
        self._rounds: collections.deque[_Round] = collections.deque()
        self._voting: _Round | None = None
        self._sent_plans: set[str] = set()
        self._handed: collections.deque[SaveTicket] = collections.deque()
        self.exports = SnapshotExports(cond=self.cond, link=link, config=config,
                                       exporter=exporter, replace_writer=self._replace_writer,
                                       pool=self.pool, stats=stats)
        self._closed = False
        self._slot_wait_s = 0.0
        """Seconds local steps waited for a slot since `take_slot_wait_s` last read them."""
        self._threads = [
            threading.Thread(target=target, name=f"rr-ckpt-{name}-r{rank}", daemon=True)
            for name, target in (("rounds", self._run_rounds), ("wait", self._run_waiter))]
        for thread in self._threads:
            thread.start()

    def begin_session(self, session: str) -> None:
        """A new attempt: rounds and unvoted snapshots of the old session are dropped."""
        with self.cond:
            self.session, self._sent_plans = session, set()
            removed = [r for r in self._rounds if r is not self._voting]
            for rnd in removed:
                self._rounds.remove(rnd)
            dropped = self.pool.drop_unvoted()
            self.stats.counts["dropped_at_restart"] += dropped
            self.cond.notify_all()
        for rnd in removed:
            self.drops.report(rnd.session, rnd.step, *(rnd.why or (
                "restart", "a new attempt began before its save round")))

    def stage(self, step: int, source: SaveSource, extra: ExtraSnapshot, *,
              copy_all_now: bool, save: bool = True, local: LocalWrite | None = None) -> bool:
        """Takes the snapshot of `step` for a save (or skips it, per policy) and queues its round,
        and/or for the local tier (`local`); whether the save (else the local snapshot) was
        taken."""
        policy, save_step = self.config.in_flight_policy, save
        with self.cond:
            slot, why = None, None
            if save and policy == "skip" and self.busy():
                self.stats.counts["skipped"] += 1
                save = False
                why = ("skipped", "the previous save was still in flight (in_flight_policy="
                                  "'skip')")
            if save or local is not None:
                slot = self._acquire(source, step, save=save, local=local is not None)
                if slot is None:
                    self.stats.counts["skipped" if save else "local_skipped"] += 1
                    if save:
                        why = ("skipped", "two earlier saves still held both of the saves' "
                                          "snapshot slots (being copied, voted on or handed "
                                          "to the writer)")
            rnd = _Round(self.session, step, slot if save else None, source.plan_id, source.keys,
                         why)
            if save_step and (slot is None or not save):
                self._rounds.append(rnd)  # this rank votes "not ready"
                self.cond.notify_all()
            if slot is None:
                return False
            if save:
                slot.ticket = SaveTicket(session=self.session, step=step, rank=self.rank,
                                         world_size=self.world_size, items=source.items, owned=[],
                                         planner_data=source.planner_data,
                                         staged_at=time.time(), plan_id=source.plan_id)
            slot.state, slot.blobs, slot.extra, slot.local = (SlotState.COPYING, source.blobs,
                                                              extra, local)
        # Queued after the synchronous copy, waking one thread (the copier, or the rounds thread).
        later = [] if copy_all_now else source.overlap
        now = list(range(len(source.tensors))) if copy_all_now else source.immediate
        slot.buffers.copy_now(source.tensors, now)
        with self.cond:
            if save:
                self._rounds.append(rnd)
            if later:  # wakes the copier alone; its completion wakes the rounds thread
                self.copier.submit(new_job(slot, source, later))
                if slot.event is not None and local is not None and self.local is not None:
                    self.local.watch_gpu(slot)
            else:
                self._copied(slot, None)
        self.stats.counts["staged" if save else "local_staged"] += 1
        return save or not save_step

    def _acquire(self, source: SaveSource, step: int, *, save: bool,
                 local: bool) -> Slot | None:
        """A slot for the snapshot (caller holds the condition). A save never waits for one (its
        policy decides); a local step waits for the local writer to free one, because every
        local step must be written for a restart to redo at most the interval (the wait is
        charged to the tier's cost)."""
        deadline = time.monotonic() + self.config.write_timeout_s
        writer = self.local
        if writer is not None and writer.store.disabled is not None:
            self.pool.drop_direct()
        direct = writer is not None and local and not save and writer.can_go_direct(source)
        while True:
            slot, withdrawn = (writer.direct_slot(self.pool, source), None) if direct \
                else self.pool.acquire(source.items, source.tensors, local_only=not save,
                                       may_withdraw=save and self.config.in_flight_policy
                                       == "coalesce")
            if withdrawn is not None:
                self._withdraw(withdrawn, step)
            left = deadline - time.monotonic()
            off = direct and writer.store.disabled is not None
            if slot is not None or not local or self._closed or left <= 0 or off:
                return slot
            self.stats.counts["local_slot_waits"] += 1
            waited = time.perf_counter()
            self.cond.wait(min(left, self.config.warn_interval_s))
            self._slot_wait_s += time.perf_counter() - waited

    def take_slot_wait_s(self) -> float:
        """Seconds local steps waited for a slot (the previous write still held it) since the
        last call: the schedule keeps them out of a write's own cost (its interval covers a
        write's wall time instead)."""
        with self.cond:
            waited, self._slot_wait_s = self._slot_wait_s, 0.0
            return waited

    def _withdraw(self, slot: Slot, newer: int) -> None:
        for rnd in self._rounds:
            if rnd.slot is slot:
                rnd.slot = None
                rnd.why = ("coalesced", f"replaced by the save of step {newer} while the "
                                        "previous one was in flight")
        slot.release()
        self.stats.counts["coalesced"] += 1

    def busy(self) -> bool:
        return self.pool.busy() or self.writing is not None or bool(self._rounds)

    def wait_local_idle(self, timeout_s: float) -> bool:
        """Waits until every local snapshot staged so far is on file (or dropped); False on
        timeout."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while any(s.local is not None for s in self.pool.slots) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def wait_idle(self, timeout_s: float | None, *, why: str) -> bool:
        """Waits until nothing is staged, voted on or being written; warns periodically."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        start = time.monotonic()
        with self.cond:
            while self.busy() and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                warn_s = self.config.warn_interval_s
                wait = warn_s if left is None else min(left, warn_s)
                if not self.cond.wait(wait) and self.busy():
                    logger.warning("rank %d: %s; still waiting after %.0f s (%s)", self.rank, why,
                                   time.monotonic() - start, self.describe())
            idle = not self.busy()
        left = 10.0 if deadline is None else deadline - time.monotonic()
        return self.drops.flush(min(left, 10.0)) and idle

    def describe(self) -> str:
        slots = ", ".join(f"step {s.step} {s.state.value}" for s in self.pool.slots if s.state.busy)
        writing = f"step {self.writing.step} being written" if self.writing else "writer idle"
        return f"{slots or 'no snapshot held'}; {writing}; {len(self._rounds)} round(s) open"

    def close(self) -> None:
        self.exports.close()
        with self.cond:
            self._closed = True
            self.cond.notify_all()
            self._handed_cond.notify_all()
        self.copier.close()
        if self.local is not None:
            self.local.close()
        for thread in self._threads:
            thread.join(timeout=writer_poll_s() + _vote_wait_s() + 5.0)
        running = any(t.is_alive() for t in self._threads) or self.copier.running or (
            self.local is not None and self.local.running)
        if not running:
            with self.cond:  # nothing of ours uses the slots any more: their memory goes now
                self.pool.close()

    def _copied(self, slot: Slot, torn: str | None) -> None:
        if torn is not None:
            self.stats.counts["torn"] += 1
        if slot.local is not None and torn is None and self.local is not None \
                and not self._closed:
            slot.state = SlotState.LOCAL
            self.local.submit(slot)
        elif slot.ticket is None or slot.ticket.session != self.session or self._closed:
            slot.release()  # local only and torn, or a new session began while it was copied
        else:
            slot.state, slot.torn = SlotState.STAGED, torn
        self.cond.notify_all()

    def _local_written(self, slot: Slot) -> None:
        slot.local = None
        if slot.ticket is None or slot.ticket.session != self.session or self._closed:
            slot.release()
        else:
            slot.state = SlotState.STAGED
        self.cond.notify_all()

    def _run_rounds(self) -> None:
        defer_wakeups()
        while True:
            with self.cond:
                while not self._closed and not self._rounds:
                    self.cond.wait()
                if self._closed:
                    return
                passed = self._pass_over()
                rnd = self._voting = self._rounds[0]
                ready = self._wait_ready(rnd)
                keys = None if rnd.plan_id in self._sent_plans else rnd.keys
            for given_up in passed:
                self.drops.report(given_up.session, given_up.step, *given_up.why)
            result = self._vote(rnd, ready, keys)
            with self.cond:
                self._voting = None
                if self._rounds and self._rounds[0] is rnd:
                    self._rounds.popleft()
                slot = rnd.slot
                claimed = result.claimed and slot is not None and slot.state is SlotState.VOTING \
                    and rnd.session == self.session and not self._closed
                dropped = None if claimed or self._closed else self._why_dropped(rnd, slot, result)
                if result.reason.startswith(("plan unknown", "round unknown")):
                    self._sent_plans.clear()  # a restarted coordinator: plans go again
                if claimed:
                    slot.state = SlotState.PUTTING
                elif slot is not None and slot.step == rnd.step and slot.state in (
                        SlotState.VOTING, SlotState.STAGED):
                    superseded = result.reason.startswith("not ready")
                    self.stats.counts["coalesced" if superseded else "not_claimed"] += 1
                    slot.release()
                self.cond.notify_all()
            if dropped is not None:
                self.drops.report(rnd.session, rnd.step, *dropped)
            if claimed:
                self._hand_off(slot, result.owned)

    def _pass_over(self) -> list[_Round]:
        """Takes the rounds at the head of the queue that this rank gave up before staging or
        voting (skipped, withdrawn) while a later round waits behind them: the vote in that round
        says "not ready" in theirs (`rounds.py`), so a backlog costs one call, not one each."""
        passed = []
        while len(self._rounds) > 1 and self._rounds[0].slot is None \
                and self._rounds[0].why is not None:
            passed.append(self._rounds.popleft())
        return passed

    def _why_dropped(self, rnd: _Round, slot: Slot | None,
                     result: RoundResult) -> tuple[str, str] | None:
        """(kind, reason) of an unclaimed round, None when another rank was not ready (it says
        why)."""
        if rnd.why is not None:
            return rnd.why
        if slot is not None and slot.step == rnd.step and slot.torn is not None:
            return ("torn", slot.torn)
        if result.not_ready and self.rank not in result.not_ready:
            return None
        if rnd.session != self.session or result.reason == "session ended":
            return ("restart", "a new attempt began before its save round ended")
        return ("not_committed", f"its save round ended unclaimed ({result.reason})")

    def _wait_ready(self, rnd: _Round) -> bool:
        """Under the condition: True (slot now VOTING) or False, once this rank knows."""
        while True:
            slot = rnd.slot
            if self._closed or rnd.session != self.session or slot is None or slot.step != rnd.step:
                return False
            if slot.state is SlotState.COPYING:
                if slot.event is not None:
                    self.copier.settle_gpu(slot)
                else:
                    self.cond.wait()
                continue
            if slot.state is SlotState.LOCAL:
                self.cond.wait()
                continue
            if slot.torn is not None:
                return False
            if self.writing is None and not self.pool.in_state(SlotState.PUTTING):
                slot.state = SlotState.VOTING
                return True
            if self.config.in_flight_policy == "coalesce" and len(self._rounds) > 1:
                rnd.why = ("coalesced", f"replaced by the save of step {self._rounds[-1].step} "
                                        "while the previous one was in flight")
                return False  # a newer save is here: it replaces this one
            self.cond.wait(self.config.warn_interval_s)

    def _vote(self, rnd: _Round, ready: bool, keys: list | None) -> RoundResult:
        coordinator = self.link.coordinator
        deadline = time.monotonic() + self.config.write_timeout_s
        if rnd.session != self.session:
            return RoundResult(False, "session ended")
        try:
            args = (rnd.session, rnd.step, self.rank, ready, rnd.plan_id, keys,
                    _vote_wait_s() if ready else 0.0, self.world_size)
            relay = self.link.relay
            call = relay.vote.remote(coordinator, *args) if relay is not None \
                else coordinator.vote.remote(*args)
            result = ray.get(call, timeout=checkpoint_call_timeout_s())
            if keys is not None:
                with self.cond:
                    self._sent_plans.add(rnd.plan_id)
            if not ready:
                return result or RoundResult(False, "not ready: this rank")
            next_warning = time.monotonic() + self.config.warn_interval_s
            while result is None:
                if self._closed or rnd.session != self.session:
                    return RoundResult(False, "session ended")
                now = time.monotonic()
                if now > deadline:
                    why = ("no outcome within CheckpointConfig.write_timeout_s="
                           f"{self.config.write_timeout_s}")
                    coordinator.withdraw_round.remote(rnd.session, rnd.step, self.rank, why)
                    return RoundResult(False, why)
                if now > next_warning:
                    missing = ray.get(coordinator.round_waiting_for.remote(rnd.session, rnd.step),
                                      timeout=checkpoint_call_timeout_s())
                    logger.warning("rank %d: checkpoint step %d waits for ranks %s to be ready",
                                   self.rank, rnd.step, missing)
                    next_warning = now + self.config.warn_interval_s
                result = ray.get(coordinator.poll_round.remote(rnd.session, rnd.step, self.rank,
                                                               _vote_wait_s()),
                                 timeout=checkpoint_call_timeout_s())
            return result
        except Exception as exc:  # noqa: BLE001 - this save is lost; training goes on
            logger.warning("rank %d: checkpoint step %d: commit coordinator unreachable (%s)",
                           self.rank, rnd.step, exc)
            return RoundResult(False, f"coordinator unreachable: {type(exc).__name__}")

    def _hand_off(self, slot: Slot, owned: tuple[bool, ...]) -> None:
        """Gives the writer the snapshot in `slot` (`SnapshotExports`: it takes it from this rank's
        actor, or copies the object this rank put); the waiter thread then waits until durable."""
        ticket = dataclasses.replace(slot.ticket, owned=list(owned),
                                     data_nbytes=slot.buffers.data.nbytes)
        try:
            slot.wait_copied()  # on GPU the guard may have let the slot go before its copy ended
            payload = slot.buffers.payload(slot.blobs, slot.extra.encode())
            boxed = self.exports.box(payload)
        except Exception as exc:  # noqa: BLE001 - a failed hand-off loses this save only
            with self.cond:
                slot.release()
                self.cond.notify_all()
            self._record(ticket, ShardOutcome(ticket.session, ticket.step, False,
                                              f"snapshot hand-off failed: {exc}"))
            return
        with self.cond:
            source = self.exports.offer(ticket, slot, payload)
            self.writing = ticket
        staged = self.exports.staged(slot, payload, source)
        del payload
        outcome = self.exports.send(ticket, slot, boxed, source, staged)
        if outcome is not None:
            self._finish_write(ticket, outcome)
            return
        with self.cond:
            self._handed.append(ticket)
            self._handed_cond.notify()

    def export(self, export_id: str, into: Any = None) -> Any:
        """The snapshot offered to the writer under `export_id` (`SnapshotExports.export`)."""
        return self.exports.export(export_id, into)

    def _run_waiter(self) -> None:
        defer_wakeups()
        while True:
            with self.cond:
                while not self._closed and not self._handed:
                    self._handed_cond.wait()
                if self._closed:
                    return
                ticket = self._handed.popleft()
            self._finish_write(ticket, self._wait_durable(ticket))

    def _wait_durable(self, ticket: SaveTicket) -> ShardOutcome:
        writer_id = self.link.writer_id
        try:
            return self.link.wait_durable(ticket, self.config, closed=lambda: self._closed)
        except (*ACTOR_GONE, GetTimeoutError) as exc:
            return writer_failed(ticket, writer_id, exc, self._replace_writer)

    def _finish_write(self, ticket: SaveTicket, outcome: ShardOutcome) -> None:
        self._record(ticket, outcome)
        with self.cond:
            if self.writing is ticket:
                self.writing = None
            self.cond.notify_all()

    def _replace_writer(self) -> None:
        MAPS.clear()  # the dead writer's buffers: their memory goes once nothing maps them
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
                       "previous committed checkpoint stays loadable.", self.rank, ticket.step,
                       outcome.error)
        self.drops.report(ticket.session, ticket.step, "failed", str(outcome.error))
