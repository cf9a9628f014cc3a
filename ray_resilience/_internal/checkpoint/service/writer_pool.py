"""`WriterPool`: a run's writer actors, `writers_per_node` on each node hosting ranks, owned by
the commit coordinator; pinned to their node, `num_cpus=0`, threaded.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.service.writer import CheckpointWriter
from ray_resilience._internal.constants import (
    DEFAULT_WRITER_PING_TIMEOUT_S,
    DEFAULT_WRITER_START_TIMEOUT_S,
    WRITER_PING_TIMEOUT_ENV_VAR,
    WRITER_START_TIMEOUT_ENV_VAR,
    env_float,
)
from ray_resilience._internal.priority import rank_niceness
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)
WRITER_MAX_CONCURRENCY = 64
_ADOPTED = "adopted:"
"""Marks a `launched` writer that ran before (`slots()`): replaced, not fatal, if it is gone."""


def _ping_timeout_s() -> float:
    return env_float(WRITER_PING_TIMEOUT_ENV_VAR, DEFAULT_WRITER_PING_TIMEOUT_S)


@dataclasses.dataclass
class _Slot:
    node_id: str
    index: int
    writer_id: str
    handle: Any


class WriterPool:
    """Creates, checks and replaces writers; maps each rank to one writer on its node."""

    def __init__(self, *, storage: CheckpointStorage, config: CheckpointConfig, coordinator: Any,
                 local_root: str | None = None) -> None:
        self._storage, self._config, self._coordinator = storage, config, coordinator
        self._local_root = local_root
        self._lock = threading.RLock()
        self._slots: dict[tuple[str, int], _Slot] = {}
        self._rank_slot: dict[int, tuple[str, int]] = {}

    def _start(self, node_id: str, index: int, launched: tuple[str, Any] | None = None) -> _Slot:
        """A writer for (node, index), answering; adopts `launched` if it answers (else, when
        that one ran before, e.g. for a restarted coordinator, starts a new one)."""
        if launched is not None:
            try:
                return self._answering(node_id, index, *launched)
            except CheckpointError:
                if not launched[0].startswith(_ADOPTED):
                    raise
        writer_id, handle = launch_writer(
            storage=self._storage, config=self._config, coordinator=self._coordinator,
            node_id=node_id, index=index, local_root=self._local_root)
        return self._answering(node_id, index, writer_id, handle)

    def _answering(self, node_id: str, index: int, writer_id: str, handle: Any) -> _Slot:
        start_timeout_s = env_float(WRITER_START_TIMEOUT_ENV_VAR, DEFAULT_WRITER_START_TIMEOUT_S)
        try:
            ray.get(handle.ping.remote(), timeout=start_timeout_s)
        except Exception as exc:
            ray.kill(handle)
            raise CheckpointError(
                f"checkpoint writer for node {node_id} did not start within "
                f"{start_timeout_s:.0f} s ({type(exc).__name__}: {exc}); the node may be "
                "gone or out of memory") from exc
        return _Slot(node_id, index, writer_id.removeprefix(_ADOPTED), handle)

    def _alive(self, slots: list[_Slot]) -> set[str]:
        refs = {s.handle.ping.remote(): s.writer_id for s in slots}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=_ping_timeout_s())
        alive = set()
        for ref in ready:
            try:
                ray.get(ref)
                alive.add(refs[ref])
            except Exception:  # noqa: BLE001 - a dead writer is replaced below
                pass
        return alive

    def ensure(
        self, node_ids_by_rank: list[str],
        launched: dict[tuple[str, int], tuple[str, Any]] | None = None,
    ) -> list[tuple[Any, str]]:
        """(writer handle, writer id) per rank; starts missing writers, replaces dead ones."""
        launched = dict(launched or {})
        with self._lock:
            nodes = list(dict.fromkeys(node_ids_by_rank))
            alive = self._alive(list(self._slots.values())) if self._slots else set()
            for node_id in nodes:
                for index in range(self._config.writers_per_node):
                    slot = self._slots.get((node_id, index))
                    if slot is None or slot.writer_id not in alive:
                        if slot is not None:
                            logger.warning("checkpoint writer %s is dead; replacing it",
                                           slot.writer_id)
                        self._slots[(node_id, index)] = self._start(
                            node_id, index, launched.pop((node_id, index), None))
            for _, handle in launched.values():  # launched for nodes no rank uses
                with_suppressed_kill(handle)
            seen: dict[str, int] = {}
            for rank, node_id in enumerate(node_ids_by_rank):
                local = seen.get(node_id, 0)
                seen[node_id] = local + 1
                self._rank_slot[rank] = (node_id, local % self._config.writers_per_node)
            for rank in [r for r in self._rank_slot if r >= len(node_ids_by_rank)]:
                del self._rank_slot[rank]
            return [self._pair(rank) for rank in range(len(node_ids_by_rank))]

    def _pair(self, rank: int) -> tuple[Any, str]:
        slot = self._slots[self._rank_slot[rank]]
        return slot.handle, slot.writer_id

    def replace(self, rank: int, dead_writer_id: str) -> tuple[Any, str]:
        """A rank found its writer dead: start a new one on the same node (once per death)."""
        with self._lock:
            key = self._rank_slot[rank]
            slot = self._slots[key]
            if slot.writer_id == dead_writer_id:
                with_suppressed_kill(slot.handle)
                self._slots[key] = self._start(slot.node_id, slot.index)
                logger.warning("checkpoint writer %s died; replaced by %s", dead_writer_id,
                               self._slots[key].writer_id)
            return self._pair(rank)

    def slots(self) -> dict[tuple[str, int], tuple[str, Any]]:
        """Every writer by (node, index), to hand to a restarted coordinator as `launched`."""
        with self._lock:
            return {key: (_ADOPTED + s.writer_id, s.handle) for key, s in self._slots.items()}

    def writer_ids(self, *, node_id: str | None = None) -> list[str]:
        """The writers' ids (those on `node_id` only, if given)."""
        with self._lock:
            return [s.writer_id for s in self._slots.values() if node_id in (None, s.node_id)]

    def handle(self, writer_id: str | None) -> Any:
        with self._lock:
            for slot in self._slots.values():
                if slot.writer_id == writer_id:
                    return slot.handle
        return None

    def replica_holders(self, writer_id: str, count: int) -> list[str]:
        """Up to `count` other writers for replicas: other nodes first, then the same node."""
        with self._lock:
            slots = list(self._slots.values())
        own = next((s for s in slots if s.writer_id == writer_id), None)
        if own is None or count <= 0:
            return []
        others = [s for s in slots if s is not own]
        # Spread the replicas: the writers after this one in a fixed order, other nodes first.
        order = sorted(others, key=lambda s: (s.node_id == own.node_id,
                                              (s.node_id, s.index) < (own.node_id, own.index),
                                              s.node_id, s.index))
        return [s.writer_id for s in order[:count]]

    def broadcast_commit(self, session: str, step: int, seq: int,
                         replica_holders: dict[int, list[Any]]) -> None:
        with self._lock:
            handles = [s.handle for s in self._slots.values()]
        for handle in handles:
            handle.on_commit.remote(session, step, seq, replica_holders)

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            slots = list(self._slots.values())
        refs = [s.handle.stats.remote() for s in slots]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_ping_timeout_s())
        out = []
        for slot, ref in zip(slots, refs, strict=True):
            try:
                out.append({"node_id": slot.node_id, **ray.get(ref, timeout=0)} if ref in ready
                           else {"node_id": slot.node_id, "writer_id": slot.writer_id,
                                 "status": "no answer"})
            except Exception as exc:  # noqa: BLE001 - a dead writer shows up as such
                out.append({"node_id": slot.node_id, "writer_id": slot.writer_id,
                            "status": f"dead ({type(exc).__name__})"})
        return out

    def shutdown(self) -> None:
        with self._lock:
            if self._local_root is not None:  # the run is over: its local snapshots go
                refs = [slot.handle.remove_local_root.remote() for slot in self._slots.values()]
                ray.wait(refs, num_returns=len(refs), timeout=_ping_timeout_s())
            for slot in self._slots.values():
                with_suppressed_kill(slot.handle)
            self._slots.clear()


