"""Unblocking every collective of this process from any thread, within milliseconds.

Measured on torch 2.13 + gloo (tests/process/test_abort.py keeps these facts honest):
- ``ProcessGroup.abort()``/``shutdown()`` and ``destroy_process_group()`` from another thread
  return, but a rank blocked in a gloo collective keeps waiting until the process-group timeout;
- ``shutdown(SHUT_RDWR)`` on gloo's peer connections makes the blocked call raise
  ``RuntimeError: ... Connection closed by peer`` within milliseconds (~10-30 ms here, most of
  it reading /proc), and the process and its TCPStore stay usable; sockets that existed before
  the snapshot (Ray's) are never touched (``_internal/sockets.py`` says how gloo's connections are
  found, and why shutting down anything else is dangerous);
- gloo opens a group's connections when the group is created (measured for
  ``init_process_group`` and ``new_group``), not at the first collective, and a 1-D device mesh
  over the world reuses the default group. Connections are looked up again at abort time, so
  groups created after ``mark_initialized`` (device-mesh subgroups) are covered too.
For NCCL the backend's own abort (``ncclCommAbort``) does the job; that path is guarded by
backend and untested on CPU machines.

Call order (the worker; process-wide calls once, the rest per attempt):
    freeze_startup_objects()                         # once, after imports (pg_teardown.py)
    aborter = CollectiveAborter()                    # once
    aborter.snapshot_before_init(store_port=port)    # before init_process_group
    dist.init_process_group(..., timeout=pg_timeout())
    aborter.mark_initialized()                       # after it; checks the mechanism can work
    ... training thread runs ...
    async_raise(train_thread.ident)                  # hang in Python only (interrupt.py)
    aborter.abort()                                  # from ANY thread; never raises
    ... join the training thread, drop model, optimizer, exceptions ...
    teardown_process_groups()                        # pg_teardown.py
    aborter.reset()                                  # then the next attempt's snapshot
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import time

import torch
import torch.distributed as dist

from ray_resilience._internal.constants import DEFAULT_PG_TIMEOUT_S, PG_TIMEOUT_ENV_VAR, env_float
from ray_resilience._internal.process_groups import gloo_sockets as sockets

logger = logging.getLogger(__name__)



def pg_timeout() -> datetime.timedelta:
    """The timeout to pass to ``init_process_group`` (env var ``RAY_RESILIENCE_PG_TIMEOUT_S``)."""
    return datetime.timedelta(seconds=env_float(PG_TIMEOUT_ENV_VAR, DEFAULT_PG_TIMEOUT_S))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbortReport:
    """What one ``abort()`` did."""

    sockets_shut: tuple[str, ...]
    """Connections shut down (gloo's, and the store's with ``include_store``), "local->remote"."""
    nccl_groups_aborted: int
    """Process groups aborted through the NCCL backend (0 on CPU)."""
    duration_s: float
    """Time spent inside ``abort()``."""
    errors: tuple[str, ...] = ()
    """Problems met on the way (abort never raises: it runs on control threads)."""


class CollectiveAborter:
    """Makes every collective blocked in this process fail now, from any thread.

    One per process, reused across attempts. Thread-safe: ``abort()`` may race with the training
    thread and with itself. It neither destroys process groups nor frees memory: after it, the
    training thread unwinds with an exception, and ``teardown_process_groups()`` cleans up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._baseline: frozenset[int] | None = None
        self._store_ports: frozenset[int] = frozenset()
        self._aborted = threading.Event()

    def snapshot_before_init(self, *, store_port: int | None = None) -> None:
        """Records the sockets that exist before torch.distributed starts; they are never touched.

        Call right before ``init_process_group``. Pass the rendezvous (MASTER_PORT) port when it is
        known already, so an abort that arrives during initialization spares the store.
        """
        with self._lock:
            self._baseline = sockets.socket_inodes()
            self._store_ports = frozenset() if store_port is None else frozenset({store_port})
            self._aborted.clear()

    def mark_initialized(self, store_port: int | None = None) -> int:
        """Call after ``init_process_group``; returns the gloo connections an abort would shut.

        The default group's TCPStore port is detected; pass ``store_port`` for other stores. Logs
        an error when the default group uses gloo across ranks and none is found: the
        mechanism no longer works on this torch, and aborts fall back to the process-group
        timeout.
        """
        with self._lock:
            if self._baseline is None:
                raise RuntimeError("call snapshot_before_init() before init_process_group()")
            detected = _default_store_port()
            self._store_ports |= {p for p in (store_port, detected) if p is not None}
            found = sockets.find_gloo_sockets(self._baseline, self._store_ports)
        if not found and _uses_gloo_across_ranks():
            logger.error(
                "No gloo connections found after init_process_group on torch %s: aborting a "
                "blocked collective will wait for the process-group timeout (%s) instead. "
                "Run tests/process/test_abort.py on this torch.", torch.__version__, pg_timeout())
        return len(found)

    @property
    def aborted(self) -> bool:
        """True once ``abort()`` ran in this attempt: a collective error is then ours, not a
        fault."""
        return self._aborted.is_set()

    def abort(self, *, include_store: bool = False) -> AbortReport:
        """Shuts gloo's connections and aborts NCCL communicators; never raises.

        Safe to call more than once and before ``mark_initialized`` (connections are looked up
        now). Blocked collectives raise ``RuntimeError`` in their threads; the process groups are
        unusable afterwards and must be torn down before the next attempt. ``include_store`` also
        shuts this process's TCPStore client connections, which unblocks a rank waiting in
        rendezvous (``init_process_group``/``new_group`` wait on the store for absent peers;
        measured: ``DistNetworkError`` within ~20 ms). Only when the store is not reused by the
        next attempt: it is left unusable. The store's server side is never touched.
        """
        start = time.monotonic()
        self._aborted.set()
        errors: list[str] = []
        shut = self._shut_sockets(errors, include_store)
        nccl = _abort_nccl(errors)
        report = AbortReport(sockets_shut=tuple(shut), nccl_groups_aborted=nccl,
                             duration_s=time.monotonic() - start, errors=tuple(errors))
        logger.info("collective abort: %d connections shut, %d NCCL groups aborted in "
                    "%.1f ms", len(shut), nccl, report.duration_s * 1e3)
        return report

    def reset(self) -> None:
        """Forgets this attempt (call after teardown, before the next ``snapshot_before_init``)."""
        with self._lock:
            self._baseline, self._store_ports = None, frozenset()
            self._aborted.clear()

    def _shut_sockets(self, errors: list[str], include_store: bool) -> list[str]:
        with self._lock:
            baseline, store_ports = self._baseline, self._store_ports
        if baseline is None:
            errors.append("abort() before snapshot_before_init(): sockets left alone")
            return []
        try:
            found = sockets.find_gloo_sockets(baseline, store_ports)
            if include_store:
                found += sockets.find_store_client_sockets(baseline, store_ports)
        except Exception as exc:  # noqa: BLE001 - /proc unreadable: report, fall back to timeout
            errors.append(f"scanning /proc for sockets failed: {exc!r}")
            return []
        return [f"{s.local}->{s.remote}" for s in found if sockets.shutdown_socket(s)]


def _default_store_port() -> int | None:
    """Port of the TCPStore behind the default group (unwrapping PrefixStores), if any."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store.port if isinstance(store, dist.TCPStore) else None


def _uses_gloo_across_ranks() -> bool:
    return (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
            and "gloo" in str(dist.get_backend()))


def _abort_nccl(errors: list[str]) -> int:
    """``ncclCommAbort`` on every group when any uses NCCL (untested here: needs a GPU).

    torch's ``_abort_process_group()`` aborts all communicators inside one NCCL group call (aborts
    of separate communicators could otherwise deadlock each other) and unregisters every group, so
    teardown afterwards finds nothing left to destroy.
    """
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        groups = list(dist.distributed_c10d._world.pg_map)
        if not any("nccl" in str(dist.get_backend(g)) for g in groups):
            return 0
        dist.distributed_c10d._abort_process_group()
        return len(groups)
    except Exception as exc:  # noqa: BLE001 - abort runs on control threads and must not raise
        errors.append(f"NCCL abort failed: {exc!r}")
        return 0
