"""`RankCheckpointer`: the rank-side checkpoint API, called from each rank's training thread.

Every rank calls `load` at the start of the train function (small collectives) and `maybe_save`
after each optimizer step, at the same steps; a save blocks only under `block` and in the next
`optimizer.step()` while its copy runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ray_resilience._internal.checkpoint.format.extra_codec import ExtraSnapshot, snapshot_extra
from ray_resilience._internal.checkpoint.format.local_roots import node_root
from ray_resilience._internal.checkpoint.rank.agreement import Agreement
from ray_resilience._internal.checkpoint.rank.handoff import HandoffPipeline, WriterLink
from ray_resilience._internal.checkpoint.rank.loader import LoadTarget, load_newest
from ray_resilience._internal.checkpoint.rank.local_tier import LocalSnapshots
from ray_resilience._internal.checkpoint.rank.slots import RankSaveStats, SlotState
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
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
    `load` assumes a default process group of `world_size` ranks (none for a single rank)."""

    def __init__(self, spec: RankCheckpointSpec, *, rank: int, world_size: int) -> None:
        self.spec, self.rank, self.world_size, self.config = spec, rank, world_size, spec.config
        self._agreement = Agreement(rank=rank, world_size=world_size,
                                    timeout_s=spec.config.collective_timeout_s)
        self._stats = RankSaveStats()
        link = WriterLink(rank=rank, writer=spec.writer, writer_id=spec.writer_id,
                          coordinator=spec.coordinator)
        self._pipeline = HandoffPipeline(rank=rank, world_size=world_size, config=spec.config,
                                         link=link, stats=self._stats,
                                         copy_delay_s=env_float(COPY_DELAY_ENV_VAR, 0.0))
        self._cache = StateCache()
        self._local = None
        if spec.local_root is not None and spec.config.local_interval_steps:
            self._local = LocalSnapshots(node_root(spec.local_root), rank,
                                         max_bytes=spec.config.local_max_bytes)
        self._local_blocking: list[tuple[int, float]] = []
        self._session: str | None = None
        self._closed = False


    def maybe_save(self, step: int, *, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None,
                   extra: dict[str, Any] | None = None) -> float | None:
        """Saves on save steps and writes the local tier on local steps; returns the seconds the
        training thread was blocked, or None when the step saves nothing."""
        local = (self._local is not None and self._local.disabled is None
                 and self.config.is_local_step(step))
        if not self.config.is_save_step(step):
            if local:
                self._save_local(step, model, optimizer, extra)
            return None
        return self.save(step, model=model, optimizer=optimizer, extra=extra, local=local)

    def save(self, step: int, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None, extra: dict[str, Any] | None = None,
             local: bool = False) -> float | None:
        """Snapshots this rank's shards of `step`, hands them off in the background (and writes the
        local tier with `local`); the blocking seconds, or None when the policy skipped it."""
        if self._closed:
            raise RuntimeError("RankCheckpointer.save() after close()")
        start = time.perf_counter()
        self._stats.counts["requested"] += 1
        extra_state = snapshot_extra(extra or {})  # encoded by the background hand-off
        if self._session is None:  # a loop that saves without loading first
            self._begin_session()
        if self.config.in_flight_policy == "block":
            self._pipeline.wait_idle(
                None, why="in_flight_policy='block' waits for the previous save")
        self._stats.phase("wait", start)
        captured = time.perf_counter()
        # With the local tier every tensor is also copied now: their addresses are checked here.
        copies_later = None if local else self._copies_later(optimizer)
        source = self._cache.source(model, optimizer, copies_later)
        self._stats.phase("capture", captured)
        copied = time.perf_counter()
        overlap = self.config.overlaps_copy(source.tensor_bytes,
                                            has_optimizer=optimizer is not None)
        if overlap:
            self._pipeline.copier.guard(optimizer)
        staged = self._pipeline.stage(step, source, extra_state, copy_all_now=not overlap)
        self._stats.phase("copy", copied)
        blocked = time.perf_counter() - start
        self._stats.blocking_s.append(blocked)
        if local:
            self._write_local(step, source, extra_state)
        return blocked if staged else None

    def _copies_later(self, optimizer: torch.optim.Optimizer | None) -> Any:
        has_optimizer = optimizer is not None
        return lambda tensor_bytes: self.config.overlaps_copy(tensor_bytes,
                                                              has_optimizer=has_optimizer)

    def _save_local(self, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, extra: dict[str, Any] | None) -> None:
        if self._closed:
            raise RuntimeError("RankCheckpointer.save() after close()")
        start = time.perf_counter()
        extra_state = snapshot_extra(extra or {})
        if self._session is None:
            self._begin_session()
        self._write_local(step, self._cache.source(model, optimizer), extra_state, start=start)

    def _write_local(self, step: int, source: Any, extra: ExtraSnapshot,
                     start: float | None = None) -> None:
        start = time.perf_counter() if start is None else start
        assert self._local is not None and self._session is not None
        if self._local.save(step, self._session, source, extra.encode()):
            self._local_blocking.append((step, time.perf_counter() - start))

    def take_local_blocking(self) -> list[tuple[int, float]]:
        """(step, seconds) of each local-tier write since the last call (training-thread time)."""
        taken, self._local_blocking = self._local_blocking, []
        return taken

    def take_guard_wait_s(self) -> float:
        """Seconds optimizer steps waited for snapshot copies since the last call."""
        return self._pipeline.copier.take_guard_wait_s()


    def load(self, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None) -> LoadedCheckpoint | None:
        """Restores the newest checkpoint into freshly built `model`/`optimizer` and starts a new
        session (older attempts' saves can no longer commit); None when there is none."""
        self._cache.clear()
        self._begin_session()
        target = LoadTarget(rank=self.rank, storage=self.spec.storage,
                            coordinator=self.spec.coordinator,
                            memory_tier=self.config.memory_tier, model=model, optimizer=optimizer,
                            local=self._local, config=self.config)
        return load_newest(target, self._agreement)

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
        local = self._local.stats() if self._local is not None else {}
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
