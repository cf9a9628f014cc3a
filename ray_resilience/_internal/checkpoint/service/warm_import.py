"""Background import of torch's DCP for the checkpoint service's actors.

The writers and the commit coordinator start without torch (3-4 s to import on a small CPU
machine), so the service is up while the ranks still start. Their first write and first commit
need DCP's types, though; importing them then made the first checkpoint of a run seconds late,
and a rank failing meanwhile lost every save of its attempt. So each actor imports them on a
background thread as it starts, and whatever carries DCP types to it travels as bytes, unpickled
only after that import is done: never two threads inside torch's import at once.
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
        """Unpickles an RPC message from this service's own ranks or writers (never data read
        from storage), once the import is over."""
        self._done.wait()
        return pickle.loads(data)


def dumps(message: Any) -> bytes:
    """The sending side of `WarmImport.loads`."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
