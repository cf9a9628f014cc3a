"""The supervisor's side of the run's checkpoint service: the run's lease (taken before any actor
that writes, renewed until the last one is gone), the service started beside the ranks, polled
for commits and dropped saves (emitted as events), given writers for new nodes and back to a
restarted coordinator, shut down with the run. Every method is a no-op when the run has no
`CheckpointConfig`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from ray_resilience._internal.constants import (
    DEFAULT_FINAL_SAVE_TIMEOUT_S,
    FINAL_SAVE_TIMEOUT_ENV_VAR,
    checkpoint_call_timeout_s,
    env_float,
)
from ray_resilience._internal.supervisor.run_record import Clock, RunRecord, tier_read
from ray_resilience.callbacks import CheckpointCommitted, CheckpointDropped
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import CheckpointError

if TYPE_CHECKING:
    from ray_resilience._internal.checkpoint.service.lease_keeper import LeaseKeeper
    from ray_resilience._internal.checkpoint.service.service import CheckpointService

log = logging.getLogger(__name__)

COMMIT_POLL_INTERVAL_S = 0.25
"""How often the supervisor looks whether the coordinator's long poll answered (no call)."""
LONG_POLL_S = 10.0
"""How long the coordinator holds a poll without news before it answers anyway."""
MAX_DROPPED_KEPT = 1000
"""Dropped saves listed in the outcome; later ones are only counted."""


