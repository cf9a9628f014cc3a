"""`LeaseKeeper`: a job's hold on its run, from before any actor that writes until after the last
one is gone. It takes the lease (`format/lease.py`), renews it on a daemon thread, notes when
another job took the run, and releases it at the end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ray_resilience._internal.checkpoint.format.lease import (
    Fence,
    HeldLease,
    LeaseConflict,
    acquire,
)
from ray_resilience._internal.checkpoint.format.lease_backends import lease_backend
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.checkpoint.errors import CheckpointError, LeaseLostError

logger = logging.getLogger(__name__)
RENEWALS_PER_TTL = 5
"""Renewals per lease lifetime: three may fail in a row before commits stop (`Fence.margin_s`)."""


class LeaseKeeper:
    """Renews `lease` every `ttl / RENEWALS_PER_TTL` until closed; no lease: does nothing."""

    def __init__(self, lease: HeldLease | None) -> None:
        self._lease = lease
        self.lost: LeaseLostError | None = None
        """Set when another job took the run: this one must stop."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if lease is not None:
            self._thread = threading.Thread(target=self._run, name="rr-lease", daemon=True)
            self._thread.start()

    @classmethod
    def claim(cls, storage: CheckpointStorage, run_name: str, config: CheckpointConfig,
              should_stop: Callable[[], bool] = lambda: False) -> LeaseKeeper:
        """Takes the run's lease (waiting up to `config.lease_wait_s`); RunInUseError when
        another job holds it. A file system without atomic create runs without one (warned)."""
        backend = lease_backend(storage)
        if backend is None:
            logger.warning("run %s: %s supports no atomic create, so nothing keeps a second job "
                           "of the same run name from writing its checkpoints", run_name,
                           storage.display())
            return cls(None)
        return cls(acquire(backend, run=run_name, ttl_s=config.lease_ttl_s,
                           wait_s=config.lease_wait_s, should_stop=should_stop))

    @property
    def fence(self) -> Fence | None:
        return None if self._lease is None else self._lease.fence()

    @property
    def generation(self) -> int | None:
        return None if self._lease is None else self._lease.generation

    def _run(self) -> None:
        lease = self._lease
        while not self._stop.wait(lease.ttl_s / RENEWALS_PER_TTL):
            try:
                lease.renew()
            except LeaseConflict:
                self.lost = self._taken_over(lease)
                logger.error("%s", self.lost)
                return
            except CheckpointError as exc:  # storage briefly away: the next renewal may work
                logger.warning("run %s: renewing its lease failed (%s); retried in %.0f s",
                               lease.record.run, exc, lease.ttl_s / RENEWALS_PER_TTL)

    @staticmethod
    def _taken_over(lease: HeldLease) -> LeaseLostError:
        try:
            found = lease.backend.read()
            who = "it was deleted" if found is None else \
                f"the run was taken over by {found[0].describe()}"
        except CheckpointError as exc:
            who = f"it changed under this job ({exc})"
        return LeaseLostError(lease.record.run, lease.backend.where, who)

    def close(self, *, release: bool = True) -> None:
        """Stops renewing and, unless the run was lost, releases the lease (the job's writers
        must be gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if not release or self._lease is None or self.lost is not None:
            return
        try:
            self._lease.release()
        except (LeaseConflict, CheckpointError) as exc:
            logger.warning("run %s: could not release its lease (%s); it expires by itself",
                           self._lease.record.run, exc)
        self._lease = None
