"""Background import of torch's DCP for the checkpoint service's actors: they start without it,
and messages carrying DCP types are unpickled only once the import is done.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import threading
from typing import Any

logger = logging.getLogger(__name__)


class WarmImport:
    """Imports `modules` on a daemon thread from construction; `loads` waits for it."""

    def __init__(self, *modules: str) -> None:
        self._done = threading.Event()
        self._modules = modules
        thread = threading.Thread(target=self._run, name="rr-warm-import", daemon=True)
        thread.start()
        self.thread_id: int | None = thread.native_id

    def _run(self) -> None:
        try:
            for name in self._modules:
                importlib.import_module(name)
        except Exception:
            logger.exception("background import of %s failed", self._modules)
        finally:
            self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def loads(self, data: bytes) -> Any:
        """Unpickles a message from this service's own ranks or writers, after the import."""
        self._done.wait()
        return pickle.loads(data)


def dumps(message: Any) -> bytes:
    """The sending side of `WarmImport.loads`."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
