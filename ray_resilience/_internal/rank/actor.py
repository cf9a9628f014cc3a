"""The rank actor's class as the supervisor sees it: creating it imports nothing heavy.

The actor process builds the real `Worker` in `__init__`; the supervisor never imports torch.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ray_resilience._internal.rank import preimport


def process_started_at() -> float | None:
    """When this process was created (epoch seconds, 10 ms resolution; None off Linux)."""
    try:
        with open("/proc/self/stat", encoding="utf-8") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="utf-8") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class WorkerActor:
    """One rank's actor (see `Worker` for what each call does)."""

    def __init__(self, train_fn: bytes, train_config: dict[str, Any] | None,
                 supervisor: Any) -> None:
        t_init = time.time()
        # Wait for a background pre-import: never two threads in the same imports.
        self._preimport_wait_s = preimport.claim()
        from ray import cloudpickle  # noqa: PLC0415 - only after claim(), see above

        from ray_resilience._internal.rank.worker import Worker  # noqa: PLC0415 - torch: in the rank, after claim()

        self._worker = Worker(cloudpickle.loads(train_fn), train_config, supervisor)
        self._worker.note_startup(process_started_at(), t_init, time.time())

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

    def run_attempt(self, spec: Any) -> Any:
        return self._worker.run_attempt(spec)

    def shutdown(self) -> None:
        self._worker.shutdown()
