"""`RankCheckpointer`: the rank-side checkpoint API, called from each rank's training thread.

Every rank calls `load` at the start of the train function (small collectives) and `maybe_save`
after each optimizer step, at the same steps; a save or local snapshot blocks only under
`block` and in the next `optimizer.step()` while its copy runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ray_resilience._internal.checkpoint.format.extra_codec import snapshot_extra
from ray_resilience._internal.checkpoint.format.local_roots import node_root
from ray_resilience._internal.checkpoint.rank.agreement import Agreement
from ray_resilience._internal.checkpoint.rank.handoff import HandoffPipeline
from ray_resilience._internal.checkpoint.rank.loader import LoadTarget, load_newest
from ray_resilience._internal.checkpoint.rank.local.schedule import LocalSchedule
from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots, layout_digest
from ray_resilience._internal.checkpoint.rank.slots import LocalWrite, RankSaveStats, SlotState
from ray_resilience._internal.checkpoint.rank.snapshot import UNSTEPPED_KEY
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience._internal.checkpoint.rank.writer_link import WriterLink
from ray_resilience._internal.checkpoint.shm import MAPS
from ray_resilience._internal.checkpoint.wire import RankCheckpointSpec
from ray_resilience._internal.constants import (
    TEST_COPY_DELAY_ENV_VAR,
    checkpoint_call_timeout_s,
    env_float,
)
from ray_resilience.checkpoint.loaded import LoadedCheckpoint

logger = logging.getLogger(__name__)
COPY_DELAY_ENV_VAR = TEST_COPY_DELAY_ENV_VAR


class RankCheckpointer:
    """One rank's checkpointing, built in the rank's process from `CheckpointService.rank_spec`;
    `load` assumes a default process group of `world_size` ranks (none for a single rank), of
    which `ranks_on_node` share this node's local-tier folder."""

    def __init__(self, spec: RankCheckpointSpec, *, rank: int, world_size: int,
                 ranks_on_node: int = 1, exporter: Any = None) -> None:
        self.spec, self.rank, self.world_size, self.config = spec, rank, world_size, spec.config
        self._agreement = Agreement(rank=rank, world_size=world_size,
                                    timeout_s=spec.config.collective_timeout_s)
        self._stats = RankSaveStats()
        self._schedule = LocalSchedule(spec.config, rank=rank)
        self._local = None
        if spec.local_root is not None and spec.config.local_tier_on:
            self._local = LocalSnapshots(node_root(spec.local_root), rank)
        link = WriterLink(rank=rank, writer=spec.writer, writer_id=spec.writer_id,
                          coordinator=spec.coordinator)
        self._pipeline = HandoffPipeline(rank=rank, world_size=world_size, config=spec.config,
                                         link=link, stats=self._stats,
                                         copy_delay_s=env_float(COPY_DELAY_ENV_VAR, 0.0),
                                         local=self._local, schedule=self._schedule,
                                         exporter=exporter)
        self._cache = StateCache()
        self._ranks_on_node = ranks_on_node
        self._local_checked = False
        self._digests: dict[int, tuple[Any, str]] = {}
        self._guard_seen = 0.0
        self._open_local: int | None = None
        """The local step the next optimizer step's guard wait is charged to."""
        self._local_blocking: list[tuple[int, float]] = []
        self._session: str | None = None
        self._closed = False


    def set_vote_relay(self, relay: Any) -> None:
        """Votes go through `relay` (this node's agent, one call per node), or straight to the
        coordinator with None."""
        self._pipeline.link.relay = relay

    def maybe_save(self, step: int, *, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None,
                   extra: dict[str, Any] | None = None) -> float | None:
        """Saves on save steps and snapshots for the local tier on its steps; returns the seconds
        the training thread was blocked by a committed save, else None."""
        self._charge_guard_wait()
        # Asked on every rank at every step, tier off or not: the probe's decision is collective.
        local = self._local is not None and self._schedule.is_local_step(step) \
            and self._local.disabled is None
        save = self.config.is_save_step(step)
        blocked = None
        if save or local:
            blocked = self._stage(step, model, optimizer, extra, save=save, local=local)
        if self._local is not None:
            if self._local.disabled is not None:  # e.g. a write failed: the peers must hear it
                self._schedule.turn_off(self._local.disabled)
            self._schedule.after_step(step, agreement=self._agreement,
                                      wait_idle=self._wait_local_writes)
            self._follow_schedule()
        return blocked

    def save(self, step: int, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None, extra: dict[str, Any] | None = None,
             local: bool = False) -> float | None:
        """Snapshots this rank's shards of `step`, hands them off in the background (and to the
        local tier with `local`); the blocking seconds, or None when the policy skipped it."""
        return self._stage(step, model, optimizer, extra, save=True, local=local)

    def _stage(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
               extra: dict[str, Any] | None, *, save: bool, local: bool) -> float | None:
        if self._closed:
            raise RuntimeError("RankCheckpointer.save() after close()")
        start = time.perf_counter()
        if save:
            self._stats.counts["requested"] += 1
        extra_state = snapshot_extra(extra or {})  # encoded by the background hand-off
        if self._session is None:  # a loop that saves without loading first
            self._begin_session()
        if save and self.config.in_flight_policy == "block":
            self._pipeline.wait_idle(
                None, why="in_flight_policy='block' waits for the previous save")
        self._stats.phase("wait", start)
        captured = time.perf_counter()
        unstepped = optimizer is not None and not optimizer.state
        source = self._cache.source(model, optimizer, self._copies_later(optimizer))
        if unstepped and optimizer.state:  # listing it created state: see UNSTEPPED_KEY
            optimizer.state.clear()
            extra_state = snapshot_extra({**(extra or {}), UNSTEPPED_KEY: True})
        self._stats.phase("capture", captured)
        target = self._local_target(step, source) if local else None
        copied = time.perf_counter()
        overlap = self.config.overlaps_copy(source.tensor_bytes,
                                            has_optimizer=optimizer is not None)
        if overlap:
            self._pipeline.copier.guard(optimizer)
        staged = self._pipeline.stage(step, source, extra_state, copy_all_now=not overlap,
                                      save=save, local=target)
        self._stats.phase("copy", copied)
        blocked = time.perf_counter() - start
        if save:
            self._stats.blocking_s.append(blocked)
        if target is not None:
            waited = self._pipeline.take_slot_wait_s()
            self._schedule.record_blocking(step, blocked - waited, slot_wait_s=waited)
            self._open_local = step
            if not (save and staged):
                self._local_blocking.append((step, blocked))
        return blocked if save and staged else None

    def _copies_later(self, optimizer: torch.optim.Optimizer | None) -> Any:
        has_optimizer = optimizer is not None
        return lambda tensor_bytes: self.config.overlaps_copy(tensor_bytes,
                                                              has_optimizer=has_optimizer)

    def _local_target(self, step: int, source: Any) -> LocalWrite | None:
        """Where the local snapshot of `step` goes; None when the tier cannot take it (checked
        against the tmpfs's room before the first write)."""
        assert self._local is not None and self._session is not None
        if not self._local_checked:
            self._local_checked = True
            size = source.tensor_bytes + sum(map(len, source.blobs))
            self._schedule.state_bytes = size
            self._schedule.on_cpu = not any(t.is_cuda for t in source.tensors[:1])
            cap = self.config.local_max_bytes
            why = (f"this rank's state is {size} bytes, over CheckpointConfig.local_max_bytes="
                   f"{cap}" if cap is not None and size > cap
                   else self._local.capacity_problem(size, self._ranks_on_node))
            if why is not None:
                self._schedule.turn_off(why)
                self._local.disable(why, warn=True)
                return None
        cached = self._digests.get(id(source.items))
        if cached is None or cached[0] is not source.items:
            cached = self._digests[id(source.items)] = (source.items, layout_digest(source.items))
        return LocalWrite(self._session, step, cached[1])

    def _charge_guard_wait(self) -> None:
        total = self._pipeline.copier.guard_wait_total_s
        waited, self._guard_seen = total - self._guard_seen, total
        if waited and self._open_local is not None:
            self._schedule.record_blocking(self._open_local, waited)
        self._open_local = None

    def _wait_local_writes(self) -> bool:
        return self._pipeline.wait_local_idle(self.config.write_timeout_s)

    def _follow_schedule(self) -> None:
        """Every rank agreed to turn the tier off: this one stops too (its files go)."""
        off = self._schedule.off
        if self._schedule.interval == 0 and off and self._local.disabled is None:
            self._local.disable(f"a peer cannot keep it: {off}", warn=True)

    def take_local_blocking(self) -> list[tuple[int, float]]:
        """(step, seconds) of each local-only snapshot since the last call (training-thread
        time; the next optimizer step's wait for its copy is in `take_guard_wait_s`)."""
        taken, self._local_blocking = self._local_blocking, []
        return taken

    def take_events(self) -> list[dict[str, Any]]:
        """The local tier's interval decisions since the last call, for the supervisor."""
        return self._schedule.take_events()

    def export_snapshot(self, export_id: str, into: Any = None) -> Any:
        """A snapshot this rank offered its writer (the writer's call; see SnapshotExports)."""
        return self._pipeline.export(export_id, into)

    def snapshot_taken(self, export_id: str, kept: bool = False) -> bool:
        """The writer took a snapshot from this rank's shared slot, `kept`: adopting its memory
        (see SnapshotExports)."""
        return self._pipeline.exports.taken(export_id, kept)

    def take_spare(self, handle: Any) -> bool:
        """The writer gives back shared memory for a later slot (see SnapshotExports)."""
        return self._pipeline.exports.take_spare(handle)

    def take_guard_wait_s(self) -> float:
        """Seconds optimizer steps waited for snapshot copies since the last call."""
        return self._pipeline.copier.take_guard_wait_s()

    @property
    def local_interval(self) -> int | None:
        """Steps between local snapshots now (0: off; None: still measuring, or no tier)."""
        return None if self._local is None else self._schedule.interval


    def load(self, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None) -> LoadedCheckpoint | None:
        """Restores the newest checkpoint into freshly built `model`/`optimizer` and starts a new
        session (older attempts' saves can no longer commit); None when there is none."""
        self._wait_local_writes()  # the last attempt's snapshots are on file before any offer
        self._cache.clear()
        self._begin_session()
        target = LoadTarget(rank=self.rank, storage=self.spec.storage,
                            coordinator=self.spec.coordinator,
                            memory_tier=self.config.memory_tier, model=model, optimizer=optimizer,
                            local=self._local, config=self.config)
        loaded = load_newest(target, self._agreement)
        if self._local is not None:
            if self._local.disabled is not None:
                self._schedule.turn_off(self._local.disabled)
            self._schedule.begin_attempt(self._agreement, loaded.step if loaded else None)
            self._follow_schedule()
        return loaded

    def _begin_session(self) -> None:
        self._session = self._agreement.new_session(self._register_session)
        self._pipeline.begin_session(self._session)

    def _register_session(self) -> str:
        import ray  # noqa: PLC0415 - only rank 0 talks to the coordinator here

        return ray.get(self.spec.coordinator.new_session.remote(self.world_size),
                       timeout=checkpoint_call_timeout_s())


    def end_attempt(self) -> None:
        """Drops every reference to the attempt's model and optimizer (taken snapshots go on)."""
        self._cache.clear()
        self._pipeline.copier.unguard_all()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Waits until this rank's saves are durable or given up; False on timeout."""
        return self._pipeline.wait_idle(timeout_s, why="wait_idle")

    def stats(self) -> dict[str, Any]:
        """This rank's counters, recent blocking times, guard waits, latencies and last error."""
        pipeline = self._pipeline
        with pipeline.cond:
            held = [s for s in pipeline.pool.slots
                    if s.state in (SlotState.COPYING, SlotState.STAGED, SlotState.VOTING)]
            putting = pipeline.pool.in_state(SlotState.PUTTING)
            if pipeline.writing:
                writing = pipeline.writing.step
            else:
                writing = putting[0].step if putting else None
            slots = {"pending_step": max((s.step for s in held), default=None),
                     "writing_step": writing, "staging_bytes": pipeline.pool.staging_bytes,
                     "pipeline": pipeline.describe()}
        local = {}
        if self._local is not None:
            writes = list(self._pipeline.local.write_s) if self._pipeline.local else []
            local = {**self._local.stats(), "local_interval": self._schedule.interval,
                     "local_cost_s": self._schedule.cost_s(), "step_s": self._schedule.step_s(),
                     "local_write_s": writes}
        return {"rank": self.rank, "session": self._session, **slots, **self._stats.as_dict(),
                **local}

    def close(self) -> None:
        """Stops the background threads; a pending snapshot is dropped."""
        if not self._closed:
            self._closed = True
            self._cache.clear()
            self._pipeline.close()
            if self._local is not None:  # the files stay: a respawned rank reads them
                self._local.close()
            MAPS.clear()  # the writers' memory this rank mapped (loads): it goes with them
