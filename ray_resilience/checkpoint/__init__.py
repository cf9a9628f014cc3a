"""Checkpoint settings, errors and what a load returns (the machinery: `_internal/checkpoint/`)."""

from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointLoadError,
    CheckpointStateError,
    CheckpointStorageError,
    LeaseLostError,
    RunInUseError,
    StorageFullError,
    StoragePermissionError,
    StorageUnavailableError,
    UnsafeCheckpointError,
)
from ray_resilience.checkpoint.loaded import LoadedCheckpoint

__all__ = [
    "CheckpointConfig", "CheckpointCorruptError", "CheckpointError", "CheckpointLoadError",
    "CheckpointStateError", "CheckpointStorageError", "LeaseLostError", "LoadedCheckpoint",
    "RunInUseError", "StorageFullError", "StoragePermissionError", "StorageUnavailableError",
    "UnsafeCheckpointError",
]
