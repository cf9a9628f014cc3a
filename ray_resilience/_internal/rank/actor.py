"""The rank actor's class as the supervisor sees it: creating it imports nothing heavy.

The actor process builds the real `Worker` in `__init__`; the supervisor never imports torch.
When that fails (the train function's module is not importable here), the actor stays up and
`info()` says why, so the supervisor ends the run with the rank's own error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from ray_resilience._internal.checkpoint.wire import SnapshotSource
from ray_resilience._internal.rank import preimport
from ray_resilience._internal.rank.errors_capture import describe_startup


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


class WorkerActor(SnapshotSource):
    """One rank's actor (see `Worker` for what each call does)."""

    def __init__(self, train_fn: bytes, train_config: dict[str, Any] | None,
                 supervisor: Any) -> None:
        t_init = time.time()
        # Wait for a background pre-import: never two threads in the same imports.
        self._preimport_wait_s = preimport.claim()
        self._worker: Any = None
        self._startup_error: dict[str, Any] | None = None
        try:
            from ray import cloudpickle  # noqa: PLC0415 - only after claim(), see above

            from ray_resilience._internal.rank.worker import Worker  # noqa: PLC0415 - torch: in the rank, after claim()

            self._worker = Worker(cloudpickle.loads(train_fn), train_config, supervisor)
        except Exception as exc:  # noqa: BLE001 - reported through info(): the user's error
            self._startup_error = describe_startup(exc)
            return
        self._worker.note_startup(process_started_at(), t_init, time.time())
        if threading.current_thread() is threading.main_thread():  # signal handlers live there
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A rank told to terminate saves a step first (see `Worker.on_sigterm`); an idle actor
        exits as Ray's own handler would."""
        if self._worker is None or not self._worker.on_sigterm():
            sys.exit(1)

    def info(self) -> dict[str, Any]:
        if self._worker is None:
            import ray  # noqa: PLC0415 - loaded already: this is a Ray actor

            return {"node_id": ray.get_runtime_context().get_node_id(),
                    "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                    "startup_error": self._startup_error}
        info = self._worker.info()
        info["preimport"] = dict(preimport.stats, waited_s=self._preimport_wait_s)
        return info

    def prewarm(self) -> None:
        if self._worker is not None:
            self._worker.prewarm()

    def health(self) -> str | None:
        if self._worker is None:
            return "the rank could not start"
        return self._worker.health()

    def free_port(self) -> int:
        return self._worker.free_port()

    def snapshot_source(self) -> Any:
        """The rank's checkpointer, which the writer's calls (`SnapshotSource`) go to."""
        return None if self._worker is None else self._worker.snapshot_source()

    def interrupt(self, attempt: int, stacks_after_s: float | None = None) -> bool:
        return self._worker is not None and self._worker.interrupt(attempt, stacks_after_s)

    def stop_at(self, attempt: int, step: int, deadline: float) -> int | None:
        return self._worker.stop_at(attempt, step, deadline)

    def run_attempt(self, spec: Any) -> Any:
        return self._worker.run_attempt(spec)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
