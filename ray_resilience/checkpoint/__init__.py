"""Async, exact, always-loadable checkpoints through a pool of writer actors.

Supervisor side: `CheckpointService.start(...)` then `rank_spec(rank)` per rank. Worker side:
`RankCheckpointer(spec, rank=, world_size=)` with `load`, `maybe_save`, `wait_idle`, `close`.
Checkpoints use the PyTorch Distributed Checkpoint layout under `<run_dir>/checkpoints/`.
Names are imported on first use: the coordinator and writers start without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ray_resilience._internal.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "CheckpointConfig": "ray_resilience.checkpoint.config",
    **dict.fromkeys(("CheckpointCorruptError", "CheckpointError", "CheckpointLoadError",
                     "CheckpointStateError", "CheckpointStorageError", "StorageFullError",
                     "StoragePermissionError", "StorageUnavailableError", "UnsafeCheckpointError"),
                    "ray_resilience.checkpoint.errors"),
    "RankCheckpointer": "ray_resilience.checkpoint.rank_checkpointer",
    **dict.fromkeys(("CheckpointService", "RankCheckpointSpec"), "ray_resilience.checkpoint.service"),
    "LoadedCheckpoint": "ray_resilience.checkpoint.types",
}

__all__ = [
    "CheckpointConfig", "CheckpointCorruptError", "CheckpointError", "CheckpointLoadError",
    "CheckpointService", "CheckpointStateError", "CheckpointStorageError", "LoadedCheckpoint",
    "RankCheckpointer", "RankCheckpointSpec", "StorageFullError", "StoragePermissionError",
    "StorageUnavailableError", "UnsafeCheckpointError",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:
    from ray_resilience.checkpoint.config import CheckpointConfig
    from ray_resilience.checkpoint.errors import (
        CheckpointCorruptError, CheckpointError, CheckpointLoadError, CheckpointStateError,
        CheckpointStorageError, StorageFullError, StoragePermissionError, StorageUnavailableError,
        UnsafeCheckpointError)
    from ray_resilience.checkpoint.rank_checkpointer import RankCheckpointer
    from ray_resilience.checkpoint.service import CheckpointService, RankCheckpointSpec
    from ray_resilience.checkpoint.types import LoadedCheckpoint
