"""The rank actor's class as the supervisor sees it: creating it imports nothing heavy.

The actor process builds the real `Worker` in `__init__`; the supervisor never imports torch.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from ray_resilience._internal.rank import preimport


class WorkerActor:
    """One rank's actor (see `Worker` for what each call does)."""

    def __init__(self, train_fn: bytes, train_config: dict[str, Any] | None,
                 supervisor: Any) -> None:
        # Wait for a background pre-import: never two threads in the same imports.
        self._preimport_wait_s = preimport.claim()
        from ray import cloudpickle  # noqa: PLC0415 - only after claim(), see above

        from ray_resilience._internal.rank.worker import Worker  # noqa: PLC0415 - torch: in the rank, after claim()

        self._worker = Worker(cloudpickle.loads(train_fn), train_config, supervisor)
        if threading.current_thread() is threading.main_thread():  # signal handlers live there
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A rank told to terminate saves a step first (see `Worker.on_sigterm`); an idle actor
        exits as Ray's own handler would."""
        if not self._worker.on_sigterm():
            sys.exit(1)

    def info(self) -> dict[str, Any]:
        info = self._worker.info()
        info["preimport"] = dict(preimport.stats, waited_s=self._preimport_wait_s)
        return info

    def prewarm(self) -> None:
        self._worker.prewarm()

    def health(self) -> str | None:
        return self._worker.health()

    def free_port(self) -> int:
        return self._worker.free_port()

    def interrupt(self, attempt: int) -> bool:
        return self._worker.interrupt(attempt)

    def stop_at(self, attempt: int, step: int, deadline: float) -> int | None:
        return self._worker.stop_at(attempt, step, deadline)

    def run_attempt(self, spec: Any) -> Any:
        return self._worker.run_attempt(spec)

    def shutdown(self) -> None:
        self._worker.shutdown()
