"""`CommitCoordinator`: one actor per run. It decides save rounds, commits complete steps through
a writer (so it never imports torch), keeps the writer pool, tells writers what to keep in
memory and which replicas to hold, and prunes. A new session ends the old one's rounds.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import Any

import ray

from ray_resilience._internal.checkpoint.format import commit, layout
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.commit_queue import CommitQueue
from ray_resilience._internal.checkpoint.service.rounds import RoundResult, RoundTable
from ray_resilience._internal.checkpoint.service.writer_pool import WriterPool
from ray_resilience.checkpoint.config import CheckpointConfig

logger = logging.getLogger(__name__)


class CommitCoordinator:
    """Commits steps. Plain class; `CheckpointService` wraps it with `ray.remote`."""

    def __init__(self, *, storage: CheckpointStorage, config: CheckpointConfig,
                 local_root: str | None = None) -> None:
        self.storage, self.config = storage, config
        self._lock = threading.RLock()
        self._session: str | None = None
        self._world_size: int | None = None
        self._queue = CommitQueue()
        self._failed: dict[tuple[str, int], dict[int, str]] = {}
        self._committed = commit.committed_steps(storage)
        self._holders: dict[layout.StepDir, dict[int, list[str]]] = {}
        """Per committed step and rank: the writer of the shard, then the replica holders."""
        self._commit_seq = 0
        self._latencies: collections.deque[float] = collections.deque(maxlen=10_000)
        self._counts = collections.Counter()
        self._round_cond = threading.Condition()
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
                       ) -> list[tuple[Any, str]]:
        """(writer handle, writer id) per rank; dead writers replaced, `launched` ones adopted."""
        return self._pool.ensure(node_ids_by_rank, launched)

    def replace_writer(self, rank: int, dead_writer_id: str) -> tuple[Any, str]:
        return self._pool.replace(rank, dead_writer_id)


    def begin_session(self, session: str, world_size: int) -> None:
        """A new attempt starts: later reports of older sessions are ignored."""
        layout.check_session(session)
        with self._lock:
            self._session, self._world_size = session, world_size
        self._queue.keep_only(session)
        with self._round_cond:
            self._rounds.begin(session, world_size)
            self._round_cond.notify_all()


    def vote(self, session: str, step: int, rank: int, ready: bool, plan_id: str,
             keys: list[tuple[str, int]] | None, wait_s: float) -> RoundResult | None:
        """`rank`'s vote in the round of `step`; waits up to `wait_s` for the outcome (None:
        open)."""
        with self._round_cond:
            self._rounds.vote(session, step, rank, ready=ready, plan_id=plan_id, keys=keys)
            self._round_cond.notify_all()
            return self._wait_round(session, step, rank, wait_s)

    def vote_many(self, session: str, step: int,
                  votes: dict[int, tuple[bool, str, list[tuple[str, int]] | None]],
                  wait_s: float) -> dict[int, RoundResult | None]:
        """One node's votes in one call (see `vote`): the coordinator's calls and waiting
        threads grow with nodes, not ranks. Returns each voter's outcome (None: open)."""
        with self._round_cond:
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
        with self._lock:
            if session != self._session:
                self._counts["stale_reports"] += 1
                return
        if self._queue.arrive(session, step, rank, world_size, report):
            self._queue.drain(self._commit)

    def shard_failed(self, session: str, step: int, rank: int, error: str) -> None:
        with self._lock:
            self._failed.setdefault((session, step), {})[rank] = error
            self._counts["failed_shards"] += 1
            while len(self._failed) > 100:
                self._failed.pop(next(iter(self._failed)))

    def _commit(self, key: tuple[str, int], reports: dict[int, tuple[str, float, bytes]]) -> None:
        """One commit at a time, in completion order, by the first writer that answers: one on this
        node first, then the step's own writers (the last reporter first), then any."""
        session, step = key
        step_dir = layout.StepDir(step, session)
        with self._lock:
            newest = self._committed[0] if self._committed else None
            current = self._session
        if session != current or (newest is not None and newest.step >= step
                                  and newest.session == current):
            self._counts["not_committed_superseded"] += 1
            return  # a new attempt began, or an older step finished after a newer commit
        here = self._pool.writer_ids(node_id=self._node_id)
        own = list(dict.fromkeys(writer_id for writer_id, _, _ in reversed(reports.values())))
        candidates = list(dict.fromkeys(here + own + self._pool.writer_ids()))
        pickled = {rank: message for rank, (_, _, message) in reports.items()}
        error: str = "no live checkpoint writer to commit it"
        for writer_id in candidates:
            handle = self._pool.handle(writer_id)
            if handle is None:
                continue
            try:
                ray.get(handle.commit_step.remote(session, step, pickled),
                        timeout=self.config.write_timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                error = f"writer {writer_id} is gone ({type(exc).__name__})"
                continue  # another writer can commit it: the shards are durable
            except Exception as exc:  # noqa: BLE001 - storage refused it: the step stays uncommitted
                error = str(getattr(exc, "cause", None) or exc)
                break
            self._on_committed(step_dir, reports)
            return
        logger.warning("checkpoint step %d was not committed: %s", step, error)
        self._counts["commit_failures"] += 1

    def _on_committed(self, step_dir: layout.StepDir,
                      reports: dict[int, tuple[str, float, bytes]]) -> None:
        now = time.time()
        with self._lock:
            self._committed.insert(0, step_dir)
            holders = self._holders[step_dir] = {
                rank: [writer_id,
                       *self._pool.replica_holders(writer_id, self.config.memory_replicas)]
                for rank, (writer_id, _, _) in reports.items()}
            self._latencies.append(now - min(staged_at for _, staged_at, _ in reports.values()))
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
        try:
            with self._lock:
                newest = self._committed[0] if self._committed else None
                session = self._session
            commit.prune(self.storage, num_to_keep=self.config.num_to_keep, keep_session=session,
                         newest_committed=newest)
            with self._lock:
                self._committed = commit.committed_steps(self.storage)
                self._holders = {d: h for d, h in self._holders.items() if d in self._committed}
        except Exception as exc:  # noqa: BLE001 - cleanup is retried after the next commit
            logger.warning("checkpoint cleanup under %s failed (retried later): %s",
                           self.storage.display(), exc)


    def load_info(self, rank: int) -> tuple[list[layout.StepDir], dict[layout.StepDir, list[Any]]]:
        """Committed steps newest first, each with the writers that may hold `rank`'s shard."""
        with self._lock:
            committed = list(self._committed)
            holders = {d: [w for w in map(self._pool.handle, h.get(rank, ())) if w is not None]
                       for d, h in self._holders.items()}
        return committed, {d: w for d, w in holders.items() if w}

    def latest_committed_step(self) -> int | None:
        with self._lock:
            return self._committed[0].step if self._committed else None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            pending = self._queue.pending()
            with self._round_cond:
                open_rounds = self._rounds.open_rounds()
            return {
                "session": self._session, "world_size": self._world_size,
                "open_rounds": open_rounds,
                "coordinator_has_torch": "torch" in sys.modules,  # never: writers build commits
                "committed_steps": [d.step for d in self._committed],
                "pending_steps": pending, "counts": dict(self._counts),
                "commit_latency_s": list(self._latencies),
                "failed_shards": {f"{s}:{st}": e for (s, st), e in self._failed.items()},
                "writers": self._pool.stats(),
            }

    def shutdown(self) -> None:
        self._pool.shutdown()