def launch_writer(*, storage: CheckpointStorage, config: CheckpointConfig, coordinator: Any,
                  node_id: str, index: int, local_root: str | None = None) -> tuple[str, Any]:
    """Creates (without waiting for) writer `index` of `node_id`: (writer id, handle)."""
    writer_id = f"writer-{node_id[:8]}-{index}-{uuid.uuid4().hex[:6]}"
    budget = config.memory_budget_bytes
    if budget is None and config.memory_tier:
        budget = object_store_bytes(node_id)
    actor = ray.remote(CheckpointWriter).options(
        num_cpus=0, max_concurrency=WRITER_MAX_CONCURRENCY, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        # At the ranks' nice value: its "background" threads then sit a fixed step below them.
        runtime_env={"env_vars": rank_niceness()})
    per_writer = None if budget is None else budget // config.writers_per_node
    handle = actor.remote(writer_id=writer_id, storage=storage, config=config,
                          coordinator=coordinator, memory_budget_bytes=per_writer,
                          local_root=local_root)
    return writer_id, handle


def object_store_bytes(node_id: str) -> int | None:
    """The object store size of node `node_id`: the memory tier's cap when no budget is set (the
    tier lives in the writers' shared memory, outside the store, and is held to what the store
    would have allowed). None when Ray does not say."""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            found = (node.get("Resources") or {}).get("object_store_memory")
            return int(found) if found else None
    return None


def with_suppressed_kill(handle: Any) -> None:
    try:
        ray.kill(handle)
    except Exception:  # noqa: BLE001 - already dead
        pass
