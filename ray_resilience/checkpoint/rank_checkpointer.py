"""`RankCheckpointer`: the worker-side API, called from each rank's training thread.

Every rank calls `load` at the start of the train function and `maybe_save` after each optimizer
step, at the same steps (both run small collectives so the ranks' decisions stay identical).
A save blocks only for the snapshot copy of the rank's own shards (plus, under
`in_flight_policy="block"`, for the previous save to become durable).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from ray_resilience.checkpoint.agreement import Agreement, admit, assign_owners
from ray_resilience.checkpoint.extra_codec import encode_extra
from ray_resilience.checkpoint.handoff import HandoffPipeline, RankSaveStats, Staged, WriterLink
from ray_resilience.checkpoint.loader import LoadTarget, load_newest
from ray_resilience.checkpoint.service import RankCheckpointSpec
from ray_resilience.checkpoint.snapshot import CapturedState, capture
from ray_resilience.checkpoint.types import LoadedCheckpoint, SaveTicket, item_nbytes

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Plan:
    signature: tuple
    items: list
    planner_data: dict
    owned: list[bool]


class RankCheckpointer:
    """One rank's checkpointing. Built in the rank's actor process from the spec the supervisor
    got from `CheckpointService.rank_spec`; may assume a default process group of `world_size`
    ranks exists when it saves or loads (none is needed for a single rank)."""

    def __init__(self, spec: RankCheckpointSpec, *, rank: int, world_size: int) -> None:
        self.spec, self.rank, self.world_size, self.config = spec, rank, world_size, spec.config
        self._agreement = Agreement(rank=rank, world_size=world_size,
                                    timeout_s=spec.config.collective_timeout_s)
        self._stats = RankSaveStats()
        link = WriterLink(rank=rank, writer=spec.writer, writer_id=spec.writer_id,
                          coordinator=spec.coordinator)
        self._pipeline = HandoffPipeline(rank=rank, config=spec.config, link=link, stats=self._stats)
        self._session: str | None = None
        self._plan: _Plan | None = None
        self._blob_cache: dict[str, tuple[Any, bytes]] = {}
        self._closed = False

    # --- saving -----------------------------------------------------------------------------

    def maybe_save(self, step: int, *, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None,
                   extra: dict[str, Any] | None = None) -> float | None:
        """Saves when `step % interval_steps == 0`; returns the seconds the training thread was
        blocked, or None when this step saves nothing."""
        if not self.config.is_save_step(step):
            return None
        return self.save(step, model=model, optimizer=optimizer, extra=extra)

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             extra: dict[str, Any] | None = None) -> float | None:
        """Snapshots this rank's shards now and hands them off in the background. Returns the
        blocking seconds, or None when the in-flight policy skipped this save."""
        if self._closed:
            raise RuntimeError("RankCheckpointer.save() after close()")
        start = time.perf_counter()
        self._stats.counts["requested"] += 1
        extra_bytes = encode_extra(extra or {})
        if self.config.in_flight_policy == "block":
            self._pipeline.wait_idle(None, why="in_flight_policy='block' waits for the previous save")
        self._stats.phase("wait", start)
        captured = time.perf_counter()
        state = capture(model, optimizer)
        self._stats.phase("capture", captured)
        with self._pipeline.cond:
            staged = self._stage(step, state, extra_bytes)
        blocked = time.perf_counter() - start
        self._stats.blocking_s.append(blocked)
        return blocked if staged else None

    def _stage(self, step: int, state: CapturedState, extra_bytes: bytes) -> bool:
        """Runs under the pipeline lock, so the hand-off thread cannot change the flags between
        the collective and the action."""
        if self._session is None:
            self._session = self._agreement.new_session(self._begin_session)
        pipeline = self._pipeline
        replan = self._plan is None or self._plan.signature != state.signature
        agreed = time.perf_counter()
        pending, busy, replans = self._agreement.sum(
            [int(pipeline.pending is not None), int(pipeline.busy()), int(replan)])
        if replans:
            self._plan = self._make_plan(state)
        self._stats.phase("agree", agreed)
        action = admit(self.config.in_flight_policy, pending_ranks=pending, busy_ranks=busy,
                       world_size=self.world_size)
        if action == "skip":
            self._stats.counts["skipped"] += 1
            return False
        if action == "replace":
            self._stats.counts["coalesced"] += 1
        plan, copied = self._plan, time.perf_counter()
        tensors, blobs = state.sources(plan.items, self._blob_cache)
        buffers = pipeline.buffers_for(plan.items, tensors, replace_pending=action == "replace")
        buffers.fill(tensors)
        self._stats.phase("copy", copied)
        ticket = SaveTicket(session=self._session, step=step, rank=self.rank, world_size=self.world_size,
                            items=plan.items, owned=plan.owned, planner_data=plan.planner_data,
                            staged_at=time.time())
        pipeline.set_pending(Staged(ticket, buffers, blobs, extra_bytes))
        self._stats.counts["staged"] += 1
        return True

    def _make_plan(self, state: CapturedState) -> _Plan:
        """Collective: every rank's item keys decide who writes replicated items."""
        items, planner_data = state.build_items()
        keys = [(f"{i.index.fqn}|{tuple(i.index.offset or ())}", item_nbytes(i)) for i in items]
        owned = assign_owners(self._agreement.gather(keys))[self.rank]
        return _Plan(state.signature, items, planner_data, owned)

    def _begin_session(self, session: str) -> None:
        import ray  # noqa: PLC0415 - only rank 0 talks to the coordinator here

        ray.get(self.spec.coordinator.begin_session.remote(session, self.world_size), timeout=120)

    # --- loading ----------------------------------------------------------------------------

    def load(self, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None = None) -> LoadedCheckpoint | None:
        """Restores the newest committed checkpoint into `model`/`optimizer` (freshly built,
        sharded the same way as when training). Starts a new session: saves of earlier attempts
        can no longer commit. Returns None when the run has no committed checkpoint."""
        self._pipeline.drop_pending()
        self._session = self._agreement.new_session(self._begin_session)
        target = LoadTarget(rank=self.rank, storage=self.spec.storage, coordinator=self.spec.coordinator,
                            memory_tier=self.config.memory_tier, model=model, optimizer=optimizer)
        return load_newest(target, self._agreement)

    # --- lifecycle --------------------------------------------------------------------------

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Waits until this rank's saves are durable or given up; False on timeout."""
        return self._pipeline.wait_idle(timeout_s, why="wait_idle")

    def stats(self) -> dict[str, Any]:
        """This rank's counters: requested, staged, coalesced, skipped, durable, failed; recent
        blocking times and staged-to-durable latencies; last error."""
        with self._pipeline.cond:
            pending, writing = self._pipeline.pending, self._pipeline.writing
            slots = {"pending_step": pending.ticket.step if pending else None,
                     "writing_step": writing.step if writing else None,
                     "staging_bytes": self._pipeline.staging_bytes}
        return {"rank": self.rank, "session": self._session, **slots, **self._stats.as_dict()}

    def close(self) -> None:
        """Stops the hand-off thread; a pending snapshot is dropped, a write in progress is left
        to its writer."""
        if not self._closed:
            self._closed = True
            self._pipeline.close()
