"""One writer per run: a lease object in the run's storage (who holds it, since when, its
generation, when it expires), taken with an atomic create or compare-and-swap
(`lease_backends.py`), renewed while the job runs, and checked before every commit and deletion
(the `Fence`): a job whose generation is no longer the newest commits and deletes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from ray_resilience.checkpoint.errors import CheckpointCorruptError, LeaseLostError, RunInUseError

logger = logging.getLogger(__name__)
POLL_S = 0.5
"""How often a job waiting for a run's lease looks again."""


class LeaseConflict(Exception):
    """A create or compare-and-swap lost: another process changed the lease first."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    """The lease object's content."""

    run: str
    generation: int
    """1 for the run's first job; +1 for every job that took the run over since."""
    holder: str
    """A random id of the holding job (its checkpoint service)."""
    owner: dict[str, Any]
    """host, pid and Ray job id of the process that took it."""
    acquired_at: float
    renewed_at: float
    expires_at: float
    released: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes, *, where: str) -> LeaseRecord:
        try:
            raw = json.loads(bytes(data).decode())
            return cls(run=str(raw["run"]), generation=int(raw["generation"]),
                       holder=str(raw["holder"]), owner=dict(raw["owner"]),
                       acquired_at=float(raw["acquired_at"]), renewed_at=float(raw["renewed_at"]),
                       expires_at=float(raw["expires_at"]), released=bool(raw["released"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointCorruptError(where, f"malformed run lease ({exc})") from exc

    def live(self, now: float) -> bool:
        return not self.released and self.expires_at > now

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        o = self.owner
        return (f"host {o.get('host')} pid {o.get('pid')} (Ray job {o.get('job_id')}), "
                f"generation {self.generation}, since {_iso(self.acquired_at)}; its lease "
                f"expires {_iso(self.expires_at)} (in {self.expires_at - now:.0f} s)")


class LeaseBackend(Protocol):
    """Where the lease lives: an atomic create and a compare-and-swap on one object."""

    where: str

    def read(self) -> tuple[LeaseRecord, Any] | None:
        """The current lease and its version, None when the run never had one."""

    def create(self, record: LeaseRecord, after: Any | None) -> Any:
        """Installs `record` as the successor of version `after` (None: the first lease);
        LeaseConflict when another process did first. Returns the new version."""

    def update(self, record: LeaseRecord, version: Any) -> Any:
        """Replaces the current lease, still at `version`, by `record` (same generation)."""


def owner_info() -> dict[str, Any]:
    job_id = None
    try:
        import ray  # noqa: PLC0415 - format code also runs without Ray (tests, tools)

        if ray.is_initialized():
            job_id = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - the job id is informative only
        pass
    return {"host": socket.gethostname(), "pid": os.getpid(), "job_id": job_id}


class HeldLease:
    """This job's hold on the run (picklable: it moves to the process that renews it)."""

    def __init__(self, backend: LeaseBackend, record: LeaseRecord, version: Any,
                 ttl_s: float) -> None:
        self.backend, self.record, self.version, self.ttl_s = backend, record, version, ttl_s

    @property
    def generation(self) -> int:
        return self.record.generation

    def renew(self) -> None:
        """Pushes the expiry out by `ttl_s`; LeaseConflict when another job took the run."""
        now = time.time()
        record = dataclasses.replace(self.record, renewed_at=now, expires_at=now + self.ttl_s)
        self.version = self.backend.update(record, self.version)
        self.record = record

    def release(self) -> None:
        """Ends the lease (the job is over): the next job takes the run at once."""
        now = time.time()
        record = dataclasses.replace(self.record, released=True, renewed_at=now, expires_at=now)
        self.version = self.backend.update(record, self.version)
        self.record = record

    def fence(self) -> Fence:
        return Fence(self.backend, self.record.run, self.generation, self.record.holder,
                     margin_s=self.ttl_s / 4)


@dataclasses.dataclass(frozen=True)
class Fence:
    """What commits and deletions check first (picklable: the coordinator and writers hold one)."""

    backend: LeaseBackend
    run: str
    generation: int
    holder: str
    margin_s: float
    """The lease must stay valid this much longer: the write that follows fits in it."""

    def check(self) -> None:
        """Returns when this job still holds the run's newest lease for `margin_s` more;
        LeaseLostError otherwise (`final` when another job took the run or it was released), a
        CheckpointStorageError when the lease could not be read."""
        found = self.backend.read()
        now = time.time()
        if found is None:
            raise LeaseLostError(self.run, self.backend.where, "it was deleted")
        record = found[0]
        if (record.generation, record.holder) != (self.generation, self.holder):
            raise LeaseLostError(self.run, self.backend.where,
                                 f"the run was taken over by {record.describe(now)}")
        if record.released:
            raise LeaseLostError(self.run, self.backend.where, "it was released")
        if record.expires_at < now + self.margin_s:
            raise LeaseLostError(self.run, self.backend.where,
                                 f"not renewed since {_iso(record.renewed_at)}; it expires in "
                                 f"{record.expires_at - now:.0f} s", final=False)


def acquire(backend: LeaseBackend, *, run: str, ttl_s: float, wait_s: float,
            should_stop: Callable[[], bool] = lambda: False) -> HeldLease:
    """Takes the run's lease: a new one, or the successor of a released or expired one. While
    another job holds it, waits up to `wait_s`, then raises RunInUseError naming the holder."""
    deadline, holder = time.monotonic() + wait_s, secrets.token_hex(8)
    while True:
        found = backend.read()
        now = time.time()
        if found is None or not found[0].live(now):
            generation = 1 if found is None else found[0].generation + 1
            record = LeaseRecord(run=run, generation=generation, holder=holder,
                                 owner=owner_info(), acquired_at=now, renewed_at=now,
                                 expires_at=now + ttl_s)
            try:
                version = backend.create(record, None if found is None else found[1])
            except LeaseConflict:
                continue  # another job got there first: look again
            if found is not None and not found[0].released:
                logger.warning("run %s: took over the lease of %s, which expired without being "
                               "released (a crashed job)", run, found[0].describe(now))
            return HeldLease(backend, record, version, ttl_s)
        left = deadline - time.monotonic()
        if left <= 0 or should_stop():
            raise RunInUseError(run, found[0].describe(now), backend.where, wait_s)
        time.sleep(min(POLL_S, left, max(found[0].expires_at - now, 0.05)))


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
