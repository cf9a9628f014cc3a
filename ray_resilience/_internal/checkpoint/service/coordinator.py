"""`CommitCoordinator`: one actor per run. It hands out session ids, decides save rounds, commits
complete steps through a writer (so it never imports torch), keeps the writer pool, tells
writers what to keep in memory and which replicas to hold, quarantines steps that fail to load,
records saves that were never committed, and prunes; commits and deletions go through the run's
lease (`Fence`). It may be restarted: its state comes back from storage, the ranks' calls (their
session) and the writers (their durable shards).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any

import ray

from ray_resilience._internal.calls import ACTOR_GONE
from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.lease import Fence
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.commit_queue import CommitQueue
from ray_resilience._internal.checkpoint.service.dropped import DroppedSaves
from ray_resilience._internal.checkpoint.service.retention import Retention
from ray_resilience._internal.checkpoint.service.rounds import RoundResult, RoundTable
from ray_resilience._internal.checkpoint.service.writer_pool import WriterPool
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import LeaseLostError

logger = logging.getLogger(__name__)

NEWS_RECHECK_S = 0.1
"""How often a long `poll` looks for news while it waits."""


class CommitCoordinator:
    """Commits steps. Plain class; `CheckpointService` wraps it with `ray.remote`."""

    def __init__(self, *, storage: CheckpointStorage, config: CheckpointConfig,
                 local_root: str | None = None, fence: Fence | None = None) -> None:
        self.storage, self.config, self._fence = storage, config, fence
        self._retention = Retention(storage, config, fence)
        self._generation = self._retention.generation
        self._incarnation = uuid.uuid4().hex[:12]
        self._lock = threading.RLock()
        self._session: str | None = None
        self._world_size: int | None = None
        self._queue = CommitQueue()
        self._failed: dict[tuple[str, int], dict[int, str]] = {}
        self._dropped = DroppedSaves()
        folders = storage.list_step_dirs()
        self._last_seq = max((layout.session_order(d.session)[1] for d in folders
                              if layout.session_generation(d.session) == self._generation),
                             default=0)
        self._holders: dict[layout.StepDir, dict[int, list[str]]] = {}
        """Per committed step and rank: the writer of the shard, then the replica holders."""
        self._commit_seq = 0
        self._latencies: collections.deque[float] = collections.deque(maxlen=10_000)
        self._commit_times: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=10_000)
        """(step, wall time) of the newest commits, in commit order."""
        self._counts = collections.Counter()
        self._round_cond = threading.Condition()
        self._polls_released = threading.Event()
        self._rounds = RoundTable()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._pool = WriterPool(storage=storage, config=config,
                                coordinator=ray.get_runtime_context().current_actor,
                                local_root=local_root)
        self._prune()

    def ready(self) -> bool:
        """Answers at once: this actor imports no torch (a writer builds each commit)."""
        return True


    def ensure_writers(self, node_ids_by_rank: list[str],
                       launched: dict[tuple[str, int], tuple[str, Any]] | None = None,
                       resend: bool = False) -> tuple[list[tuple[Any, str]], dict]:
        """(writer handle, writer id) per rank, and every writer by (node, index); dead writers
        replaced, `launched` ones adopted. `resend`: the writers report again the durable shards
        not yet committed (this actor restarted and lost their reports)."""
        pairs = self._pool.ensure(node_ids_by_rank, launched)
        if resend:
            for writer_id in self._pool.writer_ids():
                self._pool.handle(writer_id).resend_durable.remote()
        return pairs, self._pool.slots()

    def replace_writer(self, rank: int, dead_writer_id: str) -> tuple[Any, str]:
        return self._pool.replace(rank, dead_writer_id)


    def new_session(self, world_size: int) -> str:
        """A new attempt starts: its session id (ordered after every earlier one of the run);
        later reports of older sessions are ignored."""
        with self._lock:
            self._last_seq = max(self._last_seq + 1, int(time.time() * 10))
            session = layout.make_session(self._generation, self._last_seq)
        self._begin(session, world_size)
        return session

    def _begin(self, session: str, world_size: int) -> None:
        with self._lock:
            self._session, self._world_size = session, world_size
        for (old, step), _ in self._queue.keep_only(session):
            self._dropped.add(old, step, None, "restart",
                              "a new attempt began before its shards were all durable")
        with self._round_cond:
            self._rounds.begin(session, world_size)
            self._round_cond.notify_all()

    def _adopt(self, session: str, world_size: int | None) -> None:
        """After a restart of this actor, the ranks' current session is learnt from their calls:
        a later session of this job than the one known becomes current."""
        with self._lock:
            current = self._session
            if world_size is None or session == current \
                    or layout.session_generation(session) != self._generation \
                    or (current is not None
                        and layout.session_order(session) <= layout.session_order(current)):
                return
            self._last_seq = max(self._last_seq, layout.session_order(session)[1])
        logger.info("checkpoint coordinator: session %s adopted from a rank's call", session)
        self._begin(session, world_size)


    def vote(self, session: str, step: int, rank: int, ready: bool, plan_id: str,
             keys: list[tuple[str, int]] | None, wait_s: float,
             world_size: int | None = None) -> RoundResult | None:
        """`rank`'s vote in the round of `step`; waits up to `wait_s` for the outcome (None:
        open)."""
        self._adopt(session, world_size)
        with self._round_cond:
            self._counts["votes"] += 1
            self._rounds.vote(session, step, rank, ready=ready, plan_id=plan_id, keys=keys)
            self._round_cond.notify_all()
            return self._wait_round(session, step, rank, wait_s)

    def vote_many(self, session: str, step: int,
                  votes: dict[int, tuple[bool, str, list[tuple[str, int]] | None]],
                  wait_s: float, world_size: int | None = None) -> dict[int, RoundResult | None]:
        """One node's votes in one call (see `vote`): the coordinator's calls and waiting
        threads grow with nodes, not ranks. Returns each voter's outcome (None: open)."""
        self._adopt(session, world_size)
        with self._round_cond:
            self._counts["votes"] += len(votes)
            self._rounds.vote_many(session, step, votes)
            self._round_cond.notify_all()
            first = min(votes)
            self._wait_round(session, step, first, wait_s)
            return {rank: self._rounds.result(session, step, rank) for rank in votes}

    def poll_round(self, session: str, step: int, rank: int, wait_s: float) -> RoundResult | None:
        with self._round_cond:
            return self._wait_round(session, step, rank, wait_s)

    def withdraw_round(self, session: str, step: int, rank: int, why: str) -> None:
        with self._round_cond:
            self._rounds.withdraw(session, step, rank, why)
            self._round_cond.notify_all()

    def round_waiting_for(self, session: str, step: int) -> list[int]:
        with self._round_cond:
            return self._rounds.waiting_for(session, step)

    def _wait_round(self, session: str, step: int, rank: int, wait_s: float) -> RoundResult | None:
        deadline = time.monotonic() + wait_s
        while True:
            result = self._rounds.result(session, step, rank)
            left = deadline - time.monotonic()
            if result is not None or left <= 0:
                return result
            self._round_cond.wait(left)

    def shard_durable(self, session: str, step: int, rank: int, world_size: int,
                      report: tuple[str, float, bytes]) -> None:
        """A writer's report that `rank`'s shard of `step` is durable: (writer id, staged at,
        pickled `ShardReport`); registered from the plain header before anything waits."""
        self._adopt(session, world_size)
        with self._lock:
            if session != self._session:
                self._counts["stale_reports"] += 1
                self._dropped.add(session, step, rank, "restart",
                                  "a new attempt began before it was committed")
                return
        if self._queue.arrive(session, step, rank, world_size, report):
            self._queue.drain(self._commit)

    def shard_failed(self, session: str, step: int, rank: int, error: str) -> None:
        with self._lock:
            self._failed.setdefault((session, step), {})[rank] = error
            self._counts["failed_shards"] += 1
            while len(self._failed) > 100:
                self._failed.pop(next(iter(self._failed)))

    def save_dropped(self, session: str, step: int, rank: int, kind: str, reason: str) -> None:
        """A rank's save of `step` that will never commit (torn, skipped, a failed write...)."""
        self._dropped.add(session, step, rank, kind, reason)

    def _commit(self, key: tuple[str, int], reports: dict[int, tuple[str, float, bytes]]) -> None:
        """One commit at a time, in completion order, by the first writer that answers: one on this
        node first, then the step's own writers (the last reporter first), then any."""
        session, step = key
        committed = self._retention.committed()
        newest = committed[0] if committed else None
        with self._lock:
            current = self._session
        if session != current:
            self._counts["not_committed_superseded"] += 1
            self._dropped.add(session, step, None, "restart",
                              "a new attempt began before it was committed")
            return
        if newest is not None and newest.step >= step and newest.session == current:
            self._counts["not_committed_superseded"] += 1
            self._dropped.add(session, step, None, "not_committed",
                              f"step {newest.step} of the same attempt committed first")
            return
        error, kind = self._commit_by_a_writer(session, step, reports)  # the writer checks
        # the lease right before the manifest
        if error is None:
            self._on_committed(layout.StepDir(step, session), reports)
            return
        logger.warning("checkpoint step %d was not committed: %s", step, error)
        self._counts["commit_failures"] += 1
        self._dropped.add(session, step, None, kind,
                          error if kind == "fenced" else f"its commit failed: {error}")

    def _commit_by_a_writer(self, session: str, step: int,
                            reports: dict[int, tuple[str, float, bytes]]) -> tuple[str | None, str]:
        """(None, "") once a writer committed the step; else (the error, the drop kind)."""
        here = self._pool.writer_ids(node_id=self._node_id)
        own = list(dict.fromkeys(writer_id for writer_id, _, _ in reversed(reports.values())))
        pickled = {rank: message for rank, (_, _, message) in reports.items()}
        error = "no live checkpoint writer to commit it"
        for writer_id in dict.fromkeys(here + own + self._pool.writer_ids()):
            handle = self._pool.handle(writer_id)
            if handle is None:
                continue
            try:
                ray.get(handle.commit_step.remote(session, step, pickled, self._fence),
                        timeout=self.config.write_timeout_s)
                return None, ""
            except (*ACTOR_GONE, ray.exceptions.GetTimeoutError) as exc:
                error = f"writer {writer_id} is gone ({type(exc).__name__})"
                continue  # another writer can commit it: the shards are durable
            except Exception as exc:  # noqa: BLE001 - storage refused it: the step stays uncommitted
                cause = getattr(exc, "cause", None) or exc
                if isinstance(cause, LeaseLostError):
                    self._retention.lost(cause)
                    return str(cause), "fenced"
                return str(cause), "not_committed"
        return error, "not_committed"

    def _on_committed(self, step_dir: layout.StepDir,
                      reports: dict[int, tuple[str, float, bytes]]) -> None:
        now = time.time()
        self._retention.add(step_dir)
        with self._lock:
            holders = self._holders[step_dir] = {
                rank: [writer_id,
                       *self._pool.replica_holders(writer_id, self.config.memory_replicas)]
                for rank, (writer_id, _, _) in reports.items()}
            self._latencies.append(now - min(staged_at for _, staged_at, _ in reports.values()))
            self._commit_times.append((step_dir.step, now))
            self._counts["committed"] += 1
            self._commit_seq += 1
            seq = self._commit_seq
        logger.info("checkpoint step %d committed (%s)", step_dir.step,
                    self.storage.display(step_dir.name))
        replicas = {rank: [h for h in map(self._pool.handle, ids[1:]) if h is not None]
                    for rank, ids in holders.items()}
        self._pool.broadcast_commit(step_dir.session, step_dir.step, seq, replicas)
        self._prune()

    def _prune(self) -> None:
        with self._lock:
            session = self._session
        self._retention.prune(session)
        committed = set(self._retention.committed())
        with self._lock:
            self._holders = {d: h for d, h in self._holders.items() if d in committed}


    def quarantine(self, step_name: str, reason: str) -> None:
        """Every rank failed to load this committed step: it is offered no more."""
        self._retention.quarantine(step_name, reason)

    def load_info(self, rank: int) -> tuple[list[layout.StepDir], dict[layout.StepDir, list[Any]]]:
        """Committed steps newest first, each with the writers that may hold `rank`'s shard."""
        committed = self._retention.loadable()
        with self._lock:
            holders = {d: [w for w in map(self._pool.handle, h.get(rank, ())) if w is not None]
                       for d, h in self._holders.items()}
        return committed, {d: w for d, w in holders.items() if w}

    def latest_committed_step(self) -> int | None:
        loadable = self._retention.loadable()
        return loadable[0].step if loadable else None

    def poll(self, cursor: int, *, seen: tuple[str | None, int | None] | None = None,
             wait_s: float = 0.0) -> dict[str, Any]:
        """For the supervisor: the newest loadable commit, saves dropped since `cursor`, whether
        the run was taken from this job, and this actor's incarnation (a restart changes it).

        A long poll when `wait_s` > 0: answers once there is news against `seen` (the
        incarnation and newest commit the caller knows) or after `wait_s`, so an idle run costs
        one call per `wait_s` instead of one per poll interval. It checks in-process every
        `NEWS_RECHECK_S` (no call, no lock held while it waits), and answers at once after
        `release_polls`."""
        deadline = time.monotonic() + wait_s
        while True:
            dropped, next_cursor, total = self._dropped.since(cursor)
            info = {"latest": self.latest_committed_step(), "dropped": dropped,
                    "cursor": next_cursor, "dropped_total": total,
                    "fenced": self._retention.fenced,
                    "incarnation": self._incarnation}
            left = deadline - time.monotonic()
            if left <= 0 or seen is None or dropped or info["fenced"] is not None \
                    or seen != (info["incarnation"], info["latest"]) \
                    or self._polls_released.wait(min(NEWS_RECHECK_S, left)):
                return info

    def release_polls(self) -> None:
        """Answers every waiting long poll now, and later ones at once (the run is ending: no
        call may be in flight when the supervisor stops this actor)."""
        self._polls_released.set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            pending = self._queue.pending()
            with self._round_cond:
                open_rounds = self._rounds.open_rounds()
            return {
                "session": self._session, "world_size": self._world_size,
                "generation": self._generation, "incarnation": self._incarnation,
                "pid": os.getpid(), "open_rounds": open_rounds,
                "coordinator_has_torch": "torch" in sys.modules,  # never: writers build commits
                "committed_steps": [d.step for d in self._retention.committed()],
                "quarantined": self._retention.quarantined(),
                "pending_steps": pending, "counts": dict(self._counts),
                "dropped": self._dropped.describe(), "dropped_total": self._dropped.total,
                "fenced": None if self._retention.fenced is None else str(self._retention.fenced),
                "commit_latency_s": list(self._latencies),
                "commit_times": [list(c) for c in self._commit_times],
                "failed_shards": {f"{s}:{st}": e for (s, st), e in self._failed.items()},
                "writers": self._pool.stats(),
            }

    def drain(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` until every complete step is committed (or given up)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.busy()

    def shutdown(self) -> None:
        self._pool.shutdown()
