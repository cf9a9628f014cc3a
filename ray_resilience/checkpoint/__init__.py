"""Async, exact, always-loadable checkpoints through a pool of writer actors.

Supervisor side: `CheckpointService.start(...)` then `rank_spec(rank)` per rank. Worker side:
`RankCheckpointer(spec, rank=, world_size=)` with `load`, `maybe_save`, `wait_idle`, `close`.
Checkpoints use the PyTorch Distributed Checkpoint layout under `<run_dir>/checkpoints/`.
"""

from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import (
    CheckpointCorruptError, CheckpointError, CheckpointLoadError, CheckpointStateError,
    CheckpointStorageError, StorageFullError, StoragePermissionError, StorageUnavailableError,
    UnsafeCheckpointError)
from ray_resilience.checkpoint.rank_checkpointer import RankCheckpointer
from ray_resilience.checkpoint.service import CheckpointService, RankCheckpointSpec
from ray_resilience.checkpoint.types import LoadedCheckpoint

__all__ = [
    "CheckpointConfig", "CheckpointCorruptError", "CheckpointError", "CheckpointLoadError",
    "CheckpointService", "CheckpointStateError", "CheckpointStorageError", "LoadedCheckpoint",
    "RankCheckpointSpec", "RankCheckpointer", "StorageFullError", "StoragePermissionError",
    "StorageUnavailableError", "UnsafeCheckpointError",
]
