"""Unblocking every collective of this process from any thread, within milliseconds.

gloo: shut down its peer connections (``gloo_sockets.py``); NCCL: ``ncclCommAbort`` (untested on
CPU). Why and the call order in a rank: docs/design.md, section 5.
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
    """Makes every collective blocked in this process fail now, from any thread; one per process,
    reused across attempts. It frees nothing: ``teardown_process_groups()`` does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._baseline: frozenset[int] | None = None
        self._store_ports: frozenset[int] = frozenset()
        self._aborted = threading.Event()

    def snapshot_before_init(self, *, store_port: int | None = None) -> None:
        """Records the sockets that exist before ``init_process_group``; they are never touched.
        Pass the rendezvous port when known, so an abort during initialization spares the store."""
        with self._lock:
            self._baseline = sockets.socket_inodes()
            self._store_ports = frozenset() if store_port is None else frozenset({store_port})
            self._aborted.clear()

    def mark_initialized(self, store_port: int | None = None) -> int:
        """Call after ``init_process_group``; returns the gloo connections an abort would shut.
        Logs an error when a multi-rank gloo group has none: aborts then fall back to the
        timeout."""
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
        """Shuts gloo's connections and aborts NCCL communicators; never raises, safe to repeat.
        The groups must be torn down afterwards. ``include_store`` also cuts the TCPStore client
        connections, which unblocks a rendezvous (only when the store is not reused)."""
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
    """``ncclCommAbort`` on every group when any uses NCCL (untested: needs a GPU), in
    one NCCL group call, as torch's ``_abort_process_group()`` does."""
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
