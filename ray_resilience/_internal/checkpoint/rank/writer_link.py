"""A rank's handle on its node's checkpoint writer, replaced through the coordinator when the
writer dies."""

from __future__ import annotations

import logging
from typing import Any

import ray

logger = logging.getLogger(__name__)


class WriterLink:
    """This rank's current writer; replaced through the coordinator when it dies."""

    def __init__(self, *, rank: int, writer: Any, writer_id: str, coordinator: Any) -> None:
        self.rank, self.handle = rank, writer
        self.writer_id, self.coordinator = writer_id, coordinator
        self.relay: Any = None
        """The node agent that gathers this node's votes into one call (None: vote directly)."""

    def replace(self) -> None:
        dead = self.writer_id
        self.handle, self.writer_id = ray.get(
            self.coordinator.replace_writer.remote(self.rank, dead))
        logger.warning("rank %d: checkpoint writer %s died; now using %s", self.rank, dead,
                       self.writer_id)
