"""`LoadedCheckpoint`: what `ray_resilience.load_checkpoint()` restored."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    """What `RankCheckpointer.load` restored: resume after `step`."""

    step: int
    extra: dict[str, Any]
    tier: Literal["local", "memory", "storage"]
    """"local" (this node's shared-memory snapshot), "memory" (a writer's copy of a committed
    step) or "storage"."""
    path: str
    """The step folder (URI or local path) the checkpoint belongs to."""
    fallbacks: tuple[str, ...] = ()
    """Newer committed steps that could not be loaded, each with the reason (file named)."""
    replica: bool = False
    """Memory tier only: read from a replica, not from the writer of this rank's shard."""
