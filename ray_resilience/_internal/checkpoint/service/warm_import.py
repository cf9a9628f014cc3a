"""Background import of torch's DCP for the checkpoint service's actors: they start without it,
and messages carrying DCP types are unpickled only once the import is done.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)


class WarmImport:
    """Imports `modules` on a daemon thread once `start` is called (or the first `wait` or
    `loads` needs them). Deferred because importing torch costs ~2 CPU-seconds, which on a
    small node is taken from the ranks' own start-up (their imports, first step) when it runs
    beside it: the supervisor starts it after the run's first step (with the ranks where the
    nodes have idle cores: `worker_group/imports.py`). The thread exists from
    construction (`thread_id`), so a writer that lowers its other threads can leave this one at
    the ranks' priority: a writer replacing one lost with a node imports at once, and the run
    has no durable commit until it has."""

    def __init__(self, *modules: str) -> None:
        self._done = threading.Event()
        self._go = threading.Event()
        self._modules = modules
        self._lock = threading.Lock()
        self.started_at: float | None = None
        """Wall time `start` ran (None: not yet)."""
        thread = threading.Thread(target=self._run, name="rr-warm-import", daemon=True)
        thread.start()
        self.thread_id: int | None = thread.native_id

    def start(self) -> None:
        """Starts the import; later calls do nothing."""
        with self._lock:
            if self.started_at is None:
                self.started_at = time.time()
                self._go.set()

    @property
    def state(self) -> str:
        """"deferred" (not started), "importing" or "done"."""
        if self._done.is_set():
            return "done"
        return "importing" if self._go.is_set() else "deferred"

    def _run(self) -> None:
        self._go.wait()
        try:
            for name in self._modules:
                importlib.import_module(name)
        except Exception:
            logger.exception("background import of %s failed", self._modules)
        finally:
            self._done.set()

    def wait(self) -> None:
        self.start()
        self._done.wait()

    def loads(self, data: bytes) -> Any:
        """Unpickles a message from this service's own ranks or writers, after the import."""
        self.wait()
        return pickle.loads(data)


def dumps(message: Any) -> bytes:
    """The sending side of `WarmImport.loads`."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
