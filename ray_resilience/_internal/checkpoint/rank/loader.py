"""Loading the newest checkpoint on every rank: the local tier when every rank holds the step,
else the committed steps newest first, each rank from writer memory, a replica or storage
(transient storage errors retried with backoff); the ranks agree on the outcome and fall back
together, naming the file, and a step none could load is quarantined.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import ray
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

from ray_resilience._internal.checkpoint.format import commit, layout, shard_io
from ray_resilience._internal.checkpoint.format.extra_codec import decode_extra, encode_extra
from ray_resilience._internal.checkpoint.format.readers import (
    MemoryShardReader,
    SafeLoadPlanner,
    StorageShardReader,
)
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage, retrying
from ray_resilience._internal.checkpoint.rank.agreement import Agreement
from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots, layout_digest
from ray_resilience._internal.checkpoint.rank.snapshot import (
    MODEL_KEY,
    OPTIMIZER_KEY,
    UNSTEPPED_KEY,
    StagingBuffers,
    capture,
    state_dict_of,
)
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience._internal.checkpoint.shm import MAPS, node_here
from ray_resilience._internal.checkpoint.wire import (
    MemoryEntry,
    ShardPayload,
    is_tensor_item,
    item_nbytes,
    layout_key,
)
from ray_resilience._internal.constants import checkpoint_call_timeout_s
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointLoadError,
    CheckpointStorageError,
)
from ray_resilience.checkpoint.loaded import LoadedCheckpoint

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadTarget:
    """Who loads what: this rank, its model/optimizer, and where checkpoints live."""

    rank: int
    storage: CheckpointStorage
    coordinator: Any
    memory_tier: bool
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    local: LocalSnapshots | None = None
    config: CheckpointConfig | None = None
    """Its storage retries apply to reads too (None: no retry)."""
    torn: str | None = None
    """Why a local load failed after it began copying into the model and optimizer (their state
    is then part snapshot, part not: only a complete load may follow)."""


def load_newest(target: LoadTarget, agreement: Agreement) -> LoadedCheckpoint | None:
    """Restores the newest step every rank can load; None when there is none (the model and
    optimizer then as they came), and CheckpointLoadError when steps are committed but none
    loads on every rank."""
    stateless = target.optimizer is not None and not target.optimizer.state
    committed, holders = ray.get(target.coordinator.load_info.remote(target.rank),
                                 timeout=checkpoint_call_timeout_s())
    offer, own = _local_offer(target)
    gathered = agreement.gather(([d.name for d in committed], offer))
    names = gathered[0][0]
    candidates = [d for d in map(layout.parse_step_dir, names) if d is not None]
    failures = []
    # Newest first: a damaged newest file falls back to the other file, no retry needed.
    for common in _common_newest_first([g[1] for g in gathered]):
        if candidates and common[1] < candidates[0].step:
            break
        state, loaded, error = _try_local(target, common, own)
        if agreement.all_true(loaded is not None):
            loaded = _applied(target, state, loaded)
            target.local.keep_only(*common)
            loaded = dataclasses.replace(loaded, fallbacks=tuple(failures))
            logger.info("rank %d: resumed from step %d (local tier)", target.rank, loaded.step)
            return loaded
        errors = agreement.gather(error)
        reason = "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e) or "unknown error"
        failures.append(f"local step {common[1]} ({reason})")
        logger.warning("rank %d: local snapshot of step %d is not loadable on every rank (%s); "
                       "trying the next newest step", target.rank, common[1], reason)
    for step_dir in candidates:
        state, loaded, error = _try_step(target, step_dir, holders.get(step_dir))
        if agreement.all_true(loaded is not None):
            if target.local is not None:  # a new timeline starts: no old file may mix in
                target.local.keep_only(None, None)
            loaded = _applied(target, state, loaded)
            loaded = dataclasses.replace(loaded, fallbacks=tuple(failures))
            logger.info("rank %d: resumed from checkpoint step %d (%s tier)", target.rank,
                        loaded.step, loaded.tier)
            return loaded
        errors = agreement.gather(error)
        reason = "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e) or "unknown error"
        failures.append(f"step {step_dir.step} ({reason})")
        logger.warning("rank %d: checkpoint step %d is not loadable on every rank (%s); falling "
                       "back to the previous committed step", target.rank, step_dir.step, reason)
        if target.rank == 0:
            _quarantine(target, step_dir, reason)
    if candidates:  # local snapshots stay: a storage outage must not cost them too
        raise CheckpointLoadError(target.storage.display(), failures)
    if target.torn is not None:  # a fresh start must not train from half a snapshot
        raise CheckpointCorruptError(target.local.root, (
            f"{target.torn}; no other snapshot and no committed checkpoint could replace what it "
            "had copied into the model and optimizer. Build them anew and load again (a restart "
            "of the attempt does)"))
    if target.local is not None:  # training starts over: a new timeline
        target.local.keep_only(None, None)
    if stateless:
        _forget_state(target.optimizer)
    return None


def _forget_state(optimizer: torch.optim.Optimizer) -> None:
    """Empties the state that reading a new optimizer's state dict created. To list an
    optimizer's state, torch's `get_optimizer_state_dict` first steps a stateless optimizer once
    with zero gradients and lr 0: parameters unchanged, but every parameter left with state
    (AdamW: zero moments and a step count of 1). Offering or trying a snapshot reads it; when
    nothing loads, the fresh start's first step must find no state, as in a run that never
    restarted, or AdamW's bias correction counts one step too many and training diverges."""
    optimizer.state.clear()


