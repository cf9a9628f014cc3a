"""Firing a planned fault inside a worker process, on the training thread.

Each kind imitates a real failure: an exception; a Python-level hang (an async exception ends
it); a native hang (one C-level sleep that only a kill ends, with the GIL released so heartbeats
flow, like a stuck collective); SIGKILL; an OOM kill (also SIGKILL, without exhausting memory).
Kinds that act outside the training thread are fired by the supervisor or the test harness.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

from ray_resilience.testing.faults import Fault, FaultKind, InjectedFault

#: Sleep per tick of a Python-level hang; bounds how long an async exception waits to land.
HANG_TICK_S = 0.05
#: Length of the single C-level sleep of a native hang (about 11.6 days; re-entered if it ends).
NATIVE_HANG_S = 1_000_000.0


class HarnessFaultError(NotImplementedError):
    """`fire` was asked for a kind that the supervisor or the test harness must fire."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(
            f"fault {fault.id}: kind {fault.kind.value!r} is fired by the supervisor or the test "
            "harness, not from the training thread; workers must only fire faults whose "
            "FaultKind.fired_in_worker is True."
        )
        self.fault = fault


def fire(fault: Fault) -> NoReturn:
    """Fires `fault` here; never returns (it raises, blocks or kills). The caller reported the
    fault to the supervisor first: sigkill and oom end the process."""
    if not fault.kind.fired_in_worker:
        raise HarnessFaultError(fault)
    _announce(fault)
    if fault.kind is FaultKind.EXCEPTION:
        raise InjectedFault(fault)
    if fault.kind is FaultKind.HANG:
        _python_hang()
    if fault.kind is FaultKind.NATIVE_HANG:
        _native_hang()
    # sigkill and oom: the OOM killer also sends SIGKILL, so both end the process the same way.
    _kill_self()


def stop_process() -> None:
    """Freeze the whole process with SIGSTOP (every thread stops; SIGCONT or SIGKILL ends it)."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _announce(fault: Fault) -> None:
    # The only trace a killed process leaves in its log; flushed because SIGKILL skips buffers.
    print(f"ray_resilience: firing injected fault {fault.id}", file=sys.stderr, flush=True)


def _python_hang() -> NoReturn:
    while True:
        time.sleep(HANG_TICK_S)


def _native_hang() -> NoReturn:
    while True:
        time.sleep(NATIVE_HANG_S)


def _kill_self() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    while True:  # SIGKILL is delivered asynchronously; never return into the training loop.
        time.sleep(HANG_TICK_S)