class RunCheckpoints:
    """The checkpoint service of one run, as the supervisor drives it."""

    def __init__(self, config: CheckpointConfig | None, *, storage_path: str,
                 storage_filesystem: Any, run_name: str, record: RunRecord, clock: Clock,
                 emit: Callable[[Any], None]) -> None:
        self.config, self.run_name = config, run_name
        self._storage_path, self._storage_fs = storage_path, storage_filesystem
        self._record, self._clock, self._emit = record, clock, emit
        self.service: CheckpointService | None = None
        self.lease: LeaseKeeper | None = None
        self.last_commit: int | None = None
        """The newest committed step seen (at start: the step a run of the same name resumes)."""
        self.dropped: list[CheckpointDropped] = []
        """Saves asked for and never committed (the first `MAX_DROPPED_KEPT`)."""
        self._received = 0
        self._overflow: dict[str, int] = {}
        """Per coordinator incarnation: saves it counted beyond those it kept."""
        self._final_stats: dict[str, Any] | None = None
        self._started = False
        self._poll_at = 0.0
        self._cursor, self._incarnation = 0, None
        self._pending: tuple[Any, float] | None = None
        """The open long poll: its reference and when it was sent."""
        self._warmed = False
        """Whether the writers were told to import DCP (`warm`)."""

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def claim(self, should_stop: Callable[[], bool]) -> None:
        """Takes the run's lease (RunInUseError while another job holds it, after waiting up
        to `lease_wait_s`); before any actor that writes checkpoints exists."""
        if self.config is None:
            return
        from ray_resilience._internal.checkpoint.format.storage import (  # noqa: PLC0415 - loaded only by runs that checkpoint
            CheckpointStorage,
        )
        from ray_resilience._internal.checkpoint.service.lease_keeper import (  # noqa: PLC0415 - see above
            LeaseKeeper,
        )

        storage = CheckpointStorage.for_run(self._storage_path, self.run_name, self._storage_fs)
        storage.check_writable()
        self.lease = LeaseKeeper.claim(storage, self.run_name, self.config, should_stop)

    def start(self, node_ids: list[str]) -> None:
        """Starts the coordinator and a writer per node (processes that import torch)."""
        from ray_resilience._internal.checkpoint.service.service import (  # noqa: PLC0415 - loaded only by runs that checkpoint
            CheckpointService,
        )

        t0 = self._clock.time()
        self.service = CheckpointService.start(
            storage_path=self._storage_path, run_name=self.run_name,
            storage_filesystem=self._storage_fs, world_size=len(node_ids),
            node_ids_by_rank=node_ids, config=self.config, lease=self.lease)
        self._started = True
        self._record.startup_phase("start_checkpointing", t0, self._clock.time())
        self.last_commit = self.service.latest_committed_step()

    def rank_spec(self, rank: int) -> Any:
        return self.service.rank_spec(rank) if self.service is not None else None

    def prelaunch(self, node_id: str) -> bool:
        """A respawned rank is starting on `node_id`: its writers start beside it. False: the
        run has no checkpoint service (nothing to start)."""
        if self.service is None:
            return False
        self.service.prelaunch(node_id)
        return True

    def ensure_writers(self, node_ids: list[str]) -> None:
        """Writers for nodes the ranks moved to; dead writers are replaced."""
        if self.service is not None:
            self.service.ensure_writers(node_ids)
            if self._warmed:
                self.service.warm()

    def warm(self) -> None:
        """The run stepped: the writers import DCP now (once), off the ranks' start-up."""
        if self.service is not None and not self._warmed:
            self._warmed = True
            self.service.warm()

    def poll(self, *, force: bool = False) -> CheckpointError | None:
        """Emits new commits and dropped saves; returns the error that must end the run:
        another job took the run, or the coordinator is gone.

        The coordinator is long-polled: one call stays open until it has news (a commit, a
        dropped save, a restart, the lease taken) or `LONG_POLL_S` passed, and this (called on
        every monitor interval) looks at most `COMMIT_POLL_INTERVAL_S` apart whether it
        answered, which costs no call. `force` asks at once and waits for the answer."""
        if self.lease is not None and self.lease.lost is not None:
            return self.lease.lost
        now = self._clock.monotonic()
        if self.service is None or (not force and now < self._poll_at):
            return None
        self._poll_at = now + COMMIT_POLL_INTERVAL_S
        try:
            if force:
                self._pending = None
                info = self._absorb(self.service.poll(self._cursor))
            else:
                info = self._answered(now)
                if info is None:
                    return None
        except ray.exceptions.RayActorError as exc:
            self._pending = None
            return CheckpointError(f"the commit coordinator of run {self.run_name} died and "
                                   f"could not be restarted: {exc}")
        except ray.exceptions.GetTimeoutError:
            log.warning("the commit coordinator did not answer; asking again")
            return None
        for event in info["dropped"]:
            self._dropped(event)
        step = info["latest"]
        if step is not None and step != self.last_commit:
            self.last_commit = step
            self._emit(CheckpointCommitted(step=step, t=self._clock.time()))
        fenced = info["fenced"]
        if fenced is not None and fenced.final:
            return fenced
        if not force:
            self._open_poll(now)
        return None

    def _answered(self, now: float) -> dict[str, Any] | None:
        """The open long poll's answer once it came (`poll` opens the next one after taking
        it in), else None; a poll unanswered long past its wait is given up and asked again."""
        if self._pending is None:
            self._open_poll(now)
        ref, sent = self._pending
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            if now - sent > LONG_POLL_S + checkpoint_call_timeout_s():
                self._pending = None
                raise ray.exceptions.GetTimeoutError("long poll unanswered")
            return None
        self._pending = None
        return self._absorb(ray.get(ref))

    def _close_poll(self, service: CheckpointService) -> None:
        """Has the open long poll answered, so no call is in flight when the service stops
        (Ray would log the killed call as failed and retried)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            service.release_polls()
            ray.get(pending[0], timeout=checkpoint_call_timeout_s())
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass  # its news are read again by the final poll

    def _open_poll(self, now: float) -> None:
        seen = (self._incarnation, self.last_commit)
        self._pending = (self.service.long_poll(self._cursor, seen, LONG_POLL_S), now)

    def _absorb(self, info: dict[str, Any]) -> dict[str, Any]:
        """Moves the cursor past `info`'s news; after the coordinator restarted, it gets its
        writers back and its news are read from the start."""
        if info["incarnation"] != self._incarnation:
            if self._incarnation is not None:
                log.warning("the commit coordinator restarted; handing it its writers back")
                self.service.recover()
                if self._warmed:
                    self.service.warm()
                info = self.service.poll(0)
            self._incarnation = info["incarnation"]
        self._overflow[info["incarnation"]] = info["dropped_total"] - info["cursor"]
        self._cursor = info["cursor"]
        return info

    def _dropped(self, event: CheckpointDropped) -> None:
        self._received += 1
        if len(self.dropped) < MAX_DROPPED_KEPT:
            self.dropped.append(event)
        self._emit(event)

    @property
    def dropped_total(self) -> int:
        """Every save dropped, also those beyond the ones listed."""
        return self._received + sum(self._overflow.values())

    def stats(self) -> dict[str, Any] | None:
        """The service's counters (`CheckpointService.stats`), None without one."""
        service = self.service
        return service.stats() if service is not None else self._final_stats

    def shutdown(self) -> None:
        """Lets complete steps commit, notes the last commit, the dropped saves and the final
        counters, stops the service, then releases the lease."""
        if self.service is not None:
            service = self.service
            try:
                self._close_poll(service)
                service.drain(env_float(FINAL_SAVE_TIMEOUT_ENV_VAR, DEFAULT_FINAL_SAVE_TIMEOUT_S))
                self.poll(force=True)
                self._final_stats = service.stats()
            except Exception:  # stats are informative only
                log.exception("checkpoint stats unavailable")
            self.service = None
            service.shutdown()
        if self.lease is not None:
            self.lease.close()

    def summary(self) -> dict[str, Any] | None:
        """`Result.checkpoint`: the newest commit, the loads and phases, restore seconds per
        tier, the local tier's interval decisions, the final counters."""
        if not self._started:
            return None
        return {"latest_committed_step": self.last_commit, "loads": list(self._record.loads),
                "phases": list(self._record.phases), "stats": self._final_stats,
                "restore_s": restore_seconds(self._record.loads),
                "local_tier": local_tier_summary(list(self._record.local_tier))}


def restore_seconds(loads: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per tier ("local", "memory", "replica": another writer's copy of the shard, "storage"),
    the seconds of each restore: the slowest rank's load in each attempt that restored from it."""
    slowest: dict[tuple[int, str], float] = {}
    for load in loads:
        tier = tier_read(load)
        if tier is None or load.get("t_end") is None:
            continue
        key = (load.get("attempt", 0), tier)
        slowest[key] = max(slowest.get(key, 0.0), load["t_end"] - load["t_start"])
    out: dict[str, list[float]] = {}
    for (_, tier), seconds in sorted(slowest.items()):
        out.setdefault(tier, []).append(seconds)
    return out


def local_tier_summary(decisions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest interval every rank agreed on, and every decision (rank 0's, or any rank's
    that turned the tier off)."""
    if not decisions:
        return None
    kept = [d for d in decisions if d.get("rank") == 0 or d.get("off")]
    newest = kept[-1] if kept else decisions[-1]
    return {"interval_steps": newest["interval_steps"], "mode": newest["mode"],
            "off": newest.get("off"), "cost_s": newest.get("cost_s"),
            "step_s": newest.get("step_s"), "budget": newest.get("budget"),
            "state_bytes": newest.get("state_bytes"),
            "decisions": [{k: v for k, v in d.items() if k not in ("phase", "t_end")}
                          for d in kept]}