def _local_offer(target: LoadTarget) -> tuple[list[tuple[str, int]], tuple[list, str] | None]:
    """This rank's intact local snapshots of its layout, and (its items, their digest)."""
    local = target.local
    slots = local.slots() if local is not None and local.disabled is None else []
    if not slots:  # no plan to build (25+ ms) on a rank with nothing to offer
        return [], None
    items, _ = capture(target.model, target.optimizer).build_items()
    digest = layout_digest(items)
    return [(s.session, s.step) for s in slots if s.layout == digest], (items, digest)


def _common_newest_first(offers: list[list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """The (session, step)s every rank offered, newest first."""
    common = set.intersection(*(set(map(tuple, o)) for o in offers)) if offers else set()
    return sorted(common, key=lambda key: key[1], reverse=True)


def _newest_common(offers: list[list[tuple[str, int]]]) -> tuple[str, int] | None:
    """The newest (session, step) every rank offered."""
    return next(iter(_common_newest_first(offers)), None)


def _try_local(target: LoadTarget, key: tuple[str, int], own: tuple[list, str] | None,
               ) -> tuple[dict, LoadedCheckpoint | None, str | None]:
    state = state_dict_of(target.model, target.optimizer)
    local = target.local
    if own is None or local is None:
        return state, None, "no local snapshot"
    items, digest = own
    where = f"local snapshot of step {key[1]} in {local.root}"
    copying = False
    try:
        sizes = [item_nbytes(i) for i in items if is_tensor_item(i)]
        with local.read(key[0], key[1], digest, sizes) as payload:
            if payload is None:
                return state, None, f"{where}: changed or unreadable"
            copying = True
            _dcp_load(state, MemoryShardReader(items, payload, where=where))
            extra = decode_extra(payload.extra, path=where)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - the committed tiers remain
        if copying:
            target.torn = f"{where}: {_describe(exc)}"
        return state, None, _describe(exc)
    return state, LoadedCheckpoint(step=key[1], extra=extra, tier="local", path=local.root), None


def _try_step(target: LoadTarget, step_dir: layout.StepDir, holders: list[Any] | None,
              ) -> tuple[dict, LoadedCheckpoint | None, str | None]:
    state = state_dict_of(target.model, target.optimizer)
    path = target.storage.display(step_dir.name)
    try:
        extra, replica = None, False
        for index, holder in enumerate(holders or []) if target.memory_tier else ():
            extra = _from_memory(target, step_dir, holder, state)
            if extra is not None:
                replica = index > 0
                break
        tier = "memory"
        if extra is None:
            extra, tier = _from_storage_retrying(target, step_dir, state), "storage"
        return state, LoadedCheckpoint(step=step_dir.step, extra=extra, tier=tier, path=path,
                                       replica=replica), None
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - every rank falls back together
        return state, None, _describe(exc)


def _from_memory(target: LoadTarget, step_dir: layout.StepDir, holder: Any,
                 state: dict) -> dict | None:
    try:
        payload, entry = _memory_payload(target, step_dir, holder)
        if entry is None:
            return None
        try:
            extra = _load_snapshot(target.model, target.optimizer, state, entry.items, payload,
                                   where=f"memory of {step_dir.name}")
        finally:
            if entry.lent is not None:
                holder.return_lent.remote(entry.lent)
        if extra is None:
            logger.info("rank %d: memory copy of step %d has another shard layout; reading storage",
                        target.rank, step_dir.step)
        return extra
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - storage remains the fallback
        logger.warning("rank %d: memory copy of step %d unusable (%s); trying a replica, if any, "
                       "then storage", target.rank, step_dir.step, _describe(exc))
        return None


def _memory_payload(target: LoadTarget, step_dir: layout.StepDir,
                    holder: Any) -> tuple[Any, MemoryEntry | None]:
    """This rank's shard of `step_dir` in `holder`'s memory: (its `ShardPayload`, mapped from
    the writer's shared memory on this node, or the object holding it; the entry), or
    (None, None) when the writer does not hold it."""
    here = node_here()
    for node_id in (here, None) if here is not None else (None,):
        entry = ray.get(holder.memory_entry.remote(target.rank, step_dir.session,
                                                   step_dir.step, node_id),
                        timeout=checkpoint_call_timeout_s())
        if entry is None or entry.shm is None:
            return (None if entry is None else entry.boxed[0]), entry
        handle, rest = entry.shm
        data = MAPS.array(handle, writable=False)
        if data is not None:
            return ShardPayload(data, rest.spans, rest.blobs, rest.extra), entry
        holder.return_lent.remote(entry.lent)  # not mappable here: ask for an object instead
    return None, None


def _load_snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict,
                   items: list, payload: Any, *, where: str) -> dict | None:
    """Loads a snapshot (`items`, its `ShardPayload` or the object holding it) into `state`;
    its extra state, or None when the layout differs (nothing is read then)."""
    own, _ = capture(model, optimizer).build_items()
    if layout_key(own) != layout_key(items):
        return None
    if not isinstance(payload, ShardPayload):
        payload = ray.get(payload, timeout=checkpoint_call_timeout_s())
    _dcp_load(state, MemoryShardReader(items, payload, where=where))
    return decode_extra(payload.extra, path=where)


def _from_storage_retrying(target: LoadTarget, step_dir: layout.StepDir, state: dict) -> dict:
    """`_from_storage`, again from the start after a transient storage error (as configured for
    writes: `num_storage_retries`, with backoff)."""
    def attempt() -> dict:
        try:
            return _from_storage(target, step_dir, state)
        except CheckpointException as exc:  # DCP wraps the reader's error: retry on what it was
            inner = _inner(exc)
            if isinstance(inner, CheckpointStorageError):
                raise inner from exc
            raise
    config = target.config
    if config is None:
        return attempt()
    return retrying(attempt, what=f"rank {target.rank}: reading checkpoint step {step_dir.step}",
                    num_retries=config.num_storage_retries,
                    backoff_s=config.storage_retry_backoff_s,
                    max_backoff_s=config.storage_retry_max_backoff_s)


def _quarantine(target: LoadTarget, step_dir: layout.StepDir, reason: str) -> None:
    """No rank could use this step: the coordinator offers it no more (this job)."""
    try:
        ray.get(target.coordinator.quarantine.remote(step_dir.name, reason),
                timeout=checkpoint_call_timeout_s())
    except Exception as exc:  # noqa: BLE001 - the fallback goes on; the next load tries it again
        logger.warning("rank 0: could not quarantine step %d: %s", step_dir.step, exc)


def _from_storage(target: LoadTarget, step_dir: layout.StepDir, state: dict) -> dict:
    manifest = commit.read_manifest(target.storage, step_dir)
    if manifest is None:
        where = target.storage.display(f"{step_dir.name}/{layout.MANIFEST_NAME}")
        raise CheckpointCorruptError(where, "the commit manifest disappeared")
    direct = target.config is None or target.config.direct_io
    _dcp_load(state, StorageShardReader(target.storage, manifest, direct=direct))
    owner = target.rank if target.rank < manifest.world_size else 0
    name = layout.extra_file_name(owner)
    if name not in manifest.files:
        raise CheckpointCorruptError(target.storage.display(f"{step_dir.name}/{name}"),
                                     "the extra-state file is not in the manifest")
    data = shard_io.read_verified(target.storage, step_dir.name, name, manifest.files[name])
    return decode_extra(data, path=target.storage.display(f"{step_dir.name}/{name}"))


def _dcp_load(state: dict, reader: Any) -> None:
    """DCP load of this rank's part only: reading needs no coordination between ranks."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)


def _applied(target: LoadTarget, state: dict, loaded: LoadedCheckpoint) -> LoadedCheckpoint:
    """Sets the loaded `state` into the model and optimizer; `loaded` without internal keys."""
    _apply(target.model, target.optimizer, state)
    if UNSTEPPED_KEY not in loaded.extra:
        return loaded
    if target.optimizer is not None:  # saved before its first step: stateless again
        _forget_state(target.optimizer)
    extra = {k: v for k, v in loaded.extra.items() if k != UNSTEPPED_KEY}
    return dataclasses.replace(loaded, extra=extra)


def _apply(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict) -> None:
    set_model_state_dict(model, state[MODEL_KEY])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state[OPTIMIZER_KEY])


def warm_restore_path(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """A memory-tier restore of `model`/`optimizer` from their own snapshot, in process, so a
    warm spare pays the first restore's lazy imports before it is needed. No RPC, no collective."""
    source = StateCache().source(model, optimizer)
    buffers = StagingBuffers(source.items, source.tensors)
    buffers.copy_now(source.tensors, list(range(len(source.tensors))))
    payload = buffers.payload(source.blobs, encode_extra({"step": 0}))
    state = state_dict_of(model, optimizer)
    if _load_snapshot(model, optimizer, state, source.items, payload, where="warm-up") is None:
        raise RuntimeError("warm-up: the rebuilt save plan differs from the cached one")
    _apply(model, optimizer, state)


def _inner(exc: BaseException) -> BaseException:
    """The reader's own error: DCP wraps it in a CheckpointException."""
    for failure in getattr(exc, "failures", {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, BaseException):
            return inner
    return exc


def _describe(exc: BaseException) -> str:
    """The most specific message."""
    inner = _inner(exc)
    return f"{type(inner).__name__}: {inner}"
