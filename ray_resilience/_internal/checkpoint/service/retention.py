"""`Retention`: what the commit coordinator knows of the run's committed steps, on the run's
timeline (newest first), which of them are quarantined, and whether this job still holds the
run: every deletion checks the lease first (`Fence`), and a job that lost the run deletes
nothing."""

from __future__ import annotations

import logging
import threading

from ray_resilience._internal.checkpoint.format import commit, layout
from ray_resilience._internal.checkpoint.format.lease import Fence
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import CheckpointStorageError, LeaseLostError

logger = logging.getLogger(__name__)


class Retention:
    """Thread-safe; read back from storage when the coordinator (re)starts."""

    def __init__(self, storage: CheckpointStorage, config: CheckpointConfig,
                 fence: Fence | None) -> None:
        self.storage, self.config, self.fence = storage, config, fence
        self.generation = fence.generation if fence is not None else 0
        self._lock = threading.Lock()
        self._committed = commit.committed_steps(storage, generation=self.generation)
        self._quarantined: dict[layout.StepDir, str] = {}
        self.fenced: LeaseLostError | None = None
        """Set once another job took the run: final, nothing is committed or deleted again."""

    def committed(self) -> list[layout.StepDir]:
        """Every committed step, newest first on the timeline."""
        with self._lock:
            return list(self._committed)

    def loadable(self) -> list[layout.StepDir]:
        """The committed steps not quarantined, newest first."""
        with self._lock:
            return [d for d in self._committed if d not in self._quarantined]

    def quarantined(self) -> dict[str, str]:
        with self._lock:
            return {d.name: reason for d, reason in self._quarantined.items()}

    def add(self, step_dir: layout.StepDir) -> None:
        """A new commit: the newest on the timeline."""
        with self._lock:
            self._committed.insert(0, step_dir)

    def quarantine(self, step_name: str, reason: str) -> None:
        """Every rank failed to load this step: offered no more, and counts for nothing in
        retention (this job; another job tries it again)."""
        step_dir = layout.parse_step_dir(step_name)
        with self._lock:
            if step_dir is None or step_dir in self._quarantined:
                return
            self._quarantined[step_dir] = reason
        logger.warning("checkpoint step %d (%s) quarantined, no longer offered: %s",
                       step_dir.step, self.storage.display(step_name), reason)

    def check_fence(self) -> None:
        """Raises LeaseLostError unless this job still holds the run."""
        if self.fence is None:
            return
        if self.fenced is not None:
            raise self.fenced
        try:
            self.fence.check()
        except LeaseLostError as exc:
            self.lost(exc)
            raise
        except CheckpointStorageError as exc:
            raise LeaseLostError(self.fence.run, self.fence.backend.where,
                                 f"it could not be read ({exc})", final=False) from exc

    def lost(self, exc: LeaseLostError) -> None:
        if exc.final and self.fenced is None:
            logger.error("checkpoint coordinator: %s", exc)
            self.fenced = exc

    def prune(self, session: str | None) -> None:
        """Deletes what can no longer be loaded or committed (`commit.prune`), once the lease
        confirmed this job still holds the run; then reads the committed steps back."""
        try:
            self.check_fence()
            with self._lock:
                quarantined = set(self._quarantined)
            commit.prune(self.storage, num_to_keep=self.config.num_to_keep,
                         generation=self.generation, session=session, quarantined=quarantined)
            committed = commit.committed_steps(self.storage, generation=self.generation)
            with self._lock:
                self._committed = committed
                self._quarantined = {d: r for d, r in self._quarantined.items()
                                     if d in committed}
        except Exception as exc:  # noqa: BLE001 - cleanup is retried after the next commit
            logger.warning("checkpoint cleanup under %s skipped (retried later): %s",
                           self.storage.display(), exc)
