"""A rank's handle on its node's checkpoint writer, replaced through the coordinator when the
writer dies."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from ray_resilience._internal.checkpoint.wire import SaveTicket, ShardOutcome
from ray_resilience._internal.constants import (
    DEFAULT_WRITER_POLL_S,
    WRITER_POLL_ENV_VAR,
    env_float,
)
from ray_resilience.checkpoint.config import CheckpointConfig

logger = logging.getLogger(__name__)


def writer_poll_s() -> float:
    return env_float(WRITER_POLL_ENV_VAR, DEFAULT_WRITER_POLL_S)


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

    def wait_durable(self, ticket: SaveTicket, config: CheckpointConfig, *,
                     closed: Callable[[], bool]) -> ShardOutcome:
        """The writer's outcome of the shard `ticket` handed it, polled (warning periodically)
        until `config.write_timeout_s` or `closed()`; raises what the call to the writer
        raised (it died or does not answer)."""
        deadline = time.monotonic() + config.write_timeout_s
        next_warning = time.monotonic() + config.warn_interval_s
        while True:
            poll_s = writer_poll_s()
            outcome = ray.get(self.handle.wait.remote(ticket.key, poll_s), timeout=poll_s + 60)
            if outcome is not None:
                return outcome
            now = time.monotonic()
            if closed() or now > deadline:
                why = "checkpointer closed" if closed() else (
                    f"not durable within CheckpointConfig.write_timeout_s={config.write_timeout_s}")
                return ShardOutcome(ticket.session, ticket.step, False, why)
            if now > next_warning:
                logger.warning("rank %d: checkpoint step %d not durable after %.0f s (writer %s)",
                               self.rank, ticket.step, now - deadline + config.write_timeout_s,
                               self.writer_id)
                next_warning = now + config.warn_interval_s
